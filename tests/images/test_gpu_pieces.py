"""The GPU image's pieces that run without a GPU here: configure-cuda.sh against a fake CUDA
tree shaped like nvidia/cuda's runtime image, and scripts/gpu_smoke.py's reading of NCCL's
log, its verdicts, and its honest exit on a machine without a GPU. (The smoke test itself
needs an NVIDIA GPU: see its docstring and docs/images.md.)"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.images.dockerfiles import REPO_ROOT, SCRIPTS_DIR

CONFIGURE_CUDA = SCRIPTS_DIR / "configure-cuda.sh"


def _fake_cuda(root: Path, *, compat: bool = True) -> Path:
    """/usr/local/cuda of nvidia/cuda:13.0.2-runtime: versioned libcudart only, compat libcuda."""
    lib = root / "lib64"
    lib.mkdir(parents=True)
    (lib / "libcudart.so.13.0.96").write_bytes(b"\x7fELF")
    os.symlink("libcudart.so.13.0.96", lib / "libcudart.so.13")
    if compat:
        (root / "compat").mkdir()
        (root / "compat" / "libcuda.so.580.95.05").write_bytes(b"\x7fELF")
        os.symlink("libcuda.so.580.95.05", root / "compat" / "libcuda.so.1")
    return root


def _configure(cuda_home: Path, cuda_version: str = "13.0.2") -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], "CUDA_VERSION": cuda_version}
    return subprocess.run(["bash", str(CONFIGURE_CUDA), str(cuda_home)], env=env, capture_output=True, text=True)


def test_configure_cuda_adds_the_unversioned_libcudart_and_checks_compat(tmp_path):
    cuda = _fake_cuda(tmp_path / "cuda")
    done = _configure(cuda)
    assert done.returncode == 0, done.stderr
    assert os.readlink(cuda / "lib64" / "libcudart.so") == "libcudart.so.13"
    assert (cuda / "lib64" / "libcudart.so").resolve() == (cuda / "lib64" / "libcudart.so.13.0.96").resolve()
    assert "compat driver 580.95.05" in done.stdout
    assert _configure(cuda).returncode == 0  # a second run (the builder stage's) changes nothing


def test_configure_cuda_fails_clearly_without_compat_or_with_another_cuda(tmp_path):
    no_compat = _configure(_fake_cuda(tmp_path / "a", compat=False))
    assert no_compat.returncode != 0 and "is cuda-compat installed?" in no_compat.stderr
    other_major = _configure(_fake_cuda(tmp_path / "b"), cuda_version="12.8.1")
    assert other_major.returncode != 0 and "no libcudart.so.12" in other_major.stderr
    unset = subprocess.run(["bash", str(CONFIGURE_CUDA), str(tmp_path / "b")], env={"PATH": os.environ["PATH"]},
                           capture_output=True, text=True)
    assert unset.returncode != 0 and "CUDA_VERSION" in unset.stderr


def _load_smoke():
    spec = importlib.util.spec_from_file_location("gpu_smoke", REPO_ROOT / "scripts" / "gpu_smoke.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


NCCL_LOG = """\
ip-10-0-0-1:123:123 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>
ip-10-0-0-1:123:123 [0] NCCL INFO NET/Plugin: Plugin name set by env to none
ip-10-0-0-1:123:123 [0] NCCL INFO cudaDriverVersion 13000
NCCL version 2.29.7+cuda13.0
ip-10-0-0-1:123:140 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>
ip-10-0-0-1:123:140 [0] NCCL INFO Using network Socket
"""


def test_smoke_reads_nccl_version_network_and_plugin_from_the_log():
    smoke = _load_smoke()
    assert smoke.parse_nccl_log(NCCL_LOG) == {"nccl_version": "2.29.7", "network": "Socket",
                                              "net_plugin": "Plugin name set by env to none"}
    assert smoke.parse_nccl_log("") == {"nccl_version": None, "network": None, "net_plugin": None}


def test_smoke_verdicts():
    smoke = _load_smoke()
    good = {"allreduce": 2.0, "ddp_loss_before": 1.0, "ddp_loss_after": 0.5, "nccl": "2.29.7",
            "log": {"nccl_version": "2.29.7"}, "horovod": {"nccl_built": True, "allreduce": 1.0, "size": 1}}
    assert smoke.decide_problems(good, {"nccl": "2.29.7"}) == []
    bad = {**good, "allreduce": 1.0, "nccl": "2.30.3", "horovod": {"nccl_built": False, "allreduce": 1.0, "size": 1}}
    problems = smoke.decide_problems(bad, {"nccl": "2.29.7"})
    assert any("all-reduce of 2.0" in p for p in problems)
    assert any("torch loaded NCCL 2.30.3" in p for p in problems)
    assert any("not built with NCCL ops" in p for p in problems)
    assert smoke.decide_problems({**good, "horovod": None}, {"nccl": "2.29.7"}) == []  # no Horovod: not checked


def test_smoke_says_plainly_when_there_is_no_gpu():
    """This machine has no GPU: exit 2 and a sentence, never a pass."""
    pytest.importorskip("torch")
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here: the smoke test would really run")
    done = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "gpu_smoke.py")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    assert "no NVIDIA GPU visible to torch" in done.stderr and "nothing was tested" in done.stderr

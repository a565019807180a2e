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


# --- docker/scripts/record-versions.py: the versions the image was built with, in one file ---

def _record_versions():
    spec = importlib.util.spec_from_file_location("record_versions", SCRIPTS_DIR / "record-versions.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_record_versions_reads_the_efa_installers_and_libfabrics_own_words():
    rv = _record_versions()
    assert rv.parse_efa_installer("# EFA installer version: 1.49.0\n# Debug packages installed: no\n") == "1.49.0"
    assert rv.parse_fi_info("fi_info: 2.4.0amzn5.0\nlibfabric: 2.4.0amzn5.0\nlibfabric api: 2.4\n") == "2.4.0amzn5.0"
    assert rv.parse_ofi_nccl("libfabric-aws-bin ibverbs-providers aws-ofi-nccl_1.20.0-1_amd64 efa-config") == "1.20.0"
    assert rv.parse_ofi_nccl("libnccl-ofi=1.20.0-1\n") == "1.20.0"
    assert rv.parse_ofi_nccl("\x00NET/OFI Initializing aws-ofi-nccl 1.20.0\x00") == "1.20.0"
    assert rv.parse_efa_installer("") is None and rv.parse_fi_info("") is None and rv.parse_ofi_nccl("x") is None


def test_record_versions_writes_what_the_launcher_reads_and_refuses_a_gap():
    from entrypoint.job.probe import parse_build_versions

    rv = _record_versions()
    found = {"EFA_INSTALLER": "1.49.0", "LIBFABRIC": "2.4.0amzn5.0", "AWS_OFI_NCCL": None, "NCCL": "2.29.7",
             "CUDA": "13.0.2", "TORCH": "2.13.0", "TORCH_NEURONX": None}
    text = rv.build_versions_text(found)
    assert parse_build_versions(text) == tuple((k, v) for k, v in found.items() if v)
    assert rv.decide_missing(found, "gpu") == []
    assert rv.decide_missing(found, "trn1") == ["NEURON_RUNTIME", "TORCH_NEURONX", "NEURONX_CC"]


def test_record_versions_fails_the_build_without_efa_here(tmp_path):
    """This machine has no EFA installer: the script says what it could not read, writes nothing."""
    out = tmp_path / "build-versions.env"
    done = subprocess.run([sys.executable, str(SCRIPTS_DIR / "record-versions.py"), "gpu", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "could not read EFA_INSTALLER" in done.stderr and not out.exists()


@pytest.mark.parametrize("flavor", ["gpu", "trn1"])
def test_the_images_record_their_versions_last(flavor):
    from tests.images.dockerfiles import load_dockerfile

    runs = [i.args for i in load_dockerfile(flavor).stage("sagemaker").instructions if i.keyword == "RUN"]
    last = runs[-1]
    assert f"/usr/local/byoc/build/record-versions.py {flavor}" in last
    assert last.index("install-our-packages.sh") < last.index("record-versions.py") < last.index("rm -rf")


def test_record_versions_of_a_gpu_image_built_without_efa():
    """GPU_EFA_INSTALLER_VERSION=none: EFA_INSTALLER=none is recorded and no libfabric is required;
    the trn1 image still needs its EFA, and an installer that left nothing is still a gap."""
    rv = _record_versions()
    assert rv.decide_efa_installer("", "none") == "none"
    assert rv.decide_efa_installer("# EFA installer version: 1.49.0\n", "1.49.0") == "1.49.0"
    assert rv.decide_efa_installer("", "1.49.0") is None and rv.decide_efa_installer("", None) is None
    found = {"EFA_INSTALLER": "none", "NCCL": "2.29.7", "CUDA": "13.0.2", "TORCH": "2.13.0"}
    assert rv.decide_missing(found, "gpu") == []
    assert "LIBFABRIC" in rv.decide_missing(found, "trn1")
    assert rv.decide_missing({**found, "EFA_INSTALLER": None}, "gpu") == ["EFA_INSTALLER", "LIBFABRIC"]


def test_record_versions_runs_with_efa_none_and_writes_it(tmp_path):
    """The script itself, as the build runs it with EFA_INSTALLER_VERSION=none and the base image's
    CUDA_VERSION: neither EFA nor libfabric is missing (this venv's CPU torch has no NCCL wheel, so
    here it stops at NCCL; tests/images/test_gpu_image.py reads the built image's file)."""
    out = tmp_path / "build-versions.env"
    done = subprocess.run([sys.executable, str(SCRIPTS_DIR / "record-versions.py"), "gpu", str(out)],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "EFA_INSTALLER_VERSION": "none", "CUDA_VERSION": "13.0.2"})
    assert "EFA_INSTALLER" not in done.stderr and "LIBFABRIC" not in done.stderr
    assert done.returncode == 0 or "could not read NCCL" in done.stderr


# --- docker/local/lay-out-cuda.py: the stand-in CUDA base's layout --------------------------------

def _script(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_stand_in_lays_cuda_out_where_nvidia_cuda_does():
    lay = _script("lay_out_cuda", "docker/local/lay-out-cuda.py")
    assert lay.decide_place("nvidia/cu13/bin/nvcc") == "bin/nvcc"
    assert lay.decide_place("nvidia/cu13/nvvm/libdevice/libdevice.10.bc") == "nvvm/libdevice/libdevice.10.bc"
    assert lay.decide_place("nvidia/cu13/include/cuda_runtime.h") == "targets/x86_64-linux/include/cuda_runtime.h"
    assert lay.decide_place("nvidia/cu13/lib/libcudart.so.13") == "targets/x86_64-linux/lib/libcudart.so.13"
    for left_out in ("nvidia/cu13/.metadata/x", "nvidia_cuda_runtime-13.0.96.dist-info/RECORD", "nvidia/__init__.py",
                     "nvidia/cu13/lib/", "nvidia/nccl/lib/libnccl.so.2"):
        assert lay.decide_place(left_out) is None


def test_the_stand_ins_driver_stubs_export_every_entry_point_of_the_headers():
    lay = _script("lay_out_cuda", "docker/local/lay-out-cuda.py")
    header = ("CUresult CUDAAPI cuInit(unsigned int Flags);\n#define cuCtxCreate cuCtxCreate_v4\n"
              "CUresult CUDAAPI cuCtxCreate(CUcontext *pctx);\nconst char *cuGetName(void);\n")
    assert lay.parse_entry_points(header, "CUresult", "cu") == ["cuCtxCreate", "cuCtxCreate_v4", "cuInit"]
    nvml = "nvmlReturn_t DECLDIR nvmlInit_v2(void);\nnvmlReturn_t DECLDIR nvmlShutdown(void);\n"
    assert lay.parse_entry_points(nvml, "nvmlReturn_t", "nvml") == ["nvmlInit_v2", "nvmlShutdown"]
    source = lay.build_stub_source(["cuInit"], 34)
    assert "int cuInit(void) { return 34; }" in source
    metadata = "Requires-Dist: nvidia-nvml-dev==13.0.87.*; extra == 'all'\nRequires-Dist: nvidia-cufft==12.0.0.61.*\n"
    assert lay.parse_pin(metadata, "nvidia-nvml-dev") == "13.0.87.*" and lay.parse_pin(metadata, "x") is None


def test_image_sizes_reads_history_and_the_manifest():
    sizes = _script("image_sizes", "docker/image_sizes.py")
    history = ("0\tLABEL a=b\n5000000000\t/bin/bash -o pipefail -c #(nop) COPY dir:abc in /opt/venv\n"
               "120000000\t|3 A=1 /bin/bash -o pipefail -c apt-get install x\n")
    assert sizes.parse_history(history) == [(5000000000, "#(nop) COPY dir:abc in /opt/venv"),
                                            (120000000, "3 A=1 apt-get install x")]
    assert sizes.sum_manifest_layers({"layers": [{"size": 10}, {"size": 32}]}) == 42
    assert sizes.build_gb(9_870_000_000) == "9.87 GB"

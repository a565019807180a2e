"""The Horovod wheel outlives Docker's layer cache (docker/wheelhouse/README.md): the build
leaves its wheel and build facts in docker/wheelhouse/cpu, and install-horovod.sh installs a
kept wheel, without compiling or downloading, only when its facts are this build's.

Run against the `venv` stage (the one that installs Horovod) of the image the session built
(a cache hit), with no
network: a kept wheel with matching facts installs and passes `horovodrun --check-build`;
one whose facts differ falls through to the source build, which needs the network."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.images.image_harness import REPO_ROOT

pytestmark = pytest.mark.slow  # they build the image (or take it from Docker's cache)
WHEELHOUSE = REPO_ROOT / "docker" / "wheelhouse" / "cpu"
VENV_STAGE_TAG = "byoc-training:cpu-local-venv"


def _pin(key: str) -> str:
    for line in (REPO_ROOT / "docker" / "versions.env").read_text().splitlines():
        if line.startswith(key + "="):
            return line.split("=", 1)[1]
    raise KeyError(key)


@pytest.fixture(scope="module")
def venv_stage(cpu_image) -> str:
    """The `venv` stage of the session's image (every step a cache hit of its build)."""
    done = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "build-local-image.sh"), "--tag", VENV_STAGE_TAG,
                           "--target", "venv"], capture_output=True, text=True, timeout=1800)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return VENV_STAGE_TAG


def _kept_entries() -> list[Path]:
    return sorted(p for p in WHEELHOUSE.iterdir() if p.is_dir())


def test_the_build_keeps_its_horovod_wheel_with_its_build_facts(cpu_image):
    entries = _kept_entries()
    assert [p.name.rsplit("-", 1)[0] for p in entries] == [f"horovod-{_pin('CPU_PYPI_HOROVOD_VERSION')}"]
    facts = (entries[0] / "build-facts.txt").read_text()
    assert f"torch {_pin('CPU_TORCH_VERSION')}+cpu cxx11abi" in facts
    assert "mpi mpirun (Open MPI) 4.1.4" in facts and "python cpython-311-x86_64-linux-gnu " in facts
    assert len(list(entries[0].glob("horovod-*-cp311-cp311-linux_x86_64.whl"))) == 1


def _install_horovod(image: str, wheelhouse: Path) -> subprocess.CompletedProcess:
    script = "pip uninstall -y -q horovod && /usr/local/byoc/build/install-horovod.sh"
    return subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "-e", f"PYPI_HOROVOD_VERSION={_pin('CPU_PYPI_HOROVOD_VERSION')}",
         "-v", f"{wheelhouse}:/opt/byoc-wheelhouse:ro", "--entrypoint", "bash", image, "-c", script],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def test_a_kept_wheel_with_the_same_facts_installs_without_network(venv_stage):
    done = _install_horovod(venv_stage, WHEELHOUSE)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "reusing the kept wheel horovod-" in done.stdout
    for line in ("[X] PyTorch", "[X] MPI", "[X] Gloo", "install-horovod: horovod.torch imports"):
        assert line in done.stdout


def test_a_kept_wheel_built_for_other_facts_is_not_used(venv_stage, tmp_path):
    other = tmp_path / "wheelhouse"
    shutil.copytree(WHEELHOUSE, other)
    facts = _kept_entries()[0].name
    facts_file = other / facts / "build-facts.txt"
    # Another torch: same folder name (as if a stale entry were copied in), other facts.
    facts_file.write_text(facts_file.read_text().replace("torch 2.", "torch 9."))
    done = _install_horovod(venv_stage, other)
    assert done.returncode != 0
    assert "no kept wheel for horovod-" in done.stdout and "building from source" in done.stdout
    assert "reusing" not in done.stdout

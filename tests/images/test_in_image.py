"""The entrypoint's tests that touch files, processes and the network, run again INSIDE the
built image with the image's own Python (Debian's 3.11.2 on the CPU image), packages and
runtime (Docker's /run, /dev/shm, PID namespace). Code that works with the development
machine's newer Python can fail there: `tarfile.extractall(filter=...)` did.

The image's installed `entrypoint` is what runs (only tests/ is mounted, read-only); pytest
and hypothesis come from wheels downloaded on the host and installed into a scratch folder
inside the container, so the image itself gains nothing."""

from __future__ import annotations

import fcntl
import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FORKED_RANK_TESTS  # their copies here are left out where these run
from tests.images.image_harness import REPO_ROOT, build_run_argv, run_docker

pytestmark = pytest.mark.slow

# The files whose tests run real processes, files or sockets (those marked
# needs_package_index are deselected: containers here have no route to PyPI). Left out:
#   test_s3_submit_dir.py  needs moto's S3 server (a test-only dependency tree);
#   test_decision_table.py, test_plan_golden.py, test_probe.py: pure decisions, no I/O
#   that depends on the image.
IN_IMAGE_TESTS = (
    "tests/entrypoint/job/test_archive.py",
    "tests/entrypoint/cli/test_run.py",
    "tests/entrypoint/job/test_bad_input.py",
    "tests/entrypoint/hosts/test_job_port.py",
    "tests/entrypoint/hosts/test_ssh.py",
    "tests/entrypoint/decide/test_toolkit_parity.py",
    "tests/entrypoint/outcome/test_secrets.py",
    "tests/entrypoint/decide/test_preflight.py",
    "tests/entrypoint/outcome/test_edges.py",
    "tests/entrypoint/rank/test_whole_lines.py",
    "tests/entrypoint/rank/test_rank_exit.py",
)
# pytest and what the tests import beyond the image's packages, at the project's pins.
TEST_REQUIREMENTS = ("pytest==9.2.0", "hypothesis==6.170.15")


def _wheelhouse() -> Path:
    """Pure-Python wheels for the image's Python, downloaded once per pin set (one download at a
    time: the suite's parallel workers may ask at once)."""
    key = hashlib.sha256(" ".join(TEST_REQUIREMENTS).encode()).hexdigest()[:12]
    folder = Path.home() / ".cache" / "byoc-in-image-wheels" / key
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / ".complete").exists():
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
                            "--only-binary=:all:", "--python-version", "3.11", "--dest", str(folder),
                            *TEST_REQUIREMENTS], check=True, timeout=600)
            (folder / ".complete").touch()
    return folder


# One container a file: the suite's parallel workers share them out.
@pytest.mark.parametrize("test_file", IN_IMAGE_TESTS + FORKED_RANK_TESTS, ids=lambda f: Path(f).stem)
def test_entrypoint_tests_pass_inside_the_image(cpu_image, test_file):
    run_tests_inside_the_image(cpu_image, (test_file,))


def run_tests_inside_the_image(cpu_image, tests) -> None:
    wheels = _wheelhouse()
    script = (
        "set -e; cd /tmp; "
        "python3 -m pip install -q --disable-pip-version-check --no-index --find-links /wheels "
        "--target /tmp/test-deps " + " ".join(TEST_REQUIREMENTS) + "; "
        "python3 -c 'import sys; print(\"image python\", sys.version.split()[0])'; "
        "PYTHONPATH=/tmp/test-deps:/byoc exec python3 -m pytest -q -p no:cacheprovider "
        "-c /byoc/pyproject.toml --rootdir /byoc -m 'not needs_package_index' " + " ".join(f"/byoc/{t}" for t in tests)
    )
    argv = build_run_argv(
        cpu_image.tag,
        mounts=[(REPO_ROOT / "tests", "/byoc/tests:ro"), (REPO_ROOT / "pyproject.toml", "/byoc/pyproject.toml:ro"),
                (wheels, "/wheels:ro")],
        entrypoint="/bin/bash",
        command=["-c", script],
    )
    # --shm-size as SageMaker's default is not given: the image must cope with Docker's 64 MB.
    result = run_docker(argv, timeout_s=900)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-8000:]
    assert "image python 3.11.2" in output
    assert " passed" in output and " failed" not in output, output[-3000:]

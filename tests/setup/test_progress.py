"""Set-up progress a person can read (issue 23): one line per stage or build step that runs,
with the elapsed time; the whole output in a log whose path is printed; on a failure the
log's last 40 lines. scripts/lib/stages.sh for the set-up's stages, docker/build_progress.py
for the image build's steps. No Docker needed: the build's output is replayed."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
import pytest

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

REPO = Path(__file__).resolve().parents[2]
STAGES = REPO / "scripts" / "lib" / "stages.sh"
FILTER = REPO / "docker" / "build_progress.py"

_spec = importlib.util.spec_from_file_location("build_progress", FILTER)
build_progress = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build_progress)

LEGACY = """\
Sending build context to Docker daemon  1.2MB
Step 2/40 : FROM ${BASE_IMAGE} AS system
 ---> 0a1b2c
Step 3/40 : ARG APT_RUNTIME_PACKAGES
 ---> Running in 1c2d
Step 5/40 : RUN /usr/local/byoc/build/install-apt-packages.sh ${APT_RUNTIME_PACKAGES}
 ---> Using cache
 ---> 3d4e5f
Step 17/40 : RUN /usr/local/byoc/build/install-torch.sh
 ---> Running in 5f3a
Collecting torch
Step 18/40 : COPY docker/scripts/install-mpi4py.sh /usr/local/byoc/build/
 ---> 9a8b
Step 19/40 : RUN /usr/local/byoc/build/install-mpi4py.sh
 ---> Running in 77aa
"""

BUILDKIT = """\
#5 [builder 3/12] RUN /usr/local/byoc/build/install-apt-packages.sh build-essential
#5 CACHED
#9 [builder 6/12] COPY docker/scripts/install-torch.sh /usr/local/byoc/build/
#9 DONE 0.0s
#10 [builder 7/12] RUN /usr/local/byoc/build/install-torch.sh
#10 0.412 Collecting torch
#10 3.100 Installing collected packages: torch
#10 DONE 40.2s
"""


def test_only_the_steps_that_run_are_reported_in_both_of_dockers_forms():
    assert list(build_progress.find_running_steps(LEGACY.splitlines(True))) == [
        "step 17/40: RUN install-torch.sh", "step 19/40: RUN install-mpi4py.sh"]  # fmt: skip
    assert list(build_progress.find_running_steps(BUILDKIT.splitlines(True))) == ["[builder 7/12] RUN install-torch.sh"]


def test_a_cached_build_reports_nothing():
    cached = "".join(line for line in LEGACY.splitlines(True) if "Running in" not in line)
    assert list(build_progress.find_running_steps(cached.splitlines(True))) == []


def test_the_filter_keeps_every_byte_of_output_in_its_log_and_prints_one_line_a_step(tmp_path):
    log = tmp_path / "image-build.log"
    output = LEGACY.encode() + b"a package printed \xff\xfe, not UTF-8\n"
    done = subprocess.run([sys.executable, str(FILTER), "--log", str(log), "--start", "0"], input=output,
                          capture_output=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 2 and lines[0].endswith("image build step 17/40: RUN install-torch.sh")
    assert lines[0].startswith("setup [") and ":" in lines[0].split("]")[0]  # the elapsed time, m:ss
    assert log.read_text().count("\n") == output.count(b"\n") and "not UTF-8" in log.read_text()


def _run_stages(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    script = f"set -euo pipefail\nsource {STAGES}\n{body}\necho after >&2\n"
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "BYOC_SETUP_LOGS": str(tmp_path)})  # fmt: skip


def test_a_stage_prints_one_line_with_its_log_and_keeps_its_output_there(tmp_path):
    done = _run_stages(tmp_path, 'step() { echo installing; echo "to stderr" >&2; }\nstage apt "Debian packages" step')
    assert done.returncode == 0, done.stderr
    first, after = done.stderr.splitlines()
    assert first.startswith("setup [") and f"Debian packages … (log: {tmp_path}/apt.log)" in first
    assert after == "after"
    assert (tmp_path / "apt.log").read_text() == "installing\nto stderr\n"


def test_a_failing_stage_stops_at_its_first_error_and_shows_the_last_40_lines(tmp_path):
    body = 'step() { seq 1 100; false; echo "never reached"; }\nstage venv "the venv" step'
    done = _run_stages(tmp_path, body)
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert "FAILED" in lines[1] and "the venv" in lines[1] and str(tmp_path / "venv.log") in lines[1]
    assert [line.strip() for line in lines[2:]] == [str(n) for n in range(61, 101)]
    assert "never reached" not in (tmp_path / "venv.log").read_text() and lines[-1].strip() == "100"


def test_background_stages_run_side_by_side_and_the_first_failure_ends_the_script(tmp_path):
    """stage_in_background (the set-up's SDK venvs beside its .venv): each stage waits for the
    other's start, so they pass only side by side; one that fails ends the script at
    wait_background_stages with its exit code, its log's tail shown, the other stopped."""
    body = ('marks=$BYOC_SETUP_LOGS\n'
            'meet() { touch "$marks/$1.started"; for _ in $(seq 100); do [ -e "$marks/$2.started" ] && return 0;'
            ' sleep 0.1; done; return 9; }\n'
            'stage_in_background one "the first" meet one two\n'
            'stage_in_background two "the second" meet two one\n'
            'wait_background_stages\necho "both done" >&2\n')
    done = _run_stages(tmp_path, body)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[-2:] == ["both done", "after"]
    failing = ('slow() { sleep 60; echo "slow ended"; }\n'
               'fails() { echo "no network"; return 3; }\n'
               'stage_in_background slow "the slow one" slow\n'
               'stage_in_background fails "the failing one" fails\n'
               'wait_background_stages\necho "never reached" >&2\n')
    done = _run_stages(tmp_path / "f", failing)
    assert done.returncode == 3, done.stderr
    assert "FAILED" in done.stderr and "the failing one (exit code 3)" in done.stderr, done.stderr
    assert "    no network" in done.stderr.splitlines() and "never reached" not in done.stderr
    assert "slow ended" not in (tmp_path / "f" / "slow.log").read_text()

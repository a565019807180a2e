"""scripts/run-main-job.sh's order on a new machine (issue 23): the image's stages before
Horovod build beside the venvs' set-up, which compiles Horovod's wheel for both; the whole
image is built only once both have ended (so its Horovod step finds the wheel), and the job
takes that image as built. The real script runs against stand-ins for the scripts it calls,
which record what they were called with, in order; no Docker, no network."""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Each stand-in appends "<name> <args>" to $EVENTS when it starts and "<name> done" when it
# ends. The stages-before-Horovod build waits (up to 20 s) for the set-up to start: run one after the
# other, it would fail, so a pass shows that the two ran side by side.
STAND_IN = textwrap.dedent("""\
    #!/usr/bin/env bash
    set -euo pipefail
    name=$(basename "$0" .sh)
    echo "$name $*" >>"$EVENTS"
    case "$name $*" in
        "bootstrap --for main-job --horovod-wheel --sdk "*)
            touch "$EVENTS.setup-started"; sleep 1 ;;
        "build-local-image --tag "*"-runtime --target runtime")
            for _ in $(seq 200); do [ -e "$EVENTS.setup-started" ] && break; sleep 0.1; done
            [ -e "$EVENTS.setup-started" ] || { echo "set-up did not start beside the build" >&2; exit 7; }
            [ "${FAIL_BUILDER:-0}" = 1 ] && exit 5 ;;
        "docker-engine start") echo "export DOCKER_HOST=unix:///nowhere" ;;
    esac
    echo "$name done" >>"$EVENTS"
""")


def _fake_checkout(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "run-main-job.sh", root / "scripts" / "run-main-job.sh")
    bin_dir = tmp_path / "bin"
    (root / ".venv" / "bin").mkdir(parents=True)
    bin_dir.mkdir()
    for target in (root / "scripts" / "bootstrap.sh", root / "scripts" / "build-local-image.sh",
                   root / "scripts" / "docker-engine.sh", root / ".venv" / "bin" / "python", bin_dir / "docker"):
        target.write_text(STAND_IN)
        target.chmod(0o755)
    return root


def _run(tmp_path: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    root = _fake_checkout(tmp_path)
    events = tmp_path / "events"
    base = {k: v for k, v in os.environ.items() if k != "BYOC_IMAGE_TAG"}  # the default tag, whatever the caller set
    done = subprocess.run(
        ["bash", str(root / "scripts" / "run-main-job.sh"), *args], capture_output=True, text=True, timeout=60,
        env={**base, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "EVENTS": str(events), **env},
    )  # fmt: skip
    return done, events.read_text().splitlines() if events.exists() else []


def test_the_image_build_waits_for_the_wheel_the_venv_compiles(tmp_path):
    done, events = _run(tmp_path, "--image-tag", "byoc-training:mine")
    assert done.returncode == 0, done.stderr
    assert events[0:2] == ["bootstrap --for main-job --apt-only", "bootstrap done"]
    builder = events.index("build-local-image --tag byoc-training:mine-runtime --target runtime")
    setup = events.index("bootstrap --for main-job --horovod-wheel --sdk v2")
    image = events.index("build-local-image --tag byoc-training:mine")
    # Both start after the Debian packages, and the set-up (with Horovod) starts while the
    # builder stage's build runs (which that stand-in checks).
    assert builder > 1 and 1 < setup < events.index("build-local-image done")
    # The whole image only after both ended: two "done" lines before it, none after it but its own.
    assert events[image - 2:image] == ["bootstrap done", "build-local-image done"] or \
        events[image - 2:image] == ["build-local-image done", "bootstrap done"]
    assert events[image + 1] == "build-local-image done"
    # The runtime stage's tag removed; the job takes the image as built.
    assert "docker rmi byoc-training:mine-runtime" in events[image:]
    assert events[-2:] == ["python -m jobs.run_main_job --image-tag byoc-training:mine --image-built", "python done"]


def test_a_failed_builder_stage_stops_before_the_image_and_the_job(tmp_path):
    done, events = _run(tmp_path, FAIL_BUILDER="1")
    assert done.returncode == 1
    assert "building the image's stages before Horovod failed" in done.stderr
    assert "build-local-image --tag byoc-training:cpu-local" not in events
    assert not any(e.startswith("python ") for e in events)


def test_emulated_hosts_need_no_image(tmp_path):
    done, events = _run(tmp_path, "--emulated")
    assert done.returncode == 0, done.stderr
    assert events == ["bootstrap --for main-job --with-horovod --sdk v2", "bootstrap done",
                      "python -m jobs.run_main_job --emulated", "python done"]


def test_sdk_v3_sets_up_sdk_v3_and_runs_the_job_with_it(tmp_path):
    done, events = _run(tmp_path, "--sdk", "v3", "--image-tag", "byoc-training:mine")
    assert done.returncode == 0, done.stderr
    assert "bootstrap --for main-job --horovod-wheel --sdk v3" in events
    assert events[-2:] == ["python -m jobs.run_main_job --sdk v3 --image-tag byoc-training:mine --image-built",
                           "python done"]

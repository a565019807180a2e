"""The one way tests reach this machine's Docker engine and build the CPU image of this tree,
shared by the image tests (tests/images) and both SDK local-mode harnesses (tests/localmode).

scripts/docker-engine.sh starts an engine when none answers and prints `export DOCKER_HOST=…`;
scripts/build-local-image.sh builds with Docker's layer cache (seconds when the tree is
unchanged, the last layer only after a change to entrypoint/ or train/).

BYOC_TEST_IMAGE names an image built elsewhere to test as it is, instead of the CPU image of
this tree: scripts/check-gpu-image.sh runs the local-mode smoke cases on the GPU image so.
Nothing is built then; the image must exist."""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Mapping

REPO = Path(__file__).resolve().parents[2]
DEFAULT_IMAGE_TAG = "byoc-training:cpu-local"
BUILD_STATE = REPO / ".work" / "test-image-builds"  # the build lock, and what this run built


def decide_image_tag(environ: Mapping[str, str]) -> str:
    return environ.get("BYOC_TEST_IMAGE") or environ.get("BYOC_IMAGE_TAG") or DEFAULT_IMAGE_TAG


def parse_engine_exports(text: str) -> dict[str, str]:
    """`scripts/docker-engine.sh start` prints `export NAME=value` lines among others."""
    env = {}
    for line in text.splitlines():
        match = re.fullmatch(r"\s*export\s+([A-Z_][A-Z0-9_]*)=(.*)", line)
        if match:
            env[match.group(1)] = match.group(2).strip().strip("'\"")
    return env


def load_docker_env() -> dict[str, str]:
    """This process's environment plus what reaches the engine (started if none answers)."""
    done = subprocess.run(["bash", str(REPO / "scripts" / "docker-engine.sh"), "start"],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"scripts/docker-engine.sh start failed:\n{done.stderr[-2000:]}")
    return {**os.environ, **parse_engine_exports(done.stdout)}


def decide_build_stamp(tag: str, environ: Mapping[str, str]) -> str | None:
    """What marks tag as built by this test run, shared by its parallel workers (pytest-xdist
    gives them one PYTEST_XDIST_TESTRUNUID); None in a run without workers, whose session
    fixtures build once anyway."""
    run_id = environ.get("PYTEST_XDIST_TESTRUNUID")
    return f"{run_id} {tag}" if run_id else None


def run_build_image(tag: str, env: Mapping[str, str] | None = None, timeout_s: float = 3600) -> float:
    """Build (or, with the layer cache, re-confirm) the CPU image of this tree as tag, once per
    test run; the seconds it took (a worker that found it built: the wait for the one that did)."""
    started = time.monotonic()
    stamp = decide_build_stamp(tag, os.environ)
    BUILD_STATE.mkdir(parents=True, exist_ok=True)
    # One build at a time: parallel workers would each build the same layers on 2 cores.
    with open(BUILD_STATE / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        built = BUILD_STATE / "built-this-run"
        if stamp is not None and stamp in _read_lines(built):
            return time.monotonic() - started
        _build_image_now(tag, env, timeout_s)
        if stamp is not None:  # an earlier run's lines go: they name another run
            run_id = stamp.split()[0]
            kept = [line for line in _read_lines(built) if line.split()[0] == run_id]
            built.write_text("".join(f"{line}\n" for line in [*kept, stamp]))
    return time.monotonic() - started


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except FileNotFoundError:
        return []


def _build_image_now(tag: str, env: Mapping[str, str] | None, timeout_s: float) -> None:
    if os.environ.get("BYOC_TEST_IMAGE") == tag:  # built elsewhere (the GPU image): tested as it is
        env = env or load_docker_env()
        found = subprocess.run(["docker", "image", "inspect", tag], capture_output=True, text=True,
                               env={**os.environ, **env})
        if found.returncode != 0:
            raise RuntimeError(f"BYOC_TEST_IMAGE={tag}: no such image in the engine ({found.stderr.strip()})")
        return
    done = subprocess.run(["bash", str(REPO / "scripts" / "build-local-image.sh"), "--tag", tag], cwd=REPO,
                          env={**(env or load_docker_env()), "BYOC_IMAGE_TAG": tag},
                          capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"scripts/build-local-image.sh --tag {tag} failed (exit {done.returncode}):\n"
                           f"{done.stderr[-6000:]}")

"""The one way tests reach this machine's Docker engine and build the CPU image of this tree,
shared by the image tests (tests/images) and both SDK local-mode harnesses (tests/localmode).

scripts/docker-engine.sh starts an engine when none answers and prints `export DOCKER_HOST=…`;
scripts/build-local-image.sh builds with Docker's layer cache (seconds when the tree is
unchanged, the last layer only after a change to entrypoint/ or train/).

BYOC_TEST_IMAGE names an image built elsewhere to test as it is, instead of the CPU image of
this tree: scripts/check-gpu-image.sh runs the local-mode smoke cases on the GPU image so.
Nothing is built then; the image must exist."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path
from typing import Mapping

REPO = Path(__file__).resolve().parents[2]
DEFAULT_IMAGE_TAG = "byoc-training:cpu-local"


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


def run_build_image(tag: str, env: Mapping[str, str] | None = None, timeout_s: float = 3600) -> float:
    """Build (or, with the layer cache, re-confirm) the CPU image of this tree as tag; the
    seconds it took."""
    started = time.monotonic()
    if os.environ.get("BYOC_TEST_IMAGE") == tag:  # built elsewhere (the GPU image): tested as it is
        env = env or load_docker_env()
        found = subprocess.run(["docker", "image", "inspect", tag], capture_output=True, text=True,
                               env={**os.environ, **env})
        if found.returncode != 0:
            raise RuntimeError(f"BYOC_TEST_IMAGE={tag}: no such image in the engine ({found.stderr.strip()})")
        return 0.0
    done = subprocess.run(["bash", str(REPO / "scripts" / "build-local-image.sh"), "--tag", tag], cwd=REPO,
                          env={**(env or load_docker_env()), "BYOC_IMAGE_TAG": tag},
                          capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"scripts/build-local-image.sh --tag {tag} failed (exit {done.returncode}):\n"
                           f"{done.stderr[-6000:]}")
    return time.monotonic() - started

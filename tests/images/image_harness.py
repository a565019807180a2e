"""The CPU image as users get it: built with Docker (scripts/build-local-image.sh →
docker/build.sh) and run with `docker run`, on this machine's Docker engine
(scripts/docker-engine.sh starts one when none answers).

Docker's layer cache makes an unchanged tree a rebuild of seconds, and a change to
entrypoint/ or train/ rebuilds only the last layer; the uncached path is the same command.

Verbs as elsewhere: build_ is pure, probe_ asks the engine, run_/ensure_ act.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Mapping, Sequence

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TAG = "byoc-training:cpu-local"


@dataclasses.dataclass(frozen=True)
class BuildResult:
    tag: str
    seconds: float
    size_bytes: int


def parse_engine_env(printed: str) -> dict[str, str]:
    """`export DOCKER_HOST=…` lines (what docker-engine.sh start prints) → a mapping."""
    return dict(re.findall(r"^export (DOCKER_HOST)=(\S+)$", printed, flags=re.M))


def ensure_engine() -> None:
    """A Docker engine answers for this process and its children (DOCKER_HOST set)."""
    done = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "docker-engine.sh"), "start"],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"no Docker engine: {done.stderr[-2000:]}")
    os.environ.update(parse_engine_env(done.stdout))


def ensure_cpu_image(tag: str | None = None, timeout_s: float = 2400) -> BuildResult:
    """Build (or, with Docker's cache, re-confirm) the CPU image of this tree."""
    ensure_engine()
    tag = tag or os.environ.get("BYOC_IMAGE_TAG") or DEFAULT_TAG
    started = time.monotonic()
    done = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "build-local-image.sh"), "--tag", tag],
                          capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"building the CPU image failed:\n{done.stderr[-6000:]}")
    seconds = time.monotonic() - started
    return BuildResult(tag=tag, seconds=seconds, size_bytes=int(probe_image_config(tag)["Size"]))


def probe_image_config(tag: str) -> dict:
    done = subprocess.run(["docker", "image", "inspect", tag], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)[0]


def build_run_argv(
    image: str,
    *,
    mounts: Sequence[tuple[Path, str]] = (),
    env: Mapping[str, str] | None = None,
    entrypoint: str | None = None,
    command: Sequence[str] = (),
    name: str | None = None,
    hostname: str | None = None,
) -> list[str]:
    """`docker run` for one container, removed when it ends."""
    argv = ["docker", "run", "--rm"]
    if name:
        argv += ["--name", name]
    if hostname:
        argv += ["--hostname", hostname]
    for source, target in mounts:
        argv += ["-v", f"{source}:{target}"]
    for key, value in (env or {}).items():
        argv += ["-e", f"{key}={value}"]
    if entrypoint is not None:
        argv += ["--entrypoint", entrypoint]
    return argv + [image, *command]


def run_docker(argv: Sequence[str], timeout_s: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s)

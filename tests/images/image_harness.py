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
import subprocess
from pathlib import Path
from typing import Mapping, Sequence

from support.docker import decide_image_tag, load_docker_env, run_build_image

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclasses.dataclass(frozen=True)
class BuildResult:
    tag: str
    seconds: float
    size_bytes: int


def ensure_engine() -> None:
    """A Docker engine answers for this process and its children (DOCKER_HOST set)."""
    os.environ.update(load_docker_env())


def ensure_cpu_image(tag: str | None = None, timeout_s: float = 2400) -> BuildResult:
    """Build (or, with Docker's cache, re-confirm) the CPU image of this tree."""
    ensure_engine()
    tag = tag or decide_image_tag(os.environ)
    seconds = run_build_image(tag, os.environ, timeout_s)
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
    options: Sequence[str] = (),
) -> list[str]:
    """`docker run` for one container, removed when it ends; OPTIONS are more of docker run's
    own (e.g. --shm-size=2g, -i)."""
    argv = ["docker", "run", "--rm", *options]
    if "--network" not in options:
        # Containers here have no route to the machine's resolver (the engine runs without
        # NAT), so a name lookup waits out resolv.conf's timeouts: torchrun's c10d store looks
        # up its client's name, 10 s a start. A resolver on the loopback refuses at once.
        argv += ["--dns", "127.0.0.1"]
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

"""scripts/docker-engine.sh: idempotent, and an engine that already answers is used as it is."""

from __future__ import annotations

import os
import subprocess

import pytest

from support.docker import parse_engine_exports as parse_engine_env
from tests.images.image_harness import REPO_ROOT

ENGINE = REPO_ROOT / "scripts" / "docker-engine.sh"


def _start(**env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ENGINE), "start"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **env})


def _dockerd_pids() -> set[str]:
    done = subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True, text=True)
    return set(done.stdout.split())


@pytest.mark.skipif(os.geteuid() != 0, reason="the engine is installed and started as root")
def test_start_twice_gives_the_same_engine_and_starts_nothing_more():
    first = _start()
    assert first.returncode == 0, first.stderr
    host = parse_engine_env(first.stdout)["DOCKER_HOST"]
    running = _dockerd_pids()
    assert running
    second = _start()
    assert second.returncode == 0 and parse_engine_env(second.stdout)["DOCKER_HOST"] == host
    assert _dockerd_pids() == running  # nothing new started
    # An engine named by DOCKER_HOST is used as it is (a machine that already has Docker).
    third = _start(DOCKER_HOST=host)
    assert parse_engine_env(third.stdout)["DOCKER_HOST"] == host and _dockerd_pids() == running
    version = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True,
                             text=True, env={**os.environ, "DOCKER_HOST": host})
    assert version.returncode == 0 and version.stdout.strip()


def test_parse_engine_env():
    assert parse_engine_env("noise\nexport DOCKER_HOST=unix:///run/x.sock\n") == {"DOCKER_HOST": "unix:///run/x.sock"}
    assert parse_engine_env("") == {}

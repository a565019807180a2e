"""Helpers for jobs through the real entrypoint on emulated hosts (localcluster): root needed."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from localcluster import EmulatedCluster
from localcluster.optml import JobSpec
from localcluster.processes import probe_namespace_members

ENTRYPOINT = [sys.executable, "-m", "entrypoint", "train"]
SCRIPTS = Path(__file__).resolve().parents[1] / "multihost" / "scripts"
# Short waits so fault tests end quickly; the defaults are the product's.
# PYTHONPATH: this checkout's entrypoint on every host, whatever checkout the venv's editable
# install points at (a host gets no environment of ours but what is given here).
FAST = {"BYOC_HOST_LOST_TIMEOUT_S": "10", "BYOC_PEER_WAIT_TIMEOUT_S": "60", "BYOC_GRACE_PERIOD_S": "5",
        "PYTHONPATH": str(Path(__file__).resolve().parents[2])}

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="emulated hosts need root (namespaces, veths, mounts)")


def job(program: str, distribution: str, **hps) -> JobSpec:
    return JobSpec(program=program, code_dir=str(SCRIPTS), distribution=distribution, hyperparameters=hps)


def start(cluster: EmulatedCluster, env=None):
    return cluster.start_all(ENTRYPOINT, env={**FAST, **(env or {})})


def wait_for_files(folder: str, prefix: str, count: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while len([n for n in os.listdir(folder) if n.startswith(prefix)]) < count:
        assert time.monotonic() < deadline, f"{count} {prefix}* files never appeared in {folder}"
        time.sleep(0.1)


def assert_nothing_left(cluster: EmulatedCluster) -> None:
    """No process of the job is left on any host that is still up."""
    deadline = time.monotonic() + 10
    while True:
        left = {h: probe_namespace_members(cluster.init_pid(h)) for h in cluster.host_names if cluster.is_up(h)}
        if not any(left.values()):
            return
        assert time.monotonic() < deadline, f"processes left: {describe(left)}"
        time.sleep(0.2)


def failure(cluster: EmulatedCluster, host: str) -> str:
    with open(os.path.join(cluster.opt_ml(host), "output", "failure")) as f:
        return f.read()


def describe(left: dict) -> dict:
    def cmdline(pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return f.read().replace(b"\0", b" ").decode(errors="replace")[:120]
        except OSError:
            return "?"

    return {h: [(p, cmdline(p)) for p in pids] for h, pids in left.items()}

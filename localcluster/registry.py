"""Which clusters exist on this machine, so parallel clusters never collide and a cluster whose
owner died (SIGKILL, power cut of a test runner) can be removed later.

One JSON record per cluster in /run/localcluster/clusters/, written before anything is built
and removed after everything is gone; one lock file serialises claiming a subnet.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import time
from typing import Iterator

REGISTRY_DIR = "/run/localcluster"


def _records_dir() -> str:
    return os.path.join(REGISTRY_DIR, "clusters")


@contextlib.contextmanager
def registry_lock() -> Iterator[None]:
    os.makedirs(_records_dir(), exist_ok=True)
    fd = os.open(os.path.join(REGISTRY_DIR, "lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def load_records() -> list[dict]:
    try:
        names = sorted(os.listdir(_records_dir()))
    except FileNotFoundError:
        return []
    records = []
    for name in names:
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(_records_dir(), name)) as f:
                records.append(json.load(f))
        except (OSError, ValueError):
            continue  # half-written by a process that died mid-write: nothing to undo yet
    return records


def write_record(record: dict) -> None:
    os.makedirs(_records_dir(), exist_ok=True)
    path = os.path.join(_records_dir(), f"{record['id']}.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=2)
    os.replace(tmp, path)


def remove_record(cluster_id: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(_records_dir(), f"{cluster_id}.json"))


def probe_process_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat): with
    the pid it names one process for good, even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None  # a zombie has finished: only its parent's wait() is left
    return int(fields[19])


def is_alive(pid: int, start: int | None) -> bool:
    now = probe_process_start(pid)
    return now is not None and (start is None or now == start)


def decide_stale(records: list[dict], alive: dict[str, bool]) -> list[dict]:
    """Records whose owner process is gone (pure: `alive` maps cluster id -> owner alive)."""
    return [r for r in records if not alive.get(r["id"], False)]


def kill_processes(pids: list[tuple[int, int | None]], timeout: float = 5.0) -> list[int]:
    """SIGKILL each (pid, start time) still alive and wait for it to go; returns pids that stayed."""
    for pid, start in pids:
        if is_alive(pid, start):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    left = [(p, s) for p, s in pids if is_alive(p, s)]
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = [(p, s) for p, s in left if is_alive(p, s)]
    return [p for p, _ in left]

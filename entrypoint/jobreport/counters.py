"""This host's counters, as /proc and the cgroup keep them (parse_ pure, probe_ read): one
reading is a Counters record of cumulative counts; the sampler's thread (sampler.py) reads them
each interval and turns two readings into a point of rates (build_rates). Every probe returns
None for what this machine does not have (no cgroup v1 or v2 memory file, no /proc/diskstats
in a sandbox): the report leaves that line out.
"""

from __future__ import annotations

import os
from typing import NamedTuple

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
MB = 1e6
CGROUP_MEMORY_FILES = ("/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory/memory.usage_in_bytes")


class Counters(NamedTuple):
    time: float  # time.time(): where the point goes on the job's timeline
    cores: tuple[tuple[int, int], ...]  # per core: (busy ticks, total ticks)
    machine: tuple[int, int]  # every core together
    tree_cpu_s: float  # the process tree's CPU seconds (live ones and those they reaped)
    tree_rss_bytes: int
    cgroup_bytes: int | None
    net: tuple[int, int] | None  # bytes received, sent (every interface but lo)
    disk: tuple[int, int] | None  # bytes read, written (whole disks)
    monotonic: float = 0.0  # time.monotonic(): the rates' time step (a wall-clock step is no rate)


def parse_cpu_lines(text: str) -> tuple[tuple[int, int], tuple[tuple[int, int], ...]]:
    """(machine, per core) as (busy, total) ticks from /proc/stat; idle and iowait are not busy."""
    machine, cores = (0, 0), []
    for line in text.splitlines():
        if not line.startswith("cpu"):
            continue
        name, *fields = line.split()
        ticks = [int(f) for f in fields[:8]]
        total = sum(ticks)
        pair = (total - ticks[3] - (ticks[4] if len(ticks) > 4 else 0), total)
        if name == "cpu":
            machine = pair
        else:
            cores.append(pair)
    return machine, tuple(cores)


def parse_proc_stat(text: str) -> tuple[int, int, float, int] | None:
    """(pid, ppid, CPU seconds with reaped children's, RSS bytes) from /proc/<pid>/stat; the
    command name is in parentheses and may hold spaces and parentheses itself."""
    end = text.rfind(")")
    if end < 0:
        return None
    fields = text[end + 2:].split()
    try:
        pid = int(text[:text.index(" ")])
        ticks = sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
        return pid, int(fields[1]), ticks / CLOCK_TICKS, int(fields[21]) * PAGE_BYTES
    except (ValueError, IndexError):
        return None


def build_tree(stats: list[tuple[int, int, float, int]], root: int) -> tuple[float, int]:
    """(CPU seconds, RSS bytes) of root and every process below it."""
    children: dict[int, list[int]] = {}
    by_pid = {}
    for pid, ppid, cpu, rss in stats:
        children.setdefault(ppid, []).append(pid)
        by_pid[pid] = (cpu, rss)
    cpu_s, rss, todo = 0.0, 0, [root]
    while todo:
        pid = todo.pop()
        if pid in by_pid:
            cpu_s, rss = cpu_s + by_pid[pid][0], rss + by_pid[pid][1]
        todo.extend(children.get(pid, ()))
    return cpu_s, rss


def parse_net_dev(text: str) -> tuple[int, int]:
    """(received, sent) bytes of every interface but loopback, from /proc/net/dev."""
    rx = tx = 0
    for line in text.splitlines()[2:]:
        name, _, rest = line.partition(":")
        fields = rest.split()
        if name.strip() == "lo" or len(fields) < 9:
            continue
        rx, tx = rx + int(fields[0]), tx + int(fields[8])
    return rx, tx


def parse_diskstats(text: str, disks: set[str]) -> tuple[int, int]:
    """(read, written) bytes of the whole disks named (512-byte sectors, whatever the disk's)."""
    read = written = 0
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 10 and fields[2] in disks:
            read, written = read + int(fields[5]) * 512, written + int(fields[9]) * 512
    return read, written


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def probe_whole_disks() -> set[str]:
    """The block devices that are disks, not partitions or loop devices (read once)."""
    try:
        names = os.listdir("/sys/block")
    except OSError:
        return set()
    # Not device-mapper or md devices: their bytes are their disks' bytes again (LVM, RAID).
    return {n for n in names if not n.startswith(("loop", "ram", "dm-", "md", "zram", "nbd"))}


def probe_tree(root: int) -> tuple[float, int]:
    """One pass over /proc/<pid>/stat: its cost grows with the machine's processes (in a
    container, the job's own), not with their threads, as a walk of the per-thread children
    files would (a GPU rank has dozens)."""
    return probe_whole_tree(root)


def probe_whole_tree(root: int) -> tuple[float, int]:
    stats = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            text = _read(f"/proc/{name}/stat")
            parsed = parse_proc_stat(text) if text else None
            if parsed:
                stats.append(parsed)
    return build_tree(stats, root)


def probe_cgroup_bytes() -> int | None:
    for path in CGROUP_MEMORY_FILES:
        text = _read(path)
        if text and text.strip().isdigit():
            return int(text)
    return None


def probe_counters(now: float, root: int, disks: set[str], monotonic: float = 0.0) -> Counters:
    machine, cores = parse_cpu_lines(_read("/proc/stat") or "")
    tree_cpu_s, tree_rss = probe_tree(root)
    net = _read("/proc/net/dev")
    disk = _read("/proc/diskstats")
    return Counters(now, cores, machine, tree_cpu_s, tree_rss, probe_cgroup_bytes(),
                    parse_net_dev(net) if net else None, parse_diskstats(disk, disks) if disk and disks else None,
                    monotonic)


def _pct(before: tuple[int, int], after: tuple[int, int]) -> float:
    total = after[1] - before[1]
    return round(100.0 * max(0, after[0] - before[0]) / total, 1) if total > 0 else 0.0


def _rate_mb(before: tuple[int, int] | None, after: tuple[int, int] | None, index: int, dt: float) -> float | None:
    if before is None or after is None:
        return None
    return round(max(0, after[index] - before[index]) / MB / dt, 3)


def build_rates(before: Counters, after: Counters) -> dict:
    """One point of the host's series from two samples."""
    dt = max(after.monotonic - before.monotonic if after.monotonic else after.time - before.time, 1e-3)
    return {
        "time": round(after.time, 3),
        "cpu_pct": _pct(before.machine, after.machine),
        "core_pct": [_pct(b, a) for b, a in zip(before.cores, after.cores)],
        # a process that ended unreaped takes its CPU with it: never a negative rate
        "tree_cpu_pct": round(max(0.0, after.tree_cpu_s - before.tree_cpu_s) * 100 / dt, 1),
        "tree_rss_mb": round(after.tree_rss_bytes / MB, 1),
        "cgroup_mb": round(after.cgroup_bytes / MB, 1) if after.cgroup_bytes is not None else None,
        "net_rx_mbps": _rate_mb(before.net, after.net, 0, dt),
        "net_tx_mbps": _rate_mb(before.net, after.net, 1, dt),
        "disk_read_mbps": _rate_mb(before.disk, after.disk, 0, dt),
        "disk_write_mbps": _rate_mb(before.disk, after.disk, 1, dt),
    }

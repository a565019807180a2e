"""The process table: which processes on this host are the job's ranks, and reaping orphans.

Why the entrypoint needs it:
- A stop request (SIGTERM from the platform) must reach the ranks themselves, at once. Under
  mpirun the ranks are children of `mpirun` (on the leader) or of `orted` (on a worker), each
  in its own process group; signalling mpirun instead starts Open MPI's teardown, which gives
  ranks only its kill timeout (see decide/launchers/mpirun.build_mpirun_argv).
- As PID 1 of a container (or a child subreaper) we inherit every orphan: they must be
  reaped, or they stay zombies until the container ends.
- Nothing of the job outlives a host's entrypoint: sshd and what its sessions started (orted
  and the ranks under it on an MPI worker) are stopped with it.

`load_*` read /proc; `build_*`/`decide_*` are pure; `signal_*`/`stop_*`/`reap_*` act.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import NamedTuple

from entrypoint.rank import record_errors
from entrypoint.settings import DEFAULTS

# The rsh agent mpirun uses to start its daemons: not a rank, and signalling it would look to
# mpirun like a lost daemon.
RSH_AGENT_COMMANDS = ("ssh",)


class ProcInfo(NamedTuple):
    pid: int
    ppid: int
    pgid: int
    comm: str
    state: str  # R, S, Z, ...


def parse_stat(text: str) -> ProcInfo:
    """/proc/<pid>/stat: `pid (comm) state ppid pgrp ...`; comm may hold spaces and parens."""
    open_at, close_at = text.index("("), text.rindex(")")
    rest = text[close_at + 2:].split()
    return ProcInfo(pid=int(text[:open_at]), ppid=int(rest[1]), pgid=int(rest[2]), comm=text[open_at + 1:close_at], state=rest[0])


def load_process_table() -> dict[int, ProcInfo]:
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                info = parse_stat(f.read())
        except (OSError, ValueError):
            continue  # exited while we read
        table[info.pid] = info
    return table


def build_descendants(table: dict[int, ProcInfo], pid: int) -> list[int]:
    """Every process below pid, parents before their children."""
    children: dict[int, list[int]] = {}
    for info in table.values():
        children.setdefault(info.ppid, []).append(info.pid)
    found, todo = [], [pid]
    while todo:
        for child in sorted(children.get(todo.pop(0), [])):
            found.append(child)
            todo.append(child)
    return found


def decide_rank_groups(table: dict[int, ProcInfo], launcher_pids: list[int]) -> list[int]:
    """The process groups of the ranks that the given launchers (mpirun, orted) started on this
    host: their live children other than the rsh agent. Open MPI puts each rank in a group of
    its own, so the group also holds what the rank started (data-loader workers)."""
    launchers = set(launcher_pids)
    groups = {
        info.pgid
        for info in table.values()
        if info.ppid in launchers and info.comm not in RSH_AGENT_COMMANDS and info.state != "Z"
    }
    return sorted(groups - launchers)


def decide_launcher_pids(table: dict[int, ProcInfo], root_pid: int, names: tuple[str, ...]) -> list[int]:
    """The processes below root_pid whose command is one of names (e.g. orted on a worker,
    adopted by the entrypoint as subreaper after it daemonized)."""
    return [pid for pid in build_descendants(table, root_pid) if table[pid].comm in names]


RANK_WRAPPER = "record_errors.py"  # entrypoint/rank/record_errors.py runs every Python rank
RANK_COMM_PREFIX = record_errors.RANK_COMM_PREFIX


def load_cmdlines(pids: list[int]) -> dict[int, list[str]]:
    found = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                found[pid] = [part.decode(errors="replace") for part in f.read().split(b"\0") if part]
        except OSError:
            continue  # exited
    return found


def decide_rank_pids(cmdlines: dict[int, list[str]], table: dict[int, ProcInfo]) -> list[int]:
    """The Python ranks among these processes: those running our rank wrapper, and those a
    torchrun forked (their command line is torchrun's: they name themselves, RANK_COMM_PREFIX)."""
    return sorted(pid for pid, argv in cmdlines.items()
                  if any(a.endswith(RANK_WRAPPER) for a in argv[1:3])
                  or (pid in table and table[pid].comm.startswith(RANK_COMM_PREFIX)))


def load_rank_pids_below(roots: list[int]) -> list[int]:
    """The Python ranks (running our wrapper) among these processes and their descendants."""
    table = load_process_table()
    below = [pid for root in roots for pid in [root, *build_descendants(table, root)]]
    return decide_rank_pids(load_cmdlines(below), table)


def parse_rank_comm(comm: str) -> str | None:
    """The rank number of a forked rank's name (`byoc-rank-3` -> `3`), else None."""
    number = comm[len(RANK_COMM_PREFIX):] if comm.startswith(RANK_COMM_PREFIX) else ""
    return number if number.isdigit() else None


def load_rank_label(pid: int) -> str:
    """A rank's number as its launcher gave it (mpirun, torchrun), or `pid N`. A forked rank's
    environment in /proc is its torchrun's (the one it was started with): its name says it."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            number = parse_rank_comm(f.read().strip())
    except OSError:
        number = None
    if number is not None:
        return number
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
    except OSError:
        env = {}
    for name in (b"OMPI_COMM_WORLD_RANK", b"RANK", b"PMIX_RANK"):
        if env.get(name, b"").isdigit():
            return env[name].decode()
    return f"pid {pid}"


def parse_handled_signals(status: str) -> set[int]:
    """/proc/<pid>/status: the signals the process catches or ignores (SigCgt, SigIgn), whose
    arrival does not take the default action (for SIGUSR1: the end of the process)."""
    handled = 0
    for line in status.splitlines():
        if line.startswith(("SigCgt:", "SigIgn:")):
            handled |= int(line.split(":", 1)[1].strip() or "0", 16)
    return {bit + 1 for bit in range(handled.bit_length()) if handled >> bit & 1}


def load_handles_signal(pid: int, sig: int) -> bool:
    """Whether pid has a handler for sig now (or ignores it): a rank answers SIGUSR1 only once
    rank/record_errors.py registered faulthandler for it; before, the signal would end it."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return int(sig) in parse_handled_signals(f.read())
    except (OSError, ValueError):
        return False  # gone


class Asked(NamedTuple):
    """What signal_ranks_below did: the ranks asked, in order, and those not asked because they
    could not answer yet (still starting: no handler for the signal), by label."""

    asked: list[str]
    starting: list[str]


def signal_ranks_below(roots: list[int], sig: int, gap_s: float = 0.0) -> Asked:
    """Send sig to every Python rank below roots that handles it, one at a time gap_s apart;
    a rank without a handler for it yet (its interpreter still starting) is passed over, never
    ended by the question. Labels: load_rank_label."""
    asked: list[str] = []
    starting: list[str] = []
    for pid in load_rank_pids_below(roots):
        label = load_rank_label(pid)
        if not load_handles_signal(pid, sig):
            starting.append(label)
            continue
        if asked and gap_s:
            time.sleep(gap_s)
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            continue
        asked.append(label)
    return Asked(asked, starting)


def signal_groups(groups: list[int], sig: int) -> None:
    for group in groups:
        try:
            os.killpg(group, sig)
        except (ProcessLookupError, PermissionError):
            pass


def reap_orphans(keep: set[int]) -> None:
    """Collect exited processes we inherited (as PID 1 or subreaper), never one in `keep`:
    those are subprocess.Popen children whose exit status Popen must still read."""
    while True:
        try:
            # WNOWAIT: look without collecting, so a Popen child's status stays for Popen.
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid in keep:
            return
        try:
            os.waitpid(info.si_pid, 0)
        except ChildProcessError:
            return


def become_subreaper() -> None:
    """Open MPI's orted daemonizes out of the sshd session; as a child subreaper we inherit it
    (and the ranks under it) instead of init, so the worker can end them."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def is_zombie_or_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return parse_stat(f.read()).state == "Z"
    except (OSError, ValueError, IndexError):
        return True


def stop_process(proc: subprocess.Popen | None, grace_s: float = DEFAULTS.thread_join_s) -> None:
    """SIGTERM, then SIGKILL after grace_s; waited for."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def stop_process_and_descendants(proc: subprocess.Popen | None, grace_s: float) -> None:
    """Stop proc (sshd on a worker), then every other process below us: SIGTERM, grace_s for
    them to end, SIGKILL (orted and the ranks when the leader vanished without ending them)."""
    if proc is None:
        return
    stop_process(proc)
    left = [p for p in build_descendants(load_process_table(), os.getpid()) if p != proc.pid]
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 0)):
        for pid in left:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while wait_s and time.monotonic() < deadline and not all(is_zombie_or_gone(p) for p in left):
            reap_orphans(set())
            time.sleep(DEFAULTS.wait_poll_s)
    reap_orphans(set())


def wait_for_descendants_to_end(pid: int, timeout_s: float, poll_s: float = DEFAULTS.wait_poll_s) -> bool:
    """Wait until pid (a listening sshd) has no live descendants (each connection is a child
    sshd), at most timeout_s; True when they all ended."""
    deadline = time.monotonic() + timeout_s
    while True:
        table = load_process_table()
        live = [p for p in build_descendants(table, pid) if table[p].state != "Z"]
        if not live:
            return True
        if time.monotonic() >= deadline:
            return False
        reap_orphans(set())
        time.sleep(poll_s)

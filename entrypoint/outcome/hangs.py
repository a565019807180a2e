"""Hang detection for any program (BYOC_HANG_TIMEOUT_S, off by default): when no rank on this
host has printed a line for that long, the entrypoint asks every rank for its Python stack
(SIGUSR1: faulthandler, registered in each rank by rank/record_errors.py; under a multi-host
mpirun the leader asks the workers' entrypoints too), then fails the job with exit code 124,
naming where each rank was.

Silence is the progress signal because it is the one every program gives: a rank blocked in
a collective polls at full CPU (MPI, NCCL), so CPU time says nothing. train/'s scripts have a
finer watchdog of their own (train/watchdog.py: finished training steps, on by default).

Pure: read faulthandler's dumps out of the job's output and say where each rank was.
"""

from __future__ import annotations

import re
from typing import NamedTuple

HANG_EXIT_CODE = 124  # what timeout(1) and train/watchdog.py use
# How long the ranks get to print their stacks, and the gap between two local ranks' requests
# (ranks sharing one pipe would interleave their dumps, which faulthandler writes piecewise):
# settings.py, stack_wait_s and stack_request_gap_s.

# mpirun --tag-output: `[jobid,rank]<stderr>:`
_TAG = re.compile(r"^\[\d+,(\d+)\]<std(?:out|err)>:\s?")
_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-fA-F]+ \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


class Where(NamedTuple):
    rank: str | None  # from mpirun's tag, or the order the ranks were asked in; None: unknown
    function: str
    file: str
    line: int

    def describe(self) -> str:
        return f"{self.function} ({self.file}:{self.line})"


def parse_stack_dumps(lines: list[str], ranks_in_order: list[str] | None = None) -> list[Where]:
    """Where each rank's main thread was: the top frame of each `Current thread` block of
    faulthandler's dumps. A tagged line (mpirun) names its rank; untagged dumps take their
    rank from ranks_in_order, the order the ranks were asked in (one at a time)."""
    found: dict[str, Where] = {}
    order = list(ranks_in_order or [])
    untagged = 0
    # Per stream (a tagged rank's lines interleave with the others'; untagged lines are one
    # stream): the rank whose Current-thread block we are in, until its first frame.
    current: dict[str | None, str] = {}
    for raw in lines:
        tag = _TAG.match(raw)
        stream = tag.group(1) if tag else None
        # mpirun tags every chunk a rank writes, and faulthandler writes a line in pieces: a
        # busy rank's line can hold its tag many times.
        line = raw[tag.end():].replace(tag.group(0).rstrip(), "") if tag else raw
        header = _THREAD.match(line)
        if header:
            current.pop(stream, None)
            if header.group(1) == "Current thread":
                if stream is not None:
                    current[stream] = stream
                else:
                    current[None] = order[untagged] if untagged < len(order) else f"?{untagged}"
                    untagged += 1
            continue
        frame = _FRAME.match(line)
        if frame and stream in current:
            rank = current.pop(stream)
            if rank not in found:
                found[rank] = Where(None if rank.startswith("?") else rank, frame.group(3), frame.group(1),
                                    int(frame.group(2)))
    return list(found.values())


def build_hang_reason(timeout_s: float, host: str, places: list[Where]) -> str:
    """One paragraph: the silence, then where the ranks were, those in one place together."""
    head = (f"Hang: no output from any process on {host} for {timeout_s:g} s (BYOC_HANG_TIMEOUT_S); "
            f"the job was stopped with exit code {HANG_EXIT_CODE}. Every rank's Python stack is in the log.")
    if not places:
        return head + " No rank printed a Python stack (not Python, or stuck where signals wait)."
    groups: dict[str, list[str]] = {}
    for place in places:
        groups.setdefault(place.describe(), []).append(place.rank if place.rank is not None else "")
    # The fewest first: the odd rank out is the likely culprit, the crowd waits for it.
    parts = [f"{_label(ranks)} in {where}" for where, ranks in sorted(groups.items(), key=lambda g: (len(g[1]), g[0]))]
    return head + " Where they were: " + "; ".join(parts) + "."


def _label(members: list[str]) -> str:
    """`rank 1`, `ranks 0, 2`, or `pid 812` / `a rank` where the launcher gave no rank number."""
    if all(m.isdigit() for m in members):
        numbers = sorted(members, key=int)
        return ("rank " if len(numbers) == 1 else "ranks ") + ", ".join(numbers)
    return ", ".join(f"rank {m}" if m.isdigit() else (m or "a rank") for m in members)

"""The status line: one line in the leader's log every BYOC_STATUS_INTERVAL_S (pure).

One line, fixed fields in a fixed order, each a name and then its value, separated by single
spaces, so that a CloudWatch metric filter (a space-delimited pattern) or a SageMaker
metric_definitions regex can read any of them; a value not known is `-`
(docs/job-report.md, "The status line"):

    BYOC-STATUS elapsed_s 3723 steps 1200 step_ms 52.1 slowest_rank 3 slowest_pct 41
                gpu_util_pct 86 gpu_mem_mb 12345 capacity_left_s -
"""

from __future__ import annotations

import math
import statistics
from typing import NamedTuple

MARKER = "BYOC-STATUS"
FIELDS = ("elapsed_s", "steps", "step_ms", "slowest_rank", "slowest_pct", "gpu_util_pct", "gpu_mem_mb",
          "capacity_left_s")


class RankNow(NamedTuple):
    """A rank as the live view knows it: its steps so far and its recent medians a step."""

    rank: object
    steps: int
    step_ms: float | None
    compute_ms: float | None


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)  # a 400-digit int: OverflowError
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def _cell(value, digits: int) -> str:
    value = _number(value)
    if value is None:
        return "-"
    return str(int(round(value))) if digits == 0 else f"{value:.{digits}f}"


def decide_slowest(ranks: list[RankNow]) -> tuple[object, float] | None:
    """The rank whose recent compute a step is highest, and how far above the median of the
    others' it is (%); None with fewer than two ranks timed."""
    timed = [(r.rank, r.compute_ms) for r in ranks if _number(r.compute_ms) is not None]
    if len(timed) < 2:
        return None
    rank, value = max(timed, key=lambda t: t[1])
    others = statistics.median([v for k, v in timed if k != rank] or [v for _, v in timed])
    return rank, (100.0 * (value - others) / others if others > 0 else 0.0)


def build_status_line(elapsed_s: float, ranks: list[RankNow], gpu_util_pct: list, gpu_mem_mb: list,
                      capacity_left_s: float | None) -> str:
    """The line (without the log's prefix). gpu_*: the latest reading of every GPU of the job's
    hosts (their mean use, their total memory); ranks: every rank's latest figures."""
    steps = [r.steps for r in ranks if isinstance(r.steps, int) and not isinstance(r.steps, bool)]
    step_ms = [v for v in (_number(r.step_ms) for r in ranks) if v is not None]
    slowest = decide_slowest(ranks)
    util = [v for v in (_number(g) for g in gpu_util_pct) if v is not None]
    mem = [v for v in (_number(g) for g in gpu_mem_mb) if v is not None]
    values = {
        "elapsed_s": _cell(elapsed_s, 0),
        "steps": str(max(steps)) if steps else "-",
        "step_ms": _cell(statistics.median(step_ms) if step_ms else None, 1),
        "slowest_rank": _describe_rank(slowest[0]) if slowest else "-",
        "slowest_pct": _cell(slowest[1], 0) if slowest else "-",
        "gpu_util_pct": _cell(statistics.fmean(util) if util else None, 0),
        "gpu_mem_mb": _cell(sum(mem) if mem else None, 0),
        "capacity_left_s": _cell(capacity_left_s, 0),
    }
    return " ".join([MARKER] + [f"{name} {values[name]}" for name in FIELDS])


def _describe_rank(rank) -> str:
    """A rank as one token: its number, or its text without spaces (never a second field)."""
    text = str(rank)
    cleaned = "".join(c if c.isprintable() and not c.isspace() else "_" for c in text)[:32]
    return cleaned or "-"


def parse_status_line(line: str) -> dict[str, str] | None:
    """The fields of a status line anywhere in a log line (the log's prefix may come first);
    None when there is none. For tests and for readers of the log."""
    at = line.find(MARKER + " ")
    if at < 0:
        return None
    tokens = line[at:].split()[1:]
    if len(tokens) != 2 * len(FIELDS) or tuple(tokens[0::2]) != FIELDS:
        return None
    return dict(zip(tokens[0::2], tokens[1::2]))

"""Which rank, or which host, is slow (pure).

The rule (docs/job-report.md): compare each rank's compute a step (its median) with the
median of the OTHER ranks' (so with two ranks, each is compared with the other, and one slow
rank does not pull the yardstick towards itself). A rank is a straggler when it is more than
STRAGGLER_PCT (20%) and more than MIN_EXCESS_MS (1 ms) above that, over at least MIN_STEPS
steps. Compute, not step time: in data-parallel training every rank's step takes as long as the
slowest one's, and the ranks that wait for it do so inside a collective (or, under DDP,
after their forward pass), which their compute leaves out, so they are never flagged.
Compute includes the rank's data loading (a rank slow to load its data holds the others up as
much); train/'s scripts report that part (data_wait_ms), and the straggler's line says it.
Hosts: the same rule on each host's median of its ranks' compute, with two hosts or more.
"""

from __future__ import annotations

import statistics


def decide_percentiles(values: list, qs) -> list:
    """(q, value) for each percentile q of values, nearest rank, sorted once (the report's
    distribution and the live view's job/ series: one rule)."""
    ordered = sorted(values)
    if not ordered:
        return []
    return [(q, ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]) for q in qs]


STRAGGLER_PCT = 20.0
MIN_EXCESS_MS = 1.0
MIN_STEPS = 5


def decide_median_without(ordered: list[float], at: int) -> float:
    """The median of `ordered` (sorted) without its element at index `at`, in constant time:
    what statistics.median of the others gives, without building them (a list of n for each
    of n ranks made the report quadratic: 16.6 s at 1,024 hosts)."""
    n = len(ordered) - 1  # the others

    def other(i: int) -> float:  # the i-th smallest of the others
        return ordered[i if i < at else i + 1]

    return other(n // 2) if n % 2 else (other(n // 2 - 1) + other(n // 2)) / 2


def decide_outliers(values: dict, pct: float = STRAGGLER_PCT) -> list[tuple[object, float, float, int]]:
    """(key, value, median of the others, excess %) of each value that stands out; one sort."""
    found = []
    order = sorted(values, key=lambda k: values[k])
    ordered = [values[k] for k in order]
    if len(ordered) < 2:
        return found
    for at, key in enumerate(order):
        value = ordered[at]
        median = decide_median_without(ordered, at)
        if median <= 0 or value - median <= MIN_EXCESS_MS:
            continue
        excess = round(100 * (value - median) / median)
        if excess > pct:
            found.append((key, value, median, excess))
    position = {key: i for i, key in enumerate(values)}  # ties in the order given, as before
    return sorted(found, key=lambda f: (-f[3], position[f[0]]))


def describe(who: str, value: float, median: float, excess: int) -> str:
    return f"{who}: compute {value:.0f} ms a step, median of the others {median:.0f} ms (+{excess}%)"


def decide_stragglers(ranks: list[dict], pct: float = STRAGGLER_PCT) -> list[dict]:
    """The stragglers among ranks (build_rank_figures' dicts), ranks first, then hosts."""
    timed = [r for r in ranks if isinstance(r.get("compute_ms"), (int, float)) and (r.get("steps") or 0) >= MIN_STEPS]
    by_rank = {(r["rank"], r["host"]): r["compute_ms"] for r in timed}
    stragglers = []
    data_wait = {(r["rank"], r["host"]): r.get("data_wait_ms") for r in timed}
    for (rank, host), value, median, excess in decide_outliers(by_rank, pct):
        line = describe(f"rank {rank} on {host}", value, median, excess)
        if isinstance(data_wait.get((rank, host)), (int, float)):
            line += f", of which {data_wait[(rank, host)]:.0f} ms waiting for data"
        stragglers.append({"kind": "rank", "rank": rank, "host": host, "compute_ms": round(value, 1),
                           "median_ms": round(median, 1), "excess_pct": excess, "line": line})
    per_host: dict[str, list[float]] = {}
    for r in timed:
        per_host.setdefault(r["host"], []).append(r["compute_ms"])
    if len(per_host) >= 2:
        medians = {h: statistics.median(v) for h, v in per_host.items()}
        for host, value, median, excess in decide_outliers(medians, pct):
            stragglers.append({"kind": "host", "host": host, "compute_ms": round(value, 1),
                               "median_ms": round(median, 1), "excess_pct": excess,
                               "line": describe(f"host {host}", value, median, excess)})
    return stragglers

"""A host's live update: what moves (pure, but for the rank files' loader); jobreport/live/
says who sends it and who reads it.

Whatever a figure holds (a rank file is the script's process's; a worker's words come over the
network), one rule: a figure outside what the writer can hold (a value that is not a finite
number of sensible size, a step that is not a whole number from 0 to 2**63-1, TensorBoard's
int64) is left out with a note, and the view goes on; a rank's name is cut to MAX_NAME
characters the same way wherever it is used (a long one keeps a hash of the whole, so two
stay two). A rank file too large is skipped with a note (one that does not parse, being replaced, is read
again at the next interval): never a crash, never a lost report. The traffic is bounded: one
message a worker an interval, at most settings.live_figures_bytes (the newest points kept when
it must be cut); the bytes sent are counted and logged at the end. The thread's own CPU time is
counted with the sampler's (the report's budget: 1% of a core).
"""

from __future__ import annotations

import json
import math
import os

# What a host point and a rank point carry live (the report's names); a rank file larger than
# MAX_RANK_FILE_BYTES is no file of ours (512 points a series are ~60 kB).
HOST_FIELDS = ("cpu_pct", "tree_cpu_pct", "tree_rss_mb", "cgroup_mb", "net_rx_mbps", "net_tx_mbps", "disk_read_mbps",
               "disk_write_mbps", "gpu_util_pct", "gpu_mem_mb", "gpu_power_w", "neuron_util_pct")
RANK_FIELDS = ("step_ms", "wait_ms", "backward_ms", "data_wait_ms", "samples")
MAX_RANK_FILE_BYTES = 4_000_000
MAX_POINTS = 256  # a rank's or a host's new points an interval, at most (the newest)
MAX_ABS = 1e12
MAX_STEP = (1 << 63) - 1  # an event's step is an int64
MAX_NAME = 40  # a rank's name, at most (build_rank_name)
RECENT = 64  # the steps a rank's recent medians cover (status line, stragglers)
MAX_NOTES = 20


def finite(value):
    """A number the events can carry (finite, not a bool, not absurdly large), or None. An int
    is compared as it is: a float of a 400-digit one raises OverflowError."""
    if type(value) is float:  # the common case, first: NaN and the infinities fail the comparison
        return value if -MAX_ABS <= value <= MAX_ABS else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int):
        return value if abs(value) <= MAX_ABS else None
    return value if math.isfinite(value) and abs(value) <= MAX_ABS else None


def build_step(value) -> int | None:
    """A step an event can carry (a whole number from 0 to MAX_STEP), or None."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_STEP:
        return None
    return value


def build_rank_name(rank) -> str:
    """A rank's name as the live view keeps it, the same wherever it is looked up: at most
    MAX_NAME characters; a longer one is its start and a hash of the whole."""
    text = str(rank)
    if len(text) <= MAX_NAME:
        return text
    import hashlib  # only for such a name (tests/entrypoint/test_startup_imports.py)

    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{text[:MAX_NAME - 9]}~{digest}"


class Notes:
    """What was left out, each said once (bounded: a hostile source cannot flood the log)."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def add(self, text: str, always: bool = False) -> bool:
        """always: past the bound too (the writer's own, said once each: a hostile rank file
        must not hide that the folder cannot be written)."""
        if text in self.seen or (len(self.seen) >= MAX_NOTES and not always):
            return False
        self.seen.append(text)
        return True


# --- a host's update (pure, but for the loader) --------------------------------------------------


def load_rank_raws(folder: str, notes: Notes) -> list[dict]:
    """Every rank-<N>.json in folder, as written by the ranks (rank/step_figures.py); each opened
    only when it is a regular file (paths.open_regular: a FIFO a script left there would block)."""
    from entrypoint.job.paths import open_regular

    raws = []
    try:
        names = sorted(n for n in os.listdir(folder) if n.startswith("rank-") and n.endswith(".json"))
    except OSError:
        return []
    for name in names:
        path = os.path.join(folder, name)
        try:
            if os.path.getsize(path) > MAX_RANK_FILE_BYTES:
                notes.add(f"{name}: larger than {MAX_RANK_FILE_BYTES} bytes, not read")
                continue
            with open_regular(path) as f:
                raw = json.load(f)
        except (OSError, ValueError, RecursionError):
            continue  # being replaced, or not JSON: the next interval reads it again
        if isinstance(raw, dict):
            raws.append(raw)
    return raws


def build_rank_update(raw: dict, after_step: int, notes: Notes) -> dict | None:
    """A rank's steps after after_step: [step, step_ms, wait_ms, backward_ms, data_wait_ms,
    samples] each, at most MAX_POINTS (the newest); None when the file is not a rank's."""
    series = raw.get("series")
    rank = raw.get("rank")
    if not isinstance(series, dict) or not isinstance(rank, (str, int)) or isinstance(rank, bool):
        return None
    name = build_rank_name(rank)
    columns = [series.get("step")] + [series.get(n) for n in RANK_FIELDS]
    if not all(isinstance(c, list) for c in columns):
        notes.add(f"rank {name!r}: a series that is not a list, left out")
        return None
    # The series are written in step (index by index); a column shorter than the steps (not a
    # file of ours) lacks those values: None there. A huge series: only its end can be new.
    count = len(columns[0])
    start = max(0, count - 4 * MAX_POINTS)
    columns = [(c[:count] + [None] * (count - len(c)))[start:] for c in columns]
    return build_rank_entry(name, raw.get("steps"), raw.get("ddp"), zip(*columns), after_step, notes)


def build_rank_entry(name: str, steps, ddp, rows, after_step: int, notes: Notes) -> dict:
    """A rank's entry from its rows (step, step_ms, wait_ms, backward_ms, data_wait_ms,
    samples), each number checked: the steps after after_step, at most MAX_POINTS (the newest)."""
    points, dropped, bad_steps = [], 0, 0
    for values in rows:
        step = build_step(values[0])
        if step is None:
            bad_steps += 1
            continue
        if step <= after_step:
            continue
        clean = [finite(v) for v in values[1:]]
        if clean[0] is None:
            dropped += 1
            continue
        points.append([step] + clean)
    if dropped:
        notes.add(f"rank {name!r}: steps whose time is not a finite number, left out")
    if bad_steps:
        notes.add(f"rank {name!r}: steps that are not whole numbers from 0 to {MAX_STEP}, left out")
    steps = finite(steps)
    return {"rank": name, "steps": int(steps) if steps is not None else 0, "ddp": ddp is True,
            "points": points[-MAX_POINTS:]}


def build_update(host: str, points: list[dict], raws: list[dict], sent: dict, samples_per_s, notes: Notes) -> dict:
    """This host's new figures since `sent` (rank -> last step sent; "time" -> last point's
    time), which it moves on."""
    new_points = [p for p in points if isinstance(p.get("time"), (int, float)) and p["time"] > sent.get("time", 0.0)]
    new_points = new_points[-MAX_POINTS:]
    if new_points:
        sent["time"] = new_points[-1]["time"]
    ranks = []
    for raw in raws:
        try:
            update = build_rank_update(raw, sent.get(("rank", build_rank_name(raw.get("rank"))), 0), notes)
        except Exception as exc:  # noqa: BLE001 - one rank's odd file never costs the others or the hosts
            notes.add(f"a rank file whose figures could not be read ({type(exc).__name__}), left out")
            continue
        if update is not None:
            ranks.append(update)
            if update["points"]:
                sent[("rank", update["rank"])] = update["points"][-1][0]
    return {"host": host, "points": [{k: p[k] for k in ("time",) + HOST_FIELDS if k in p} for p in new_points],
            "ranks": ranks, "samples_per_s": finite(samples_per_s)}


def fit_update(update: dict, max_bytes: int, newest: int | None = None) -> str:
    """The update's JSON, at most max_bytes: the oldest half of its points dropped until it
    fits (the next update brings newer ones), at last its points altogether. newest: only the
    newest this many points of the host and of each rank (view.decide_points_sent)."""
    if newest is not None:
        update = {**update, "points": update["points"][-newest:],
                  "ranks": [{**r, "points": r["points"][-newest:]} for r in update["ranks"]]}
    while True:
        text = json.dumps(update, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
        if len(json.dumps(text)) <= max_bytes:
            return text
        longest = max([len(update["points"])] + [len(r["points"]) for r in update["ranks"]])
        if longest == 0:
            return json.dumps({"host": update["host"], "points": [], "ranks": [], "samples_per_s": None})
        keep = longest // 2
        update = {**update, "points": update["points"][-keep:] if keep else [],
                  "ranks": [{**r, "points": r["points"][-keep:] if keep else []} for r in update["ranks"]]}


def parse_update(text: str, host: str, notes: Notes, newest: int | None = None) -> dict | None:
    """A worker's update as the leader keeps it: only the known fields, every number checked
    (build_rank_update again, on the worker's points); None when it is not an update of host.
    newest: only the newest this many points of the host and of each rank are read (a large
    job's view draws a host's newest point and merges a rank's into a few: checking every
    point of 8,192 ranks cost more than the whole view may)."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("host") != host:
        return None
    points = []
    for p in _newest(data.get("points"), newest):
        if isinstance(p, dict) and finite(p.get("time")) is not None:
            points.append({"time": p["time"], **{k: p[k] for k in HOST_FIELDS if k in p}})
    ranks = []
    for r in data.get("ranks") if isinstance(data.get("ranks"), list) else []:
        rank = r.get("rank") if isinstance(r, dict) else None
        if isinstance(rank, (str, int)) and not isinstance(rank, bool) and isinstance(r.get("points"), list):
            # The worker's points are rows already: each checked as a rank file's (build_rank_entry).
            rows = [p for p in _newest(r["points"], newest) if isinstance(p, list) and len(p) == 6]
            ranks.append(build_rank_entry(build_rank_name(rank), r.get("steps"), r.get("ddp"), rows, 0, notes))
    return {"host": host, "points": points[-MAX_POINTS:], "ranks": ranks,
            "samples_per_s": finite(data.get("samples_per_s"))}


def _newest(values, newest: int | None) -> list:
    """The list's last `newest` items (all with None); [] for what is not a list."""
    if not isinstance(values, list):
        return []
    return values if newest is None else values[-newest:]

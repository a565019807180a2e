"""A host's figures for the job report: its sampled series and its ranks' step figures (the
files rank/step_figures.py writes), in the form the leader merges (build_) and bounded in
size, since a worker sends them over the job port (fit_figures)."""

from __future__ import annotations

import json
import os
import statistics

from entrypoint.jobreport.gpu_truth import apply_gpu_timings
from entrypoint.jobreport.sampler import halve_points

SERIES_ORDER = ("time", "cpu_pct", "tree_cpu_pct", "core_pct", "tree_rss_mb", "cgroup_mb", "net_rx_mbps",
                "net_tx_mbps", "disk_read_mbps", "disk_write_mbps", "gpu_util_pct", "gpu_mem_mb", "gpu_power_w",
                "neuron_util_pct")


def build_columns(points: list[dict]) -> dict[str, list]:
    """Points (one dict a sample) as one list a measure, aligned on time; a measure a point
    lacks (a GPU reading not there yet) is None there. Measures no point has are left out."""
    names = [n for n in SERIES_ORDER if any(n in p for p in points)]
    return {n: [p.get(n) for p in points] for n in names}


def load_rank_files(folder: str) -> tuple[list[dict], list[str]]:
    """Every rank-<N>.json in folder that holds a rank's figures, each cleaned
    (build_clean_rank_file), and a note for each file or figure left out. A rank killed while
    writing left only its temporary file, which is not read; the folder is the ranks', so a
    file is opened only when it is a regular one (paths.open_regular: a FIFO would block)."""
    from entrypoint.job.paths import open_regular

    ranks, notes = [], []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return [], []
    for name in names:
        if name.startswith("rank-") and name.endswith(".json"):
            try:
                with open_regular(os.path.join(folder, name)) as f:
                    data = json.load(f)
            except (OSError, ValueError, RecursionError) as exc:
                notes.append(f"{name[:40]} ({type(exc).__name__})")
                continue
            rank, note = build_clean_rank_file(data)
            if note:
                notes.append(f"{name[:40]} ({note})")
            if rank is not None:
                ranks.append(rank)
    return ranks, notes


RANK_SERIES = ("step", "step_ms", "wait_ms", "data_wait_ms", "backward_ms", "samples")


def build_clean_rank_file(data) -> tuple[dict | None, str | None]:
    """A rank file as build_rank_figures takes it, and a note on what was left out: a series
    that is not a list of numbers is dropped, and a step whose figure in any series is not a
    finite number (NaN, inf, a text) is left out of every series (they stay aligned by step);
    counts and times that are not finite numbers become None. None when it is no rank's figures."""
    if not isinstance(data, dict) or not isinstance(data.get("series"), dict):
        return None, "not figures"
    series = {n: v for n, v in data["series"].items() if n in RANK_SERIES and isinstance(v, list)}
    dropped = sorted(set(data["series"]) & set(RANK_SERIES) - set(series))
    bad = {i for values in series.values() for i, v in enumerate(values) if _finite(v) is None}
    series = {n: [v for i, v in enumerate(values) if i not in bad] for n, values in series.items()}
    clean = {**data, "series": series, "steps": _finite(data.get("steps")),
             "first_step_at": _finite(data.get("first_step_at")), "ddp": data.get("ddp") is True,
             "attempts": build_rank_attempts(data)}
    notes = ([f"{len(bad)} step(s): not finite numbers"] if bad else []) + (
        [f"not lists: {', '.join(dropped)}"] if dropped else [])
    return clean, "; ".join(notes) or None


# reached: the furthest step seen (merge_attempts), in a host's attempts; a rank's has its steps.
ATTEMPT_FIELDS = ("attempt", "first_step_at", "last_step_at", "steps", "resumed_step", "reached")
MAX_ATTEMPTS = 101  # BYOC_MAX_RESTARTS is at most 100


def build_clean_attempts(values) -> list[dict]:
    """Attempts' summaries as the report takes them (from a rank's file or a worker's word):
    dicts of ATTEMPT_FIELDS, every one a finite number or None, an attempt a whole number from
    1; the last MAX_ATTEMPTS."""
    if not isinstance(values, list):
        return []
    clean = []
    for value in values[-MAX_ATTEMPTS:]:
        if not isinstance(value, dict):
            continue
        entry = {k: _finite(value.get(k)) for k in ATTEMPT_FIELDS}
        if isinstance(entry["attempt"], int) and entry["attempt"] >= 1:
            clean.append(entry)
    return clean


def build_rank_attempts(data: dict) -> list[dict]:
    """A rank file's attempts: the earlier ones it kept (rank/step_figures.load_earlier), then
    its own; none when the rank was not told its attempt (no restarts in place)."""
    return build_clean_attempts([*(data.get("attempts") if isinstance(data.get("attempts"), list) else []),
                                 {k: data.get(k) for k in ATTEMPT_FIELDS}])


def merge_attempts(lists: list[list[dict]]) -> list[dict]:
    """Many ranks' (or hosts') attempts as the job's, by attempt: the first step is the first
    anyone made, the last the last; `reached` is the furthest step any rank was seen at (its
    resumed step plus its steps), `resumed_step` the earliest any resumed from."""
    merged: dict[int, dict] = {}
    for attempts in lists:
        for a in attempts:
            reached = a.get("reached")
            if reached is None and a.get("resumed_step") is not None and a.get("steps") is not None:
                reached = a["resumed_step"] + a["steps"]
            m = merged.setdefault(a["attempt"], {"attempt": a["attempt"], "first_step_at": None, "last_step_at": None,
                                                 "steps": None, "resumed_step": None, "reached": None})
            for key, pick in (("first_step_at", min), ("last_step_at", max), ("steps", max),
                              ("resumed_step", min), ("reached", max)):
                value = reached if key == "reached" else a.get(key)
                if value is not None:
                    m[key] = value if m[key] is None else pick(m[key], value)
    return [merged[k] for k in sorted(merged)][-MAX_ATTEMPTS:]


def _median(values) -> float | None:
    values = [v for v in values if isinstance(v, (int, float))]
    return round(statistics.median(values), 3) if values else None


DDP_SOURCE = "DDP: step minus backward wait"


def decide_compute_source(series: dict, ddp: bool) -> str:
    if ddp:
        return DDP_SOURCE
    if any(series.get("wait_ms") or ()):
        return "step minus collectives"
    return "step (no collective seen)"


def build_compute_series(series: dict, source: str) -> list[float]:
    """Compute a step: the rank's own time, the step without its wait for the others (its data
    loading included: a rank slow to load holds the others up too); for DDP, the step itself
    until the leader knows the job's shortest backward (adjust_ddp_ranks)."""
    steps = series.get("step_ms") or []
    if source == DDP_SOURCE:
        return list(steps)
    waits = series.get("wait_ms") or [0.0] * len(steps)
    return [max(0.0, s - w) for s, w in zip(steps, waits)]


def build_rank_figures(raw: dict, host: str) -> dict:
    """One rank's summary (medians a step) and its series, from what its wrapper wrote."""
    series = raw.get("series") or {}
    source = decide_compute_source(series, bool(raw.get("ddp")))
    compute = build_compute_series(series, source)
    samples = [s for s in (series.get("samples") or []) if s]
    step_ms = _median(series.get("step_ms") or [])
    samples_per_s = _finite(round(statistics.median(samples) * 1e3 / step_ms, 1)) if samples and step_ms else None
    rank = raw.get("rank")
    return {
        "rank": int(rank) if str(rank).isdecimal() else rank, "host": host,  # isdigit: also "²", which int() refuses
        "local_rank": int(raw["local_rank"]) if str(raw.get("local_rank", "")).isdecimal() else None,
        "steps": int(_finite(raw.get("steps")) or 0), "step_ms": step_ms, "compute_ms": _median(compute),
        "wait_ms": _median(series.get("wait_ms") or []), "data_wait_ms": _median(series.get("data_wait_ms") or [])
        if any(series.get("data_wait_ms") or ()) else None, "compute_source": source, "samples_per_s": samples_per_s,
        "first_step_at": raw.get("first_step_at"), "backward_ms": _median(series.get("backward_ms") or []),
        "series": {"step": list(series.get("step") or []), "step_ms": [round(v, 3) for v in series.get("step_ms") or []],
                   "compute_ms": [round(v, 3) for v in compute],
                   "backward_ms": [round(v, 3) for v in series.get("backward_ms") or []]},
    }


def build_host_figures(host: str, points: list[dict], phases: dict[str, float], ranks: list[dict],
                       interval_s: float, cores: int, sampler_cpu_s: float, samples_per_s: float | None = None,
                       note: str | None = None) -> dict:
    """What a host gives the leader (and the leader keeps of itself). samples_per_s: what the
    script's own output lines on this host report (metric_lines.py), their median; note: what
    was left out of its rank files (load_rank_files)."""
    return {**({"note": note} if note else {}), "host": host, "status": "reported", "interval_s": interval_s, "cores": cores,
            "sampler_cpu_s": round(sampler_cpu_s, 3), "samples_per_s": samples_per_s, "series": build_columns(points),
            "phases": [{"host": host, "name": n, "time": round(t, 3)} for n, t in sorted(phases.items(), key=lambda p: p[1])],
            "attempts": merge_attempts([r.get("attempts") or [] for r in ranks]),
            "local_restarts": max([n for n in (_finite(r.get("local_restarts")) for r in ranks)
                                   if isinstance(n, int)] or [0]),
            "ranks": [apply_gpu_timings(build_rank_figures(r, host), r) for r in ranks]}


def wire_size(text: str) -> int:
    """The figures' size as the job port carries them: a JSON string inside the word, every
    quote escaped (job_port.build_record)."""
    return len(json.dumps(text))


def halve_rank_series(rank: dict) -> dict:
    return {**rank, "series": {name: values[::2] for name, values in rank["series"].items()}}


def fit_figures(host: str, points: list[dict], phases: dict[str, float], ranks: list[dict], interval_s: float,
                cores: int, sampler_cpu_s: float, max_bytes: int, samples_per_s: float | None = None,
                notes: list[str] = ()) -> tuple[dict, str]:
    """The host's figures and their JSON, at most max_bytes: the series are halved (the whole
    span at a coarser step) until they fit; past that, only the summaries go. notes: what was
    left out of the rank files (a worker's note is cut to MAX_TEXT)."""
    note = ("left out of the ranks' files: " + ", ".join(notes))[:MAX_TEXT - 20] if notes else ""
    figures = build_host_figures(host, points, phases, ranks, interval_s, cores, sampler_cpu_s, samples_per_s,
                                 note or None)
    while True:
        text = json.dumps(figures, ensure_ascii=True, separators=(",", ":"))
        if wire_size(text) <= max_bytes:
            return figures, text
        if len(points) > 2 or any(len(r["series"]["step"]) > 2 for r in figures["ranks"]):
            points = halve_points(points)
            figures = {**figures, "series": build_columns(points),
                       "ranks": [halve_rank_series(r) for r in figures["ranks"]]}
        else:
            figures = {**figures, "series": {}, "ranks": [{**r, "series": {}} for r in figures["ranks"]],
                       "note": (note + "; " if note else "") + "too large for the job port's limit: the series were left out"}
            text = json.dumps(figures, ensure_ascii=True, separators=(",", ":"))
            if wire_size(text) > max_bytes:
                figures = {**figures, "ranks": [],
                           "note": (note + "; " if note else "") + "too large for the job port's limit: only the phases"}
                text = json.dumps(figures, ensure_ascii=True, separators=(",", ":"))
            return figures, text


# --- a worker's figures, as the leader takes them (any bytes may arrive on the job port) --------

# A number larger than these is no figure of a training job (and sums of such would overflow
# to inf, which report.json cannot hold).
MAX_ABS_FLOAT = 1e12
RANK_NUMBERS = ("steps", "step_ms", "compute_ms", "wait_ms", "data_wait_ms", "samples_per_s", "first_step_at",
                "backward_ms")
MAX_TEXT = 200


def _finite(value):
    """A number the report can carry (finite, not a bool), or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int):
        return value if abs(value) <= MAX_ABS_FLOAT else None
    return value if value == value and abs(value) <= MAX_ABS_FLOAT else None


def _clean_list(values) -> list:
    if not isinstance(values, list):
        return []
    return [[_finite(x) for x in v] if isinstance(v, list) else _finite(v) for v in values]


def _clean_text(value) -> str:
    return str(value)[:MAX_TEXT] if isinstance(value, (str, int)) and not isinstance(value, bool) else ""


def _clean_rank(rank, host: str) -> dict | None:
    if not isinstance(rank, dict):
        return None
    series = rank.get("series") if isinstance(rank.get("series"), dict) else {}
    clean = {name: _finite(rank.get(name)) for name in RANK_NUMBERS}
    clean.update({"rank": _finite(rank.get("rank")) if _finite(rank.get("rank")) is not None else _clean_text(rank.get("rank")),
                  "host": host, "local_rank": _finite(rank.get("local_rank")),
                  "compute_source": _clean_text(rank.get("compute_source")),
                  "series": {n: _clean_list(series.get(n)) for n in ("step", "step_ms", "compute_ms", "backward_ms")}})
    clean["steps"] = int(clean["steps"] or 0)
    return clean


def parse_host_figures(text: str, host: str) -> dict | None:
    """A worker's figures (the JSON of fit_figures) as the leader keeps them: only the known
    fields, every number finite, every text short; the host is the one the word was signed
    for. None when it is not figures at all."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("host") != host or not isinstance(data.get("series", {}), dict):
        return None
    raw_phases = data.get("phases") if isinstance(data.get("phases"), list) else []
    raw_ranks = data.get("ranks") if isinstance(data.get("ranks"), list) else []
    phases = [{"host": host, "name": _clean_text(p.get("name")), "time": _finite(p.get("time"))}
              for p in raw_phases if isinstance(p, dict) and _finite(p.get("time")) is not None]
    ranks = [r for r in (_clean_rank(r, host) for r in raw_ranks) if r]
    return {"host": host, "status": "reported", "interval_s": _finite(data.get("interval_s")),
            "cores": _finite(data.get("cores")), "sampler_cpu_s": _finite(data.get("sampler_cpu_s")),
            "samples_per_s": _finite(data.get("samples_per_s")),
            "series": {n: _clean_list(data["series"].get(n)) for n in SERIES_ORDER if n in data.get("series", {})},
            "phases": phases, "ranks": ranks, "note": _clean_text(data.get("note")) or None,
            "attempts": build_clean_attempts(data.get("attempts")),
            "local_restarts": max(0, _finite(data.get("local_restarts")) or 0)
            if isinstance(_finite(data.get("local_restarts")), int) else 0}


def adjust_ddp_ranks(ranks: list[dict]) -> list[dict]:
    """DDP ranks wait for the slowest one's gradients inside backward(), where nothing sees the
    wait. The slowest rank waits least, so the wait of each is taken as its backward time
    beyond the job's shortest (median) backward; compute is the step without it."""
    ddp = [r for r in ranks if r.get("compute_source") == DDP_SOURCE and isinstance(r.get("backward_ms"), (int, float))]
    if not ddp:
        return ranks
    shortest = min(r["backward_ms"] for r in ddp)
    adjusted = []
    ddp_ids = {id(r) for r in ddp}  # not `r in ddp`: a dict compare per pair made the report quadratic
    for r in ranks:
        if id(r) in ddp_ids:
            series = r.get("series") or {}
            compute = [round(max(0.0, s - max(0.0, b - shortest)), 3) if isinstance(s, (int, float))
                       and isinstance(b, (int, float)) else None
                       for s, b in zip(series.get("step_ms") or [], series.get("backward_ms") or [])]
            wait = round(r["backward_ms"] - shortest, 3)
            step = r.get("step_ms") if isinstance(r.get("step_ms"), (int, float)) else None
            r = {**r, "wait_ms": wait, "compute_ms": round(step - wait, 3) if step is not None else None,
                 "series": {**series, "compute_ms": compute}}
        adjusted.append(r)
    return adjusted

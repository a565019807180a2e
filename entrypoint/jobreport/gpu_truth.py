"""A rank's GPU figures (CUDA events: rank/step_figures.GpuTimings) in its report figures (pure).

On a GPU, NCCL's collectives return before their GPU work ends: the CPU-side wait misses a rank
that waits on its GPU for a peer slowed on its own GPU. The events time that wait on the GPU,
so where a rank has them (at least MIN_STEPS steps of them), its compute a step is its step
time without the GPU's wait:
  - collectives called by the script: compute = step - GPU wait, step by step;
  - DDP (its all-reduce runs inside backward): the backward's GPU time replaces its CPU time,
    and the leader's rule (figures.adjust_ddp_ranks) takes the wait as the backward beyond
    the job's shortest (its compute_source says DDP, as on CPU).
Steps whose events were dropped (the GPU fell far behind) are simply not there.
"""

from __future__ import annotations

import math
import statistics

from entrypoint.jobreport.stragglers import MIN_STEPS

GPU_SOURCE = "GPU: step minus collectives (CUDA events)"


def _number(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int):  # math.isfinite of a 400-digit int raises OverflowError
        return value if abs(value) <= 1e12 else None
    return value if math.isfinite(value) else None


def _numbers(values) -> list:
    return [_number(v) for v in (values if isinstance(values, list) else [])]


def build_gpu_steps(raw: dict) -> dict[int, tuple[float | None, float | None]]:
    """step -> (GPU wait ms, GPU backward ms) from a rank file's "gpu" part; {} without one."""
    gpu = raw.get("gpu")
    if not isinstance(gpu, dict) or not isinstance(gpu.get("step"), list):
        return {}
    steps = gpu["step"]
    waits, backwards = _numbers(gpu.get("gpu_wait_ms")), _numbers(gpu.get("gpu_backward_ms"))
    return {s: (w, b) for s, w, b in zip(steps, waits, backwards)
            if isinstance(s, int) and not isinstance(s, bool)}


def apply_gpu_timings(rank: dict, raw: dict) -> dict:
    """rank: figures.build_rank_figures' dict for raw; with the GPU's figures where raw has
    enough of them, else unchanged."""
    gpu = build_gpu_steps(raw)
    series = rank.get("series") or {}
    pairs = [(s, ms, gpu[s]) for s, ms in zip(series.get("step") or [], series.get("step_ms") or []) if s in gpu]
    if len(pairs) < MIN_STEPS:
        return rank
    ddp = bool(raw.get("ddp"))
    if ddp:
        backward = [(s, b) for s, _, (_, b) in pairs if b is not None]
        if len(backward) < MIN_STEPS:
            return rank
        by_step = dict(backward)
        series = {**series, "backward_ms": [round(by_step.get(s, 0.0), 3) for s in series.get("step") or []]}
        # the source stays figures.DDP_SOURCE: the leader's DDP rule applies to these backwards
        return {**rank, "series": series,
                "backward_ms": round(statistics.median(b for _, b in backward), 3)}
    waits = {s: w for s, _, (w, _) in pairs if w is not None}
    compute = [round(max(0.0, ms - waits[s]), 3) if s in waits and isinstance(ms, (int, float)) else None
               for s, ms in zip(series.get("step") or [], series.get("step_ms") or [])]
    timed = [c for c in compute if c is not None]
    if len(timed) < MIN_STEPS:
        return rank
    return {**rank, "compute_source": GPU_SOURCE, "compute_ms": round(statistics.median(timed), 3),
            "wait_ms": round(statistics.median(waits.values()), 3), "series": {**series, "compute_ms": compute}}

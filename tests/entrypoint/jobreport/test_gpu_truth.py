"""GPU truth on CPU: CUDA events stood in for by events on a stand-in clock (a stream whose
work completes as the clock moves, some steps behind the CPU, as a GPU's does). The rank's
wrapper records a pair around each collective and backward, queries them at later step ends
without waiting, and the leader names the rank slowed on its GPU, which CPU-side timers cannot
(NCCL returns at once: both ranks' CPU steps look alike)."""

import importlib.util
import json
import _thread
from pathlib import Path

from entrypoint.jobreport.build import build_report
from entrypoint.jobreport.figures import build_host_figures, load_rank_files
from entrypoint.jobreport.gpu_truth import GPU_SOURCE
import pytest

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

STEP_FIGURES = Path(__file__).resolve().parents[3] / "entrypoint" / "rank" / "step_figures.py"


class Clock:
    def __init__(self):
        self.t = 1000.0

    def perf_counter(self):
        return self.t

    monotonic = time = perf_counter


class Stream:
    """One rank's GPU stream on the stand-in clock: `tail` is when the work queued so far ends;
    work completes `lag_s` behind the CPU's clock."""

    def __init__(self, clock, lag_s):
        self.clock, self.lag_s, self.tail = clock, lag_s, 0.0
        self.queries = 0

    def new_event(self):
        return Event(self)


class Event:
    def __init__(self, stream):
        self.stream, self.at = stream, None

    def record(self):
        self.at = self.stream.tail

    def query(self):  # no synchronize() exists here: a call to one would fail the test
        self.stream.queries += 1
        return self.stream.clock.t - 1000.0 - self.stream.lag_s >= self.at

    def elapsed_time(self, other):
        return (other.at - self.at) * 1e3


def load_rank_module(name):
    spec = importlib.util.spec_from_file_location(name, STEP_FIGURES)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_rank(tmp_path, rank, clock, stream):
    module = load_rank_module(f"byoc_step_figures_{rank}")
    module.time = clock  # the rank's CPU clock is the stand-in too
    module._nesting = _thread._local()
    module._figures = module.Figures(str(tmp_path / f"rank-{rank}.json"), str(rank), "0", "algo-1")
    module._figures.gpu = module.GpuTimings(stream.new_event)
    return module


def run_two_ranks_on_one_gpu(tmp_path, gpu_compute_ms=(10.0, 30.0), steps=20):
    """Each step: forward and backward queued on each rank's stream, then an all-reduce whose
    GPU work ends when the slower rank's is ready; the CPU's step is the GPU's pace for both."""
    period = (max(gpu_compute_ms) + 1.0) / 1e3
    clocks = [Clock(), Clock()]
    streams = [Stream(clocks[r], lag_s=2 * period) for r in (0, 1)]
    ranks = [make_rank(tmp_path, r, clocks[r], streams[r]) for r in (0, 1)]
    for k in range(steps):
        base = k * period
        ready = [base + ms / 1e3 for ms in gpu_compute_ms]
        for r, module in enumerate(ranks):
            streams[r].tail = ready[r]

            def all_reduce():
                streams[r].tail = max(ready) + 0.001  # NCCL's kernel ends once every rank's is in

            module.timed(all_reduce, "wait")()  # returns at once, as NCCL's does
            clocks[r].t += period
            module._figures.on_step_end()
    for module in ranks:
        module._figures.write()
    return ranks, streams


def test_pairs_complete_later_and_are_read_without_waiting(tmp_path):
    ranks, streams = run_two_ranks_on_one_gpu(tmp_path)
    gpu = ranks[0]._figures.gpu
    # the newest steps are still queued on the GPU: read later, not waited for
    # (step 0: before the first optimizer step; the CPU's points start at step 1)
    assert gpu.series["step"] == list(range(17)) and len(gpu.pending) == 3
    assert all(round(w) == 21 for w in gpu.series["gpu_wait_ms"])  # rank 0 waits 21 ms on the GPU for rank 1
    assert all(round(w) == 1 for w in ranks[1]._figures.gpu.series["gpu_wait_ms"])
    assert streams[0].queries > 0


def test_the_rank_slowed_on_its_gpu_is_named(tmp_path):
    run_two_ranks_on_one_gpu(tmp_path)
    raws, _ = load_rank_files(str(tmp_path))
    assert [len(r["gpu"]["step"]) for r in raws] == [17, 17]  # steps 17-19 were still on the GPU
    figures = build_host_figures("algo-1", [], {}, raws, 1.0, 2, 0.0)
    assert [r["compute_source"] for r in figures["ranks"]] == [GPU_SOURCE, GPU_SOURCE]
    report = build_report("test", "algo-1", ("algo-1",), 0, {"algo-1": figures}, [])
    assert [(s["kind"], s["rank"]) for s in report["stragglers"]] == [("rank", 1)], report["ranks"]
    json.dumps(report, allow_nan=False)


def test_without_the_gpus_figures_the_cpu_cannot_tell_them_apart(tmp_path):
    run_two_ranks_on_one_gpu(tmp_path)
    raws = [{k: v for k, v in raw.items() if k != "gpu"} for raw in load_rank_files(str(tmp_path))[0]]
    report = build_report("test", "algo-1", ("algo-1",), 0,
                          {"algo-1": build_host_figures("algo-1", [], {}, raws, 1.0, 2, 0.0)}, [])
    assert report["stragglers"] == []


def test_pending_pairs_are_bounded_when_the_gpu_falls_behind(tmp_path):
    clock = Clock()
    stream = Stream(clock, lag_s=1e9)  # never completes
    module = make_rank(tmp_path, 0, clock, stream)
    module._figures.gpu.max_pending = 8
    for _ in range(50):
        module.timed(lambda: None, "wait")()
        module.timed(lambda: None, "backward")()
        clock.t += 0.01
        module._figures.on_step_end()
    gpu = module._figures.gpu
    assert len(gpu.pending) <= 8 and gpu.dropped >= 84 and gpu.series["step"] == []
    assert set(gpu.totals) <= {p[0] for p in gpu.pending}


def test_a_cuda_error_ends_the_gpu_figures_and_never_reaches_the_script(tmp_path):
    clock = Clock()
    stream = Stream(clock, lag_s=0.0)
    module = make_rank(tmp_path, 0, clock, stream)

    def broken():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    module._figures.gpu.new_event = broken
    assert module.timed(lambda: 7, "wait")() == 7
    assert module._figures.gpu is None and module._figures.gpu_timings() is None


def test_hostile_gpu_figures_in_a_rank_file_leave_the_cpu_figures(tmp_path):
    run_two_ranks_on_one_gpu(tmp_path)
    raws, _ = load_rank_files(str(tmp_path))
    for raw in raws:
        raw["gpu"] = {"step": [True, "x", None] + raw["gpu"]["step"][:2], "gpu_wait_ms": [float("nan")] * 5,
                      "gpu_backward_ms": "x"}
    figures = build_host_figures("algo-1", [], {}, raws, 1.0, 2, 0.0)
    # the CPU's figures: NCCL (here its stand-in) returned at once, so no wait was seen
    assert [r["compute_source"] for r in figures["ranks"]] == ["step (no collective seen)"] * 2

"""A rank's step figures for the job report, with no change to the user's script: loaded by the
rank wrapper (record_errors.py) when BYOC_REPORT_DIR is set, standard library only.

What it measures, once torch's modules are imported by the script (an import hook: nothing is
imported here that the script does not import itself; those imported already, as in a rank
torchrun forked, are patched at start):
  - a step: from one optimizer step's end to the next (torch's global optimizer-step hooks,
    torch.optim.optimizer.register_optimizer_step_{pre,post}_hook), so any optimizer counts;
  - wait: the time inside torch.distributed's collectives the script calls (all_reduce,
    all_gather, broadcast, barrier, ...), wrapped where torch.distributed defines them. A rank
    that waits for a slow peer waits there; compute = step - wait;
  - DDP: its gradient all-reduce runs in C++ inside backward(), where no wrapper sees it; the
    rank's backward() is timed (torch.autograd.backward), and the leader takes as the wait the
    backward time beyond the job's shortest (the slowest rank waits least: jobreport/figures);
  - Horovod: its DistributedOptimizer waits for the all-reduces inside step(): that step's time
    is wait;
  - data wait, and samples a step, when the script says so (train/'s library does:
    add_data_wait, add_samples, through sys.modules["byoc_rank_figures"]);
  - on a GPU (once the script has initialised CUDA): the same collectives and backward() timed
    on the GPU too, with CUDA events (GpuTimings): recorded on the current stream, queried at
    later step ends, never synchronised. NCCL's collectives return before their GPU work ends,
    so only these see a rank wait on the GPU for a peer slowed on its GPU.
Written as JSON to BYOC_REPORT_DIR/rank-<RANK>.json every WRITE_EVERY_S from the training
thread (a rank killed outright leaves its figures up to then) and at exit. Bounded: at most
MAX_POINTS points a series; past that, pairs of steps are merged (the stride doubles).
"""

import _thread
import os
import sys
import time


def _load_internals():
    """byoc_internals.py beside this file (torch's and CPython's internals, behind one seam):
    the rank wrapper's copy, which imported it first; else loaded by path, as this module is."""
    for name in ("byoc_internals", "entrypoint.rank.byoc_internals"):
        if sys.modules.get(name) is not None:
            return sys.modules[name]
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "byoc_internals.py")
    spec = importlib.util.spec_from_file_location("byoc_internals", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


internals = _load_internals()

REPORT_DIR_ENV = "BYOC_REPORT_DIR"
WRITE_EVERY_S = 5.0
MAX_POINTS = 512
MAX_ATTEMPTS = 100  # earlier attempts' summaries a rank file keeps (BYOC_MAX_RESTARTS is at most 100)
ATTEMPT_ENV = "BYOC_ATTEMPT"  # the attempt the rank belongs to (entrypoint/decide/restarts.py)
MODULE_NAME = "byoc_rank_figures"  # where a script's library finds this module (train/report_hooks.py)
GPU_PENDING = 512  # events' pairs not yet completed on the GPU, at most (the oldest dropped past it)
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all",
               "all_to_all_single", "barrier", "broadcast", "broadcast_object_list", "gather", "reduce",
               "reduce_scatter", "reduce_scatter_tensor", "scatter", "monitored_barrier")


class GpuTimings:
    """GPU time of a step's collectives (wait) and backward, from pairs of CUDA events.

    new_event() makes an event with record(), query() and elapsed_time(other) (ms): torch's
    torch.cuda.Event(enable_timing=True), or a stand-in in the tests. begin() records one before
    the call, end() one after it; collect(), at each step's end, takes the pairs whose end event
    has completed, oldest first, without waiting, and closes a step's point once none of its pairs
    is pending. Bounded: past GPU_PENDING pairs the oldest step's are dropped (and counted)."""

    def __init__(self, new_event, max_pending: int = GPU_PENDING):
        self.new_event, self.max_pending = new_event, max_pending
        self.pending = []  # [step, slot, start event, end event], in record order
        self.totals = {}  # step -> {"wait": ms, "backward": ms}, for steps with a pair still pending
        self.dropped = 0
        self.series = {"step": [], "gpu_wait_ms": [], "gpu_backward_ms": []}

    def begin(self):
        event = self.new_event()
        event.record()
        return event

    def end(self, step: int, slot: str, start) -> None:
        event = self.new_event()
        event.record()
        self.pending.append([step, slot, start, event])
        self.totals.setdefault(step, {"wait": 0.0, "backward": 0.0})
        if len(self.pending) > self.max_pending:
            oldest = self.pending[0][0]
            self.dropped += sum(1 for p in self.pending if p[0] == oldest)
            self.pending = [p for p in self.pending if p[0] != oldest]
            self.totals.pop(oldest, None)

    def collect(self, current_step: int) -> None:
        """Completed pairs into their step's totals; every step before current_step with
        nothing pending becomes a point."""
        while self.pending and self.pending[0][3].query():
            step, slot, start, end = self.pending.pop(0)
            if step in self.totals:
                self.totals[step][slot] += start.elapsed_time(end)
        waiting = {p[0] for p in self.pending}
        for step in sorted(self.totals):
            if step >= current_step or step in waiting:
                break
            done = self.totals.pop(step)
            self.series["step"].append(step)
            self.series["gpu_wait_ms"].append(round(done["wait"], 3))
            self.series["gpu_backward_ms"].append(round(done["backward"], 3))
            if len(self.series["step"]) > MAX_POINTS:
                for values in self.series.values():
                    del values[0]


def probe_gpu_timings():
    """GpuTimings once the script has initialised CUDA (a CPU job never gets one); None before."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is None or not cuda.is_initialized():
            return None
        return GpuTimings(lambda: cuda.Event(enable_timing=True))
    except Exception:  # noqa: BLE001 - another torch: no GPU figures
        return None


class Figures:
    """The rank's running figures. A lock, since a script may step optimizers from several
    threads (uncontended, it costs well under a microsecond a step)."""

    def __init__(self, path: str, rank: str, local_rank: str, host: str):
        self.path, self.rank, self.local_rank, self.host = path, rank, local_rank, host
        self.lock = _thread.allocate_lock()
        self.steps = 0
        self.first_step_at = None  # epoch s of the first optimizer step's end
        self.last_step_at = None  # epoch s of the last one's
        self.attempt = None  # BYOC_ATTEMPT, from 1, when the entrypoint restarts the job in place
        self.resumed_step = None  # the step the script resumed from (set_resumed_step), 0 on a fresh start
        self.earlier = []  # earlier attempts' summaries (this rank's file before it: load_earlier)
        self.local_restarts = 0  # torchrun restarted this rank itself so many times (not the entrypoint)
        self.last_step_end = None  # time.perf_counter() of the last optimizer step's end
        self.wait = 0.0  # seconds inside collectives since the last step's end
        self.backward = 0.0  # seconds in backward() since the last step's end
        self.data_wait = 0.0
        self.samples = 0
        self.ddp = False
        self.stride = 1  # steps per point
        self.series = {"step": [], "step_ms": [], "wait_ms": [], "backward_ms": [], "data_wait_ms": [], "samples": []}
        self.pending = None  # the point being filled when stride > 1
        self.written_at = time.monotonic()
        self.gpu = None  # GpuTimings, from the first timed call after CUDA is initialised
        self.gpu_checked_at = -1.0  # time.monotonic() of the last look for CUDA (once a second)

    def on_step_end(self) -> None:
        with self.lock:
            self._end_step()

    def _end_step(self) -> None:
        now = time.perf_counter()
        if self.last_step_end is not None:
            self.add_point(now - self.last_step_end)
        self.last_step_at = time.time()
        if self.last_step_end is None:
            self.first_step_at = self.last_step_at
        self.steps += 1
        self.last_step_end = now
        if self.gpu is not None:
            _gpu_call(self.gpu.collect, self.steps)
        self.wait = self.backward = self.data_wait = 0.0
        self.samples = 0
        # The first point at once (the leader's live view shows the job from its first steps),
        # then every WRITE_EVERY_S.
        if self.steps == 2 or time.monotonic() - self.written_at >= WRITE_EVERY_S:
            self._write()

    def add_point(self, step_s: float) -> None:
        point = [self.steps, step_s * 1e3, self.wait * 1e3, self.backward * 1e3, self.data_wait * 1e3, self.samples]
        if self.pending is None:
            self.pending = [point, 1]
        else:
            kept = self.pending[0]
            self.pending = [[kept[0]] + [a + b for a, b in zip(kept[1:], point[1:])], self.pending[1] + 1]
        if self.pending[1] < self.stride:
            return
        merged, count = self.pending
        self.pending = None
        for name, value in zip(self.series, merged):
            self.series[name].append(value if name == "step" else round(value / count, 3))
        if len(self.series["step"]) >= MAX_POINTS:
            self.halve()

    def halve(self) -> None:
        """Merge neighbouring points: the series keeps its whole span in half the points."""
        for name, values in self.series.items():
            pairs = [values[i:i + 2] for i in range(0, len(values) - 1, 2)]
            self.series[name] = [p[0] if name == "step" else round((p[0] + p[1]) / 2, 3) for p in pairs]
        self.stride *= 2

    def as_dict(self) -> dict:
        return {"rank": self.rank, "local_rank": self.local_rank, "host": self.host, "pid": os.getpid(),
                "steps": self.steps, "first_step_at": self.first_step_at, "last_step_at": self.last_step_at,
                "attempt": self.attempt, "resumed_step": self.resumed_step, "attempts": list(self.earlier),
                "local_restarts": self.local_restarts,
                "ddp": self.ddp, "stride": self.stride,
                "series": {k: list(v) for k, v in self.series.items()},
                **({"gpu": {"dropped": self.gpu.dropped, **{k: list(v) for k, v in self.gpu.series.items()}}}
                   if self.gpu is not None else {})}

    def load_earlier(self) -> None:
        """The rank's file an earlier attempt wrote (same rank, same folder): its summary and
        the ones it kept, so the report sees each failure's cost. A file of this attempt (a
        rank of it started again: torchrun's own restart on one host) gives only the ones it
        kept; it is overwritten at the first write."""
        if self.attempt is None or not os.path.isfile(self.path):
            return
        try:
            import json

            with open(self.path) as f:
                earlier = json.load(f)
        except (OSError, ValueError, RecursionError):
            return
        if not isinstance(earlier, dict) or earlier.get("attempt") is None:
            return
        kept = [a for a in earlier.get("attempts") or () if isinstance(a, dict)] \
            if isinstance(earlier.get("attempts"), list) else []
        if earlier.get("attempt") != self.attempt:
            kept.append({k: earlier.get(k) for k in ("attempt", "first_step_at", "last_step_at", "steps", "resumed_step")})
        self.earlier = kept[-(MAX_ATTEMPTS - 1):]

    def gpu_timings(self):
        """This rank's GpuTimings, looked for at most once a second until CUDA is initialised."""
        if self.gpu is None and time.monotonic() - self.gpu_checked_at >= 1.0:
            self.gpu_checked_at = time.monotonic()
            self.gpu = probe_gpu_timings()
        return self.gpu

    def write(self) -> None:
        with self.lock:
            self._write()

    def _write(self) -> None:
        self.written_at = time.monotonic()
        try:
            import json

            tmp = f"{self.path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump(self.as_dict(), f)
            os.replace(tmp, self.path)  # the host reads whole files only
        except (OSError, ValueError, TypeError):
            pass  # the report is a bonus: never the rank's failure


_figures = None


def add_data_wait(seconds: float) -> None:
    """A script's library: time this step waited for its data (train/'s loaders call it)."""
    if _figures is not None:
        _figures.data_wait += seconds


def add_wait(seconds: float) -> None:
    """A script's library: time this step waited in a collective the wrapper does not see
    (mpi4py's, train/mpi_train.py)."""
    if _figures is not None:
        _figures.wait += seconds


def add_samples(count: int) -> None:
    """A script's library: samples this step processed (for samples a second)."""
    if _figures is not None:
        _figures.samples += count


def set_resumed_step(step: int) -> None:
    """A script's library: the step this attempt starts from (its checkpoint's; 0 on a fresh
    start), so the report counts the steps a failure made the job redo."""
    if _figures is not None and isinstance(step, int) and step >= 0:
        _figures.resumed_step = step


_nesting = None  # a thread-local: timed calls under way in this thread (made by start)


def timed(fn, slot: str):
    """fn, its time added to the figures' `slot` (wait or backward); a timed call inside
    another (all_gather_object calls all_gather) is not counted again."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        depth = getattr(_nesting, "depth", 0)
        _nesting.depth = depth + 1
        gpu = _figures.gpu_timings() if _figures is not None and depth == 0 else None
        gpu_start = _gpu_call(gpu.begin) if gpu is not None else None
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _nesting.depth = depth
            if _figures is not None and depth == 0:
                with _figures.lock:
                    setattr(_figures, slot, getattr(_figures, slot) + time.perf_counter() - started)
                    if gpu_start is not None:
                        _gpu_call(gpu.end, _figures.steps, slot, gpu_start)

    wrapper.__byoc_timed__ = True
    return wrapper


def _gpu_call(method, *args):
    """A GpuTimings call that never raises into the script: an error (a CUDA error surfacing
    here) ends the GPU figures for good."""
    try:
        return method(*args)
    except Exception:  # noqa: BLE001
        if _figures is not None:
            _figures.gpu, _figures.gpu_checked_at = None, float("inf")
        return None


def patch_collectives(module) -> None:
    """Wrap torch.distributed's collectives where they are defined (distributed_c10d), before
    torch.distributed re-exports them; where it already has (a rank torchrun forked, torch
    imported: start), its re-exports too (byoc_internals.wrap_collectives)."""
    internals.wrap_collectives(module, COLLECTIVES, lambda fn: timed(fn, "wait"))


def on_step_start(optimizer, args, kwargs) -> None:
    """torch's global pre-hook: the outermost step only (a wrapper optimizer's step runs its
    inner optimizer's, and both fire the hooks). Never raises into the script's step."""
    try:
        depth = getattr(_nesting, "steps", 0)
        _nesting.steps = depth + 1  # this thread's steps under way: a wrapper's runs its inner one's
        if depth == 0 and type(optimizer).__module__.startswith("horovod"):
            _nesting.step_started = time.perf_counter()
    except Exception:  # noqa: BLE001
        pass


def on_step_end(optimizer, args, kwargs) -> None:
    try:
        _nesting.steps = max(0, getattr(_nesting, "steps", 1) - 1)
        if _nesting.steps:
            return
        started, _nesting.step_started = getattr(_nesting, "step_started", None), None
        with _figures.lock:
            if started is not None:
                _figures.wait += time.perf_counter() - started
            _figures._end_step()
    except Exception:  # noqa: BLE001
        pass


def patch_optimizer(module) -> None:
    if hasattr(module, "register_optimizer_step_post_hook"):
        module.register_optimizer_step_pre_hook(on_step_start)
        module.register_optimizer_step_post_hook(on_step_end)


def patch_autograd(module) -> None:
    internals.wrap_autograd_backward(module, lambda fn: timed(fn, "backward"))


def note_ddp() -> None:
    """DDP's forward ran in this rank: its backward holds the gradients' all-reduce."""
    if _figures is not None:
        _figures.ddp = True


def patch_ddp(module) -> None:
    internals.wrap_ddp_forward(module, note_ddp)


PATCHES = {"torch.distributed.distributed_c10d": patch_collectives, "torch.optim.optimizer": patch_optimizer,
           "torch.autograd": patch_autograd, "torch.nn.parallel.distributed": patch_ddp}


class _AfterImport:
    """A meta path finder that runs PATCHES[name] on a module once it has executed; it finds
    nothing itself (the normal finders do), so an import is otherwise unchanged."""

    def find_spec(self, name, path=None, target=None):
        if name not in PATCHES:
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None

        def patch(module):
            try:
                PATCHES[name](module)
            except Exception:  # noqa: BLE001 - another torch: no figures, never a failed import
                pass

        # Where the loader cannot take the step (byoc_internals.run_after_exec), the normal
        # finders import the module, untouched.
        return spec if internals.run_after_exec(spec, patch) else None


def start(environ, module) -> None:
    """Called by the rank wrapper before the script runs, with this module (loaded by path)."""
    global _figures, _nesting
    folder = environ.get(REPORT_DIR_ENV)
    if not folder or not os.path.isdir(folder):
        return
    rank = environ.get("RANK") or environ.get("OMPI_COMM_WORLD_RANK") or environ.get("PMI_RANK") or "0"
    local = environ.get("LOCAL_RANK") or environ.get("OMPI_COMM_WORLD_LOCAL_RANK") or "0"
    host = environ.get("SM_CURRENT_HOST") or environ.get("HOSTNAME") or ""
    _nesting = internals.thread_local()  # threading.local without importing threading
    _figures = Figures(os.path.join(folder, f"rank-{rank}.json"), rank, local, host)
    attempt = environ.get(ATTEMPT_ENV, "")
    _figures.attempt = int(attempt) if attempt.isdecimal() else None
    restarts = environ.get("TORCHELASTIC_RESTART_COUNT", "")  # torchrun's own restarts (one host)
    _figures.local_restarts = int(restarts) if restarts.isdecimal() else 0
    _figures.load_earlier()
    sys.modules[MODULE_NAME] = module
    sys.meta_path.insert(0, _AfterImport())
    for name, patch in PATCHES.items():
        imported = sys.modules.get(name)  # before the script: a rank torchrun forked has torch
        if imported is not None:
            try:
                patch(imported)
            except Exception:  # noqa: BLE001 - another torch: no figures, never the rank's failure
                pass
    import atexit

    atexit.register(write_now)


def write_now() -> None:
    """The figures so far, now (at exit; before a failing MPI rank aborts the job)."""
    if _figures is not None and _figures.steps:
        _figures.write()

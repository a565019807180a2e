"""This host's sampler: the job report's one thread, reading its counters (counters.py) at
BYOC_REPORT_INTERVAL_S (1 s by default), and the launch's phases; the live view's ticks run on
it too, once attached (live/loop.py). The host's report (jobreport/host.py) owns one from the
moment the plan is decided to the end of its part; what it gathered becomes the host's figures
(figures.py).

The sampler's own CPU is measured (its thread's CPU time and the streaming tools'), and goes
in the report: the budget is 1% of one core.
"""

from __future__ import annotations

import os
import threading
import time

from entrypoint.jobreport import counters
from entrypoint.jobreport.accelerators import start_tools
from entrypoint.settings import DEFAULTS

# At most this many points a series keeps; past it, neighbouring points are merged (a day at
# 1 s is 86,400 points: the report shows the whole span at a coarser step).
MAX_POINTS = 2048


def merge_points(a: dict, b: dict) -> dict:
    """Two neighbouring points as one: means of the rates, the later memory and time."""
    merged = {}
    for name, later in b.items():
        earlier = a.get(name)
        if name in ("time", "tree_rss_mb", "cgroup_mb") or earlier is None or later is None:
            merged[name] = later
        elif isinstance(later, list):
            merged[name] = [None if x is None or y is None else round((x + y) / 2, 3) for x, y in zip(earlier, later)]
        else:
            merged[name] = round((earlier + later) / 2, 3)
    return merged


def halve_points(points: list[dict]) -> list[dict]:
    return [merge_points(points[i], points[i + 1]) for i in range(0, len(points) - 1, 2)] + (
        [points[-1]] if len(points) % 2 else [])


class HostSampler:
    def __init__(self, interval_s: float, root_pid: int, gpu_count: int = 0, neuron_cores: int = 0):
        self.interval_s = interval_s
        self.root_pid = root_pid
        self.points: list[dict] = []
        self.phases: dict[str, float] = {}
        self.cores = os.cpu_count() or 1
        self.cpu_s = 0.0  # the sampler thread's own CPU
        self._gpu_count, self._neuron_cores = gpu_count, neuron_cores
        self._tools: dict = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._live = None  # live/loop.LiveLoop: ticked on this thread every live.tick_s, once attached
        self._live_lock = threading.Lock()  # held through a tick: detach waits for the one under way
        self._thread = threading.Thread(target=self._run, daemon=True, name="byoc-report-sampler")

    def start(self) -> "HostSampler":
        self._thread.start()
        return self

    def mark(self, phase: str, when: float | None = None) -> None:
        """A phase of the launch, the first time it is reached (a restart does not move it).
        The main thread marks, the sampler's thread reads (snapshot): under the lock."""
        with self._lock:
            self.phases.setdefault(phase, time.time() if when is None else when)

    def attach(self, live) -> None:
        """The live view's ticks run on this thread from now on (its first, a tick from now)."""
        self._live = live

    def detach(self, live, within_s: float = DEFAULTS.live_stop_wait_s) -> None:
        """No more ticks of live here; one under way ends first, within within_s (a tick blocked
        on a FIFO where its events go must not hold the host's end)."""
        held = self._live_lock.acquire(timeout=within_s)
        try:
            if self._live is live:
                self._live = None
        finally:
            if held:
                self._live_lock.release()

    def _run(self) -> None:
        started, ticks_cpu = time.thread_time(), 0.0
        self._tools = start_tools(self.interval_s, self._gpu_count, self._neuron_cores)
        disks = counters.probe_whole_disks()
        before = counters.probe_counters(time.time(), self.root_pid, disks, time.monotonic())
        next_point, next_tick, ticked = time.monotonic() + self.interval_s, None, None
        while True:
            live = self._live
            if live is not ticked:  # attached (or detached) since: its first tick is one from now
                ticked, next_tick = live, None if live is None else time.monotonic() + live.tick_s
            due = min(next_point, next_tick if next_tick is not None else next_point)
            if self._stop.wait(max(0.0, due - time.monotonic())):
                return
            now = time.monotonic()
            if next_tick is not None and now >= next_tick:
                ticks_cpu += self._tick(live)
                next_tick = time.monotonic() + live.tick_s
            if now < next_point:
                continue
            next_point = now + self.interval_s
            after = counters.probe_counters(time.time(), self.root_pid, disks, time.monotonic())
            point = counters.build_rates(before, after)
            self._add_accelerators(point)
            with self._lock:
                self.points.append(point)
                if len(self.points) >= MAX_POINTS:
                    self.points = halve_points(self.points)
            before = after
            self.cpu_s = time.thread_time() - started - ticks_cpu  # the live view counts its own

    def _tick(self, live) -> float:
        """One tick of the live view, unless it was detached meanwhile; the CPU it took."""
        started = time.thread_time()
        with self._live_lock:
            if self._live is live:
                live.tick()
        return time.thread_time() - started

    def _add_accelerators(self, point: dict) -> None:
        for tool in self._tools.values():
            tool.read_available()
        gpus = self._tools["gpu"].latest if "gpu" in self._tools else None
        if gpus:
            point["gpu_util_pct"] = [g["util"] for g in gpus]
            point["gpu_mem_mb"] = [g["mem_mb"] for g in gpus]
            point["gpu_power_w"] = [g["power_w"] for g in gpus]
        cores = self._tools["neuron"].latest if "neuron" in self._tools else None
        if cores:
            point["neuron_util_pct"] = cores

    def stop(self) -> None:
        """Ends the sampling (the last point is the one before); idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=self.interval_s + DEFAULTS.thread_join_s)
        for tool in self._tools.values():
            self.cpu_s += tool.cpu_s()
            tool.stop()

    def snapshot(self) -> tuple[list[dict], dict[str, float]]:
        with self._lock:
            return list(self.points), dict(self.phases)

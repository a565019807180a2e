"""The leader's live view of the job: every host's updates (live/update.py) turned into
TensorBoard scalars and texts, and the recent figures the status line reads.

Tags group in TensorBoard's UI by their first part: `host/<host>/<series>` (`gpu0_util_pct`
for a GPU's), `rank/<rank>/<series>` (step_ms, compute_ms, wait_ms, backward_ms, data_wait_ms,
samples_per_s), `job/stragglers` and `job/phases` as text. Host points are at step = seconds
since the leader's entrypoint started; rank points at their optimizer step.

At scale the view stays within a fixed budget, whatever the number of hosts and ranks (a tick
once took 15 s of CPU at 256 hosts, and TensorBoard got 20,482 tags at 2,048 ranks):
- over DETAILED_HOSTS hosts, each host is its aggregates, one point a tick (its newest):
  `host/<host>/cpu_pct`, `tree_rss_mb`, `gpu_util_pct` (the mean of its GPUs), `gpu_mem_mb` (the
  largest) and `slowest_compute_ms` (its slowest rank's recent median);
- over DETAILED_RANKS ranks, only the slowest SLOWEST_RANKS ranks and those that stand out get
  `rank` series; every rank is in the job's distribution: `job` tags of step_ms and compute_ms
  at p50, p90, p99 and max;
- the outliers (job/stragglers) are decided once a tick, not once an update.
The notes say what is aggregated.

Owned by the live thread alone (no lock): updates from the job port are kept for it.
"""

from __future__ import annotations

import statistics
import time
from collections import deque

from entrypoint.jobreport.live.update import HOST_FIELDS, RECENT, Notes, finite
from entrypoint.jobreport.live.status_line import RankNow
from entrypoint.jobreport.stragglers import MIN_STEPS, decide_outliers, decide_percentiles, describe

# Each tick's rank scalars, at most: a rank's new steps are averaged into at most
# MAX_RANK_POINTS points (fewer with many ranks). Every scalar costs ~30 us to write (its record's
# CRC is computed in Python) and ~40 bytes SageMaker syncs: a job at 60 steps/s would otherwise
# write 7,200 scalars a tick for 2 ranks (0.23 s of CPU each 10 s).
MAX_RANK_SCALARS = 1000
MAX_RANK_POINTS = 16
DETAILED_HOSTS = 16  # up to this many hosts, every series of every host
DETAILED_RANKS = 64  # up to this many ranks, a series of each rank
SLOWEST_RANKS = 16  # above it, the slowest ranks' series (and those of the ranks that stand out)
PERCENTILES = (50, 90, 99, 100)  # the job's distribution, each tick (100: max)
# A large view's points read of each host and rank a tick: the newest (a host is its newest
# point; a rank's are merged into decide_points_per_rank(DETAILED_RANKS) = 2 points; its recent
# medians cover the last RECENT of them).
LARGE_POINTS_READ = 2


def decide_points_sent(job_hosts: int) -> int | None:
    """How many of its newest points a worker of a job of job_hosts hosts sends each interval
    (None: all): over DETAILED_HOSTS hosts the leader reads LARGE_POINTS_READ of each (its
    decide_points_read), so the rest would only cost both ends (at 1,024 hosts, decoding and
    checking them was most of the leader's tick)."""
    return LARGE_POINTS_READ if job_hosts > DETAILED_HOSTS else None


SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def build_tag_part(text: str) -> str:
    """A host or rank as one part of a tag: no `/` (a new group), no control characters."""
    return "".join(c if c in SAFE else "_" for c in str(text))[:64] or "_"


def decide_wait_ms(point: list, ddp: bool, shortest_backward: float | None):
    """A rank point's wait: its own, or under DDP the backward beyond the job's shortest
    (jobreport/figures.adjust_ddp_ranks, the same rule live)."""
    wait_ms, backward_ms = point[2], point[3]
    if ddp and backward_ms is not None and shortest_backward is not None:
        return max(0.0, backward_ms - shortest_backward)
    return wait_ms


def build_rank_values(point: list, ddp: bool, shortest_backward: float | None) -> dict[str, float]:
    """One rank point's scalars: [step, step_ms, wait_ms, backward_ms, data_wait_ms, samples]
    with compute = step - wait (decide_wait_ms)."""
    _, step_ms, _, backward_ms, data_wait_ms, samples = point
    wait_ms = decide_wait_ms(point, ddp, shortest_backward)
    values = {"step_ms": step_ms, "wait_ms": wait_ms, "backward_ms": backward_ms, "data_wait_ms": data_wait_ms}
    if wait_ms is not None:
        values["compute_ms"] = max(0.0, step_ms - wait_ms)
    if samples and step_ms > 0:
        values["samples_per_s"] = samples * 1e3 / step_ms  # a tiny step time: beyond what is sensible
    return {k: round(v, 3) for k, v in values.items() if v is not None and finite(v) is not None}


def build_rank_times(point: list, ddp: bool, shortest_backward: float | None) -> tuple:
    """(step_ms, compute_ms or None) of a rank point, as build_rank_values gives them: what a
    rank's recent medians take, without the rest of its scalars (a large view draws few ranks).
    A point's step_ms is a finite number: one that is not never reaches the view (update.py)."""
    step_ms = point[1]
    wait_ms = decide_wait_ms(point, ddp, shortest_backward)
    compute = finite(max(0.0, step_ms - wait_ms)) if wait_ms is not None else None
    return round(step_ms, 3), (round(compute, 3) if compute is not None else None)


def median(values):
    """statistics.median's value for a short sequence (a rank's RECENT), without its checks:
    each tick of a large view takes two of each of 8,192 ranks."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def decide_points_per_rank(ranks: int) -> int:
    return max(1, min(MAX_RANK_POINTS, MAX_RANK_SCALARS // (6 * max(1, ranks))))


def build_merged(points: list[tuple[int, dict]], most: int) -> list[tuple[int, dict]]:
    """At most `most` points from consecutive (step, values) ones: each group's means, at its
    last step (a value missing from some of a group's points: the mean of those that have it)."""
    if len(points) <= most:
        return points
    size = -(-len(points) // most)  # ceiling: groups of `size` consecutive points
    merged = []
    for start in range(0, len(points), size):
        group = points[start:start + size]
        names = {name for _, values in group for name in values}
        merged.append((group[-1][0], {name: round(statistics.fmean(v[name] for _, v in group if name in v), 3)
                                      for name in names}))
    return merged


class RankState:
    def __init__(self, ddp: bool) -> None:
        self.ddp = ddp
        self.steps = 0
        self.step_ms: deque = deque(maxlen=RECENT)
        self.compute_ms: deque = deque(maxlen=RECENT)
        self.backward_ms: deque = deque(maxlen=RECENT)


class LiveView:
    def __init__(self, started_at: float, notes: Notes):
        self.started_at = started_at  # epoch s: host points' step 0
        self.notes = notes
        self.ranks: dict[tuple[str, str], RankState] = {}
        self.latest_points: dict[str, dict] = {}  # host -> its newest point
        self.samples_said: dict[str, float] = {}  # host -> the script's samples/s last written
        self.stragglers_said = ""

        self.hosts_shown: set[str] = set()  # the hosts the last take_all wrote figures of
        self.hosts_seen: set[str] = set()
        self._recent: dict | None = None  # recent_medians of this tick

    def take(self, update: dict) -> tuple[list, list]:
        """(scalars, texts) of one host's update: (tag, value, step, wall time) each."""
        return self.take_all([update])

    def take_all(self, updates: list[dict]) -> tuple[list, list]:
        """(scalars, texts) of one tick's updates, every host's (their own, then the ranks', then
        the job's), within the view's budget."""
        self.hosts_seen.update(u["host"] for u in updates)
        detailed_hosts = len(self.hosts_seen) <= DETAILED_HOSTS
        for update in updates:  # every rank's DDP backward first: one shortest for the tick
            self._note_backward(update)
        shortest, scalars, timed = self.shortest_backward(), [], []
        for update in updates:
            host = update["host"]
            if detailed_hosts:
                scalars.extend(self._host_scalars(host, update))
            else:
                self._take_points(host, update)
            for rank in update["ranks"]:
                self._note_times(host, rank, shortest)
                timed.append((host, rank))
        self._recent = None  # the ranks' recent medians: taken once a tick, from here on
        if not detailed_hosts:
            scalars.extend(self._host_aggregates(updates))
            self.notes.add(f"{len(self.hosts_seen)} hosts: each host is drawn as its aggregates (cpu_pct, "
                           f"tree_rss_mb, gpu_util_pct, gpu_mem_mb, slowest_compute_ms), its newest point a tick")
        scalars.extend(self._rank_scalars(timed, shortest))
        self.hosts_shown = {u["host"] for u in updates}
        return scalars, self._straggler_texts()

    def _host_scalars(self, host: str, update: dict) -> list:
        scalars, part = [], build_tag_part(host)
        for point in update["points"]:
            wall = point["time"]
            step = max(0, int(round(wall - self.started_at)))
            for name in HOST_FIELDS:
                value = point.get(name)
                values = value if isinstance(value, list) else [value]
                for i, v in enumerate(values):
                    if v is None:
                        continue
                    if finite(v) is None:
                        self.notes.add(f"host {host}: a {name} value that is not a finite number, left out")
                        continue
                    tag = f"host/{part}/gpu{i}_{name[4:]}" if isinstance(value, list) and name.startswith("gpu_") \
                        else f"host/{part}/{name}{i}" if isinstance(value, list) else f"host/{part}/{name}"
                    scalars.append((tag, float(v), step, wall))
            self.latest_points[host] = point
        return scalars + self._samples_scalar(host, update, part)

    def _take_points(self, host: str, update: dict) -> None:
        if update["points"]:
            self.latest_points[host] = update["points"][-1]

    def _samples_scalar(self, host: str, update: dict, part: str) -> list:
        scalars = []
        # With the host's newest point, or on its own when the script said a new figure since:
        # its last line often comes after the last sample (the final tick must not lose it).
        samples = update.get("samples_per_s")
        if samples is not None and (update["points"] or self.samples_said.get(host) != samples):
            wall = update["points"][-1]["time"] if update["points"] else time.time()
            scalars.append((f"host/{part}/samples_per_s", float(samples), max(0, int(round(wall - self.started_at))),
                            wall))
            self.samples_said[host] = samples
        return scalars

    def _host_aggregates(self, updates: list[dict]) -> list:
        """Each host of this tick as its aggregates, at its newest point (many hosts)."""
        slowest: dict[str, float] = {}
        medians = self.recent_medians()
        for key, state in self.ranks.items():
            if state.compute_ms:
                slowest[key[1]] = max(slowest.get(key[1], 0.0), medians[key][1])
        scalars = []
        for update in updates:
            host, part = update["host"], build_tag_part(update["host"])
            point = self.latest_points.get(host)
            if point is not None and update["points"]:
                wall = point["time"]
                step = max(0, int(round(wall - self.started_at)))
                util = [v for v in point.get("gpu_util_pct") or () if finite(v) is not None]
                mem = [v for v in point.get("gpu_mem_mb") or () if finite(v) is not None]
                values = {"cpu_pct": finite(point.get("cpu_pct")), "tree_rss_mb": finite(point.get("tree_rss_mb")),
                          "gpu_util_pct": statistics.fmean(util) if util else None,
                          "gpu_mem_mb": max(mem) if mem else None, "slowest_compute_ms": slowest.get(host)}
                scalars.extend((f"host/{part}/{name}", float(v), step, wall) for name, v in values.items()
                               if v is not None)
            scalars.extend(self._samples_scalar(host, update, part))
        return scalars

    def shortest_backward(self) -> float | None:
        medians = [statistics.median(s.backward_ms) for s in self.ranks.values() if s.ddp and s.backward_ms]
        return min(medians) if medians else None

    def _note_backward(self, update: dict) -> None:
        for rank in update["ranks"]:
            state = self.ranks.setdefault((rank["rank"], update["host"]), RankState(rank["ddp"]))
            state.steps = max(state.steps, rank["steps"])
            for point in rank["points"]:
                if point[3] is not None:
                    state.backward_ms.append(point[3])

    def _note_times(self, host: str, rank: dict, shortest: float | None) -> None:
        """The rank's new points' times, its recent medians moved on."""
        state = self.ranks[(rank["rank"], host)]
        for point in rank["points"]:
            step_ms, compute_ms = build_rank_times(point, state.ddp, shortest)
            state.step_ms.append(step_ms)
            if compute_ms is not None:
                state.compute_ms.append(compute_ms)

    def _rank_scalars(self, timed: list, shortest: float | None) -> list:
        """The ranks' series ((host, rank) each): each rank's up to DETAILED_RANKS, else the
        slowest and those that stand out, and the job's distribution. A rank's scalars are made
        only when it is drawn."""
        # no wall time in a rank's point: the newest host time the view has
        wall = max((p["time"] for p in self.latest_points.values()), default=self.started_at)
        drawn = timed
        scalars: list = []
        if len(self.ranks) > DETAILED_RANKS:
            chosen = self.decide_drawn_ranks()
            drawn = [t for t in timed if (t[1]["rank"], t[0]) in chosen]
            scalars = self._job_percentiles(wall)
            self.notes.add(f"{len(self.ranks)} ranks: rank series for the slowest {SLOWEST_RANKS} and those that "
                           f"stand out; every rank in job/step_ms and job/compute_ms (p50, p90, p99, max)")
        most = decide_points_per_rank(min(len(self.ranks), DETAILED_RANKS))
        for host, rank in drawn:
            ddp = self.ranks[(rank["rank"], host)].ddp
            points = [(point[0], build_rank_values(point, ddp, shortest)) for point in rank["points"]]
            part = build_tag_part(rank["rank"])
            scalars.extend((f"rank/{part}/{name}", value, step, wall)
                           for step, values in build_merged(points, most) for name, value in values.items())
        return scalars

    def decide_points_read(self, hosts_now: int = 0) -> int | None:
        """How many of a worker's newest points the next tick reads (None: all), with hosts_now
        hosts' updates in it: a large view draws a host's newest point and at most a few points
        of a rank (from its first tick on: the hosts' count tells before the ranks are known)."""
        if len(self.ranks) > DETAILED_RANKS or max(len(self.hosts_seen), hosts_now) > DETAILED_HOSTS:
            return LARGE_POINTS_READ
        return None

    def recent_medians(self) -> dict:
        """(rank, host) -> (its recent median step, its recent median compute), each None when
        it has none; made once a tick (take_all sets it aside) and read by every part of it."""
        if self._recent is None:
            self._recent = {key: (median(s.step_ms) if s.step_ms else None,
                                  median(s.compute_ms) if s.compute_ms else None) for key, s in self.ranks.items()}
        return self._recent

    def recent_compute(self) -> dict:
        """(rank, host) -> its recent median compute, for the ranks timed long enough."""
        medians = self.recent_medians()
        return {key: medians[key][1] for key, s in self.ranks.items() if s.compute_ms and s.steps >= MIN_STEPS}

    def decide_drawn_ranks(self) -> set:
        recent = self.recent_compute()
        slowest = sorted(recent, key=lambda key: -recent[key])[:SLOWEST_RANKS]
        return set(slowest) | {key for key, *_ in decide_outliers(recent)}

    def _job_percentiles(self, wall: float) -> list:
        step = max(0, int(round(wall - self.started_at)))
        scalars = []
        medians = self.recent_medians()
        for name, values in (("step_ms", [medians[key][0] for key, s in self.ranks.items() if s.step_ms]),
                             ("compute_ms", list(self.recent_compute().values()))):
            scalars.extend((f"job/{name}/{'max' if q == 100 else f'p{q}'}", float(value), step, wall)
                           for q, value in decide_percentiles(values, PERCENTILES))
        return scalars

    def ranks_now(self) -> list[RankNow]:
        medians = self.recent_medians()
        return [RankNow(rank, s.steps, *medians[(rank, host)]) for (rank, host), s in sorted(self.ranks.items())]

    def gpu_now(self) -> tuple[list, list]:
        """The newest reading of every GPU of every host: (use %, memory MB)."""
        util, mem = [], []
        for point in self.latest_points.values():
            util.extend(v for v in point.get("gpu_util_pct") or () if finite(v) is not None)
            mem.extend(v for v in point.get("gpu_mem_mb") or () if finite(v) is not None)
        return util, mem

    def _straggler_texts(self) -> list:
        """The ranks that stand out now (the report's rule on their recent compute), as text,
        when that changed; once a tick."""
        recent = {f"rank {rank} on {host}": value for (rank, host), value in self.recent_compute().items()}
        lines = [describe(who, value, median, excess) for who, value, median, excess in decide_outliers(recent)]
        said = "\n\n".join(lines) or "no rank stands out"
        if said == self.stragglers_said or not recent:
            return []
        self.stragglers_said = said
        wall = max((p["time"] for p in self.latest_points.values()), default=self.started_at)
        return [("job/stragglers", said, max(0, int(round(wall - self.started_at))), wall)]

"""The leader's live view at scale (issue 50, item 3): every host in every interval, within a
fixed budget. The real LiveLoop takes workers' updates made by the real code (build_update,
fit_update) as the job port's handler would, ticks, and its TensorBoard events are read back.
The limits: just under, at and over each (DETAILED_HOSTS, DETAILED_RANKS)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from tensorboard.backend.event_processing import event_accumulator as accumulator

from entrypoint.decide.job_report import ReportSpec
from entrypoint.jobreport.live import view as view_module
from entrypoint.jobreport.live.loop import LiveLoop
from entrypoint.jobreport.live.update import Notes, build_update, fit_update, parse_update
from entrypoint.settings import DEFAULTS

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

T0 = 1_764_130_000.0
SLOW_RANK = 37


def host_points(start: float, h: int, samples: int = 10) -> list[dict]:
    return [{"time": start + i, "cpu_pct": 50.0 + h % 7, "tree_rss_mb": 1000.0 + h, "gpu_util_pct": [80.0, 90.0],
             "gpu_mem_mb": [100.0, 300.0 + h]} for i in range(samples)]


def rank_raw(rank: int, first_step: int, steps: int = 20) -> dict:
    compute = 300.0 * (1.5 if rank == SLOW_RANK else 1.0 + 0.01 * math.sin(rank))
    series = range(first_step, first_step + steps)
    return {"rank": str(rank), "steps": first_step + steps - 1, "ddp": False,
            "series": {"step": list(series), "step_ms": [480.0] * steps, "wait_ms": [480.0 - compute] * steps,
                       "backward_ms": [100.0] * steps, "data_wait_ms": [0.0] * steps, "samples": [32] * steps}}


class Sampler:
    def __init__(self):
        self.phases = {"entrypoint start": T0}
        self.points: list[dict] = []

    def snapshot(self):
        return list(self.points), dict(self.phases)


class NoThroughput:
    def median(self):
        return None


def run_ticks(tmp_path: Path, hosts: int, ranks_per_host: int, ticks: int = 2, twice: set = frozenset()):
    """The leader (algo-1, no ranks of its own) after `ticks` ticks of every worker's update;
    the hosts in `twice` send two updates before each tick. (loop, its tags, its log)."""
    ranks_dir = tmp_path / "ranks"
    ranks_dir.mkdir(exist_ok=True)
    sampler, logged = Sampler(), []
    spec = ReportSpec(str(ranks_dir), 1.0, 2, 0, str(tmp_path / "tb" / "byoc-job"), 10.0, 10.0)
    loop = LiveLoop(spec, "algo-1", sampler, NoThroughput(), logged.append)
    sent = [dict() for _ in range(hosts)]
    for tick in range(ticks):
        start = T0 + 10 * tick
        sampler.points = host_points(start, 0)
        for h in range(1, hosts):
            for again in range(2 if f"algo-{h + 1}" in twice else 1):
                raws = [rank_raw((h - 1) * ranks_per_host + local, 1 + (2 * tick + again) * 20)
                        for local in range(ranks_per_host)]
                update = build_update(f"algo-{h + 1}", host_points(start + again, h), raws, sent[h], None, Notes())
                loop.take_remote(f"algo-{h + 1}", fit_update(update, DEFAULTS.live_figures_bytes))
        loop.next_status = 0.0
        loop.tick()
    acc = accumulator.EventAccumulator(str(tmp_path / "tb" / "byoc-job"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    return loop, tags, logged


def test_every_one_of_256_hosts_is_in_every_interval_and_the_series_are_bounded(tmp_path):
    loop, tags, logged = run_ticks(tmp_path, 256, 8)
    assert len(loop.view.hosts_shown) == 256  # before: 65 (a queue of 64 dropped the rest)
    workers = [f"algo-{h}" for h in range(2, 257)]
    for host in workers:
        assert len(tags[f"host/{host}/cpu_pct"]) == 2  # one point a tick, each tick
        assert tags[f"host/{host}/gpu_mem_mb"][-1][1] == 300.0 + int(host.split("-")[1]) - 1  # the largest GPU's
    assert not any("/gpu0_" in tag for tag in tags)  # aggregated: no series per GPU per host
    rank_tags = {tag.split("/")[1] for tag in tags if tag.startswith("rank/")}
    assert str(SLOW_RANK) in rank_tags and len(rank_tags) <= view_module.SLOWEST_RANKS + 1
    for name in ("step_ms", "compute_ms"):
        assert {f"job/{name}/{q}" for q in ("p50", "p90", "p99", "max")} <= set(tags)
    assert tags["job/compute_ms/max"][-1][1] == pytest.approx(450.0)  # the slow rank is the job's max
    assert len(tags) <= 256 * 6 + 16 * 6 + 8 + 4  # bounded by the hosts, not by the ranks
    notes = [line for line in logged if line.startswith("job report (live)")]
    assert any("256 hosts: each host is drawn as its aggregates" in n for n in notes), notes
    assert any("2040 ranks: rank series for the slowest 16" in n for n in notes), notes


def test_a_host_that_sends_twice_before_a_tick_is_drawn_with_its_newer_update_and_said(tmp_path):
    loop, tags, logged = run_ticks(tmp_path, 20, 1, ticks=1, twice={"algo-5"})
    assert len(loop.view.hosts_shown) == 20
    # The first update's newest point is at +9 s, the newer one's at +10 s: the newer is drawn.
    assert tags["host/algo-5/cpu_pct"] == [(10, 54.0)]
    assert any("an update replaced by its host's newer one is not drawn" in line for line in logged), logged


@pytest.mark.parametrize("hosts, detailed", [(15, True), (16, True), (17, False)])
def test_every_series_of_each_host_up_to_the_limit(tmp_path, hosts, detailed):
    _, tags, _ = run_ticks(tmp_path, hosts, 1, ticks=1)
    assert ("host/algo-2/gpu0_util_pct" in tags) is detailed
    assert ("host/algo-2/gpu_util_pct" in tags) is not detailed


@pytest.mark.parametrize("ranks, every_rank", [(63, True), (64, True), (65, False)])
def test_a_series_of_each_rank_up_to_the_limit(tmp_path, ranks, every_rank):
    _, tags, _ = run_ticks(tmp_path, ranks + 1, 1, ticks=1)  # a rank a worker
    drawn = {tag.split("/")[1] for tag in tags if tag.startswith("rank/")}
    assert (len(drawn) == ranks) is every_rank
    assert ("job/step_ms/p50" in tags) is not every_rank


def test_a_large_view_reads_only_the_newest_points_of_an_update():
    update = build_update("algo-2", host_points(T0, 1), [rank_raw(0, 1)], {}, None, Notes())
    text = fit_update(update, DEFAULTS.live_figures_bytes)
    every = parse_update(text, "algo-2", Notes())
    newest = parse_update(text, "algo-2", Notes(), newest=2)
    assert len(every["points"]) == 10 and len(every["ranks"][0]["points"]) == 20
    assert newest["points"] == every["points"][-2:] and newest["ranks"][0]["points"] == every["ranks"][0]["points"][-2:]
    assert json.loads(text)["host"] == "algo-2"


@pytest.mark.parametrize("job_hosts, newest", [(16, None), (17, 2), (1024, 2)])
def test_a_worker_of_a_large_job_sends_only_the_newest_points_the_leader_reads(tmp_path, job_hosts, newest):
    """Over DETAILED_HOSTS hosts the leader reads LARGE_POINTS_READ points of each host and rank
    (decide_points_read): a worker of such a job sends only those (the real worker LiveLoop,
    its send taken here); up to the limit, every new point. The leader reads what it sent as it
    would have read the whole update."""
    (tmp_path / "ranks").mkdir()
    (tmp_path / "ranks" / "rank-0.json").write_text(json.dumps(rank_raw(0, 1)))
    sampler, sent = Sampler(), []
    sampler.points = host_points(T0, 1)
    spec = ReportSpec(str(tmp_path / "ranks"), 1.0, 2, 0, str(tmp_path / "tb"), 10.0, 10.0)
    worker = LiveLoop(spec, "algo-2", sampler, NoThroughput(), lambda line: None,
                      send=lambda text: sent.append(text) or len(text), job_hosts=job_hosts)
    worker.tick()
    update = json.loads(sent[0])
    assert len(update["points"]) == (newest or 10) and len(update["ranks"][0]["points"]) == (newest or 20)
    assert [p["time"] for p in update["points"]] == [T0 + i for i in range(10)][-(newest or 10):]
    assert [p[0] for p in update["ranks"][0]["points"]] == list(range(1, 21))[-(newest or 20):]
    whole = build_update("algo-2", host_points(T0, 1), [rank_raw(0, 1)], {}, None, Notes())
    read = parse_update(fit_update(whole, DEFAULTS.live_figures_bytes), "algo-2", Notes(), newest)
    assert parse_update(sent[0], "algo-2", Notes(), newest) == read
    worker.tick()  # nothing new since: nothing resent
    assert json.loads(sent[1])["points"] == [] and json.loads(sent[1])["ranks"][0]["points"] == []

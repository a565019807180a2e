"""The job report's pure parts: the straggler rule at its edges, the bounded figures, a
worker's figures taken on the leader's terms, the samplers' parsers; and the BYOC-HOST-FIGURES
word through a real job port (signed, bounded, refused when hostile)."""

import json
import math
import os
import socket
import time

import pytest

from entrypoint.hosts.job_port import (HOST_FIGURES, MAX_MESSAGE_BYTES, HostFigures, JobPort, Refused, build_record,
                                       build_signed_line, deliver)
from entrypoint.loop import HostLoop
from entrypoint.jobreport import accelerators, counters
from entrypoint.jobreport.build import build_report, build_summary_lines
from entrypoint.jobreport.figures import fit_figures, parse_host_figures
from entrypoint.jobreport.sampler import MAX_POINTS, halve_points
from entrypoint.jobreport.stragglers import MIN_STEPS, STRAGGLER_PCT, decide_stragglers

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

KEY = "cd" * 32


def rank(r, host, compute, steps=50, step=None):
    return {"rank": r, "host": host, "steps": steps, "compute_ms": compute, "step_ms": step or 60.0}


# --- stragglers ---------------------------------------------------------------------------------


def test_the_slow_rank_is_named_and_the_ranks_waiting_for_it_are_not():
    # every step takes 55 ms on every rank (they wait for rank 3); compute tells them apart
    ranks = [rank(0, "algo-1", 37.0), rank(1, "algo-1", 36.0), rank(2, "algo-2", 38.0), rank(3, "algo-2", 52.0)]
    found = decide_stragglers(ranks)
    assert [(s["kind"], s.get("rank"), s["host"]) for s in found if s["kind"] == "rank"] == [("rank", 3, "algo-2")]
    assert found[0]["line"] == "rank 3 on algo-2: compute 52 ms a step, median of the others 37 ms (+41%)"


def test_two_ranks_each_compared_with_the_other():
    found = decide_stragglers([rank(0, "h", 10.0), rank(1, "h", 30.0)])
    assert [s["rank"] for s in found] == [1]


@pytest.mark.parametrize("excess_pct, flagged", [(STRAGGLER_PCT - 1, False), (STRAGGLER_PCT, False),
                                                 (STRAGGLER_PCT + 1, True)])
def test_the_threshold_just_under_at_and_over(excess_pct, flagged):
    ranks = [rank(0, "h", 100.0), rank(1, "h", 100.0), rank(2, "h", 100.0 + excess_pct)]
    assert bool(decide_stragglers(ranks)) is flagged


def test_too_few_steps_or_a_sub_millisecond_difference_flags_nobody():
    assert decide_stragglers([rank(0, "h", 10.0), rank(1, "h", 30.0, steps=MIN_STEPS - 1)]) == []
    assert decide_stragglers([rank(0, "h", 0.1), rank(1, "h", 0.9)]) == []  # +800%, but 0.8 ms
    assert decide_stragglers([rank(0, "h", 10.0)]) == []  # alone: nobody to compare with
    assert decide_stragglers([]) == []


def test_a_slow_host_is_named_as_a_host():
    ranks = [rank(i, f"algo-{1 + i // 2}", 80.0 if i >= 4 else 40.0) for i in range(6)]
    hosts = [s for s in decide_stragglers(ranks) if s["kind"] == "host"]
    assert [s["host"] for s in hosts] == ["algo-3"]


# --- figures: bounded, and a worker's taken on the leader's terms --------------------------------


def points(n):
    return [{"time": 1000.0 + i, "cpu_pct": 50.0, "core_pct": [10.0] * 96, "tree_cpu_pct": 120.0, "tree_rss_mb": 500.0,
             "cgroup_mb": 900.0, "net_rx_mbps": 1.0, "net_tx_mbps": 1.0, "disk_read_mbps": 0.0,
             "disk_write_mbps": 0.0} for i in range(n)]


def rank_file(r, n):
    return {"rank": str(r), "local_rank": str(r % 8), "steps": n, "first_step_at": 1001.0, "ddp": False,
            "series": {"step": list(range(n)), "step_ms": [40.0] * n, "wait_ms": [5.0] * n, "forward_ms": [0.0] * n,
                       "data_wait_ms": [0.0] * n, "samples": [0] * n}}


@pytest.mark.parametrize("max_bytes", [MAX_MESSAGE_BYTES - 5536, 20000, 3000])
def test_figures_fit_the_limit_whatever_the_job_length(max_bytes):
    figures, text = fit_figures("algo-2", points(MAX_POINTS), {"end": 2000.0}, [rank_file(r, 512) for r in range(8)],
                                1.0, 96, 0.5, max_bytes)
    assert len(text) <= max_bytes and json.loads(text) == figures
    assert figures["phases"] == [{"host": "algo-2", "name": "end", "time": 2000.0}]


def test_halving_keeps_the_span_and_means_the_rates():
    halved = halve_points([{"time": 1.0, "cpu_pct": 10.0, "tree_rss_mb": 5.0}, {"time": 2.0, "cpu_pct": 30.0, "tree_rss_mb": 7.0},
                           {"time": 3.0, "cpu_pct": 50.0, "tree_rss_mb": 9.0}])
    assert halved == [{"time": 2.0, "cpu_pct": 20.0, "tree_rss_mb": 7.0}, {"time": 3.0, "cpu_pct": 50.0, "tree_rss_mb": 9.0}]


HOSTILE = [
    "not json", "[]", "1e999", '{"host": "algo-3"}', "[" * 100000 + "]" * 100000,
    json.dumps({"host": "algo-2", "series": "x"}),
]


@pytest.mark.parametrize("text", HOSTILE)
def test_what_is_not_this_hosts_figures_is_refused(text):
    assert parse_host_figures(text, "algo-2") is None


def test_a_workers_figures_keep_only_finite_numbers_and_short_text():
    text = ('{"host": "algo-2", "interval_s": NaN, "cores": true, "series": {"cpu_pct": [1, Infinity, "x", [2, NaN]],'
            ' "evil": [1]}, "phases": [{"name": "' + "<script>" * 100 + '", "time": 5}, {"name": "x", "time": "y"}],'
            ' "ranks": [{"rank": "0\\udc80", "steps": 1e400, "step_ms": -Infinity, "series": {"step": [1, NaN]}}, 7],'
            ' "extra": {"deep": 1}}')
    got = parse_host_figures(text, "algo-2")
    assert got["interval_s"] is None and got["cores"] is None
    assert got["series"] == {"cpu_pct": [1, None, None, [2, None]]}
    assert got["phases"] == [{"host": "algo-2", "name": ("<script>" * 100)[:200], "time": 5}]
    assert got["ranks"][0]["rank"] == "0\udc80" and got["ranks"][0]["steps"] == 0 and got["ranks"][0]["step_ms"] is None
    assert len(got["ranks"]) == 1 and "extra" not in got
    report = build_report("x", "algo-1", ("algo-1", "algo-2"), 0, {"algo-2": got}, [])
    json.dumps(report, allow_nan=False)  # what write_report_files does: no NaN reaches report.json


def test_a_host_without_figures_is_reported_missing_and_a_note_says_so():
    report = build_report("torchrun on 2 host(s)", "algo-1", ("algo-1", "algo-2"), 1, {}, [])
    assert set(report) >= {"hosts", "ranks", "stragglers", "phases"}
    assert report["hosts"]["algo-2"]["status"] == "missing"
    assert any("algo-2's figures did not reach the leader" in n for n in report["notes"])
    assert any("not a PyTorch program" in n for n in report["notes"])
    assert "(figures missing)" in "\n".join(build_summary_lines(report))


# --- the word on a real job port ---------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(seen, count=1):
    deadline = time.monotonic() + 10
    while len(seen) < count and time.monotonic() < deadline:
        time.sleep(0.02)


def test_signed_figures_reach_the_leader_and_hostile_ones_are_refused():
    port, loop, figures, refused = free_port(), HostLoop(), [], []
    loop.on({HostFigures: figures.append, Refused: refused.append})
    job_port = JobPort(port, loop.post, job_key=KEY)
    try:
        assert deliver(loop, "127.0.0.1", port, KEY, HostFigures("algo-2", '{"host": "algo-2"}'), 5.0)
        loop.wait(lambda: bool(figures), time.monotonic() + 60)
        assert figures == [HostFigures("algo-2", '{"host": "algo-2"}', "127.0.0.1")]
        record = build_record(HostFigures("algo-2", "{}"), time.time())
        for line in (record + "\n",  # unsigned
                     build_signed_line("ef" * 32, record),  # another job's key
                     build_signed_line(KEY, HOST_FIGURES + json.dumps({"time": time.time(), "figures": 1})),
                     build_signed_line(KEY, build_record(HostFigures("algo-2", "x" * MAX_MESSAGE_BYTES), time.time()))):
            with socket.create_connection(("127.0.0.1", port)) as conn:
                conn.sendall(line.encode())
        loop.wait(lambda: len(refused) >= 4, time.monotonic() + 60)
        assert len(figures) == 1 and len(refused) == 4, refused
    finally:
        job_port.close()


# --- the samplers' parsers ---------------------------------------------------------------------


def test_proc_stat_with_spaces_and_parentheses_in_the_command_name():
    fields = ["S", "7"] + ["0"] * 9 + ["100", "50", "25", "25"] + ["0"] * 6 + ["10"]
    parsed = counters.parse_proc_stat("42 (a) b (c)) " + " ".join(fields))
    assert parsed == (42, 7, 200 / counters.CLOCK_TICKS, 10 * counters.PAGE_BYTES)
    assert counters.parse_proc_stat("garbage") is None


def test_the_tree_is_root_and_what_is_below_it_only():
    stats = [(1, 0, 1.0, 10), (5, 1, 2.0, 20), (6, 5, 3.0, 30), (7, 1, 4.0, 40), (9, 0, 100.0, 1000)]
    assert counters.build_tree(stats, 5) == (5.0, 50)


def test_cpu_rates_and_counters_that_go_backwards():
    machine, cores = counters.parse_cpu_lines("cpu  10 0 10 80 0 0 0 0\ncpu0 5 0 5 40 0 0 0 0\ncpu1 5 0 5 40 0 0 0 0\n")
    assert machine == (20, 100) and cores == ((10, 50), (10, 50))
    a = counters.Counters(0.0, ((0, 0),), (0, 0), 5.0, 0, None, (100, 100), None)
    b = counters.Counters(1.0, ((50, 100),), (50, 100), 4.0, 0, None, (50, 100 + 2_000_000), None)
    rates = counters.build_rates(a, b)
    assert rates["tree_cpu_pct"] == 0.0 and rates["net_rx_mbps"] == 0.0 and rates["net_tx_mbps"] == 2.0
    assert rates["core_pct"] == [50.0] and rates["cgroup_mb"] is None and rates["disk_read_mbps"] is None


def test_nvidia_smi_and_neuron_monitor_readings():
    assert accelerators.parse_gpu_line("0, 87, 12034, 310.52") == (0, {"util": 87.0, "mem_mb": 12034.0, "power_w": 310.52})
    assert accelerators.parse_gpu_line("1, 0, 3, [N/A]")[1]["power_w"] is None
    assert accelerators.parse_gpu_line("No devices were found") is None
    report = {"neuron_runtime_data": [{"report": {"neuroncore_counters": {"neuroncores_in_use": {
        "0": {"neuroncore_utilization": 91.5}, "2": {"neuroncore_utilization": 10.0}}}}}]}
    assert accelerators.parse_neuron_report(json.dumps(report)) == [91.5, None, 10.0]
    assert accelerators.parse_neuron_report("{") is None
    assert "--loop-ms=1000" in accelerators.build_nvidia_smi_argv(1.0)
    assert math.isclose(float(accelerators.build_neuron_monitor_config(0.4)["period"][:-1]), 1)


def test_ddp_ranks_wait_is_their_backward_beyond_the_shortest():
    from entrypoint.jobreport.figures import DDP_SOURCE, adjust_ddp_ranks

    def ddp(r, backward):
        return {"rank": r, "host": "h", "steps": 50, "step_ms": 60.0, "compute_ms": 60.0, "backward_ms": backward,
                "compute_source": DDP_SOURCE, "series": {"step_ms": [60.0, 60.0], "backward_ms": [backward, backward]}}

    # rank 1 is slow before backward (its data): rank 0 waits 20 ms for it inside backward()
    adjusted = adjust_ddp_ranks([ddp(0, 30.0), ddp(1, 10.0), {"rank": 2, "host": "h", "compute_ms": 5.0}])
    assert [(r.get("compute_ms"), r.get("wait_ms")) for r in adjusted] == [(40.0, 20.0), (60.0, 0.0), (5.0, None)]
    assert adjusted[0]["series"]["compute_ms"] == [40.0, 40.0]
    assert [s["rank"] for s in decide_stragglers(adjusted[:2])] == [1]


@pytest.mark.parametrize("raw, ok", [("0.09", False), ("0.1", True), ("60", True), ("60.1", False), ("x", False)])
def test_the_sampling_interval_just_under_at_and_over_its_limits(raw, ok):
    from entrypoint.decide.settings import parse_launch_settings
    from entrypoint.errors import JobDefinitionError

    if ok:
        assert parse_launch_settings({"BYOC_REPORT_INTERVAL_S": raw}).report_interval_s == float(raw)
    else:
        with pytest.raises(JobDefinitionError, match="BYOC_REPORT_INTERVAL_S"):
            parse_launch_settings({"BYOC_REPORT_INTERVAL_S": raw})


@pytest.mark.parametrize("raw, on", [("", True), ("1", True), ("on", True), ("0", False), ("off", False), ("False", False)])
def test_byoc_report_switch(raw, on):
    from entrypoint.decide.settings import parse_launch_settings

    assert parse_launch_settings({"BYOC_REPORT": raw}).report is on


def test_a_byoc_report_that_is_neither_is_a_bad_job_definition():
    from entrypoint.decide.settings import parse_launch_settings
    from entrypoint.errors import JobDefinitionError

    with pytest.raises(JobDefinitionError, match=r"BYOC_REPORT='maybe' must be 1 \(on\) or 0 \(off\)"):
        parse_launch_settings({"BYOC_REPORT": "maybe"})


@pytest.mark.parametrize("line, value", [
    ("[progress] epoch 1/3 step 40/120 loss 0.5123 12,345 samples/s ETA 0:12", 12345.0),  # train/'s lines
    ("[1,0]<stdout>:epoch 2 3.5 samples/sec", 3.5),
    ('{"metric": "x", "samples_per_sec": 1.5e3}', 1500.0),
    ("samples_per_second=42", 42.0),
    ("no throughput here", None), ("12,34 samples/s", None), ("samples_per_sec=nan", None),
    ("1" * 400 + " samples/s", None),  # float("1" * 400) is inf: no value
    ("loss 0.1 samples 512", None),
])
def test_throughput_from_the_scripts_own_lines(line, value):
    from entrypoint.jobreport.metric_lines import parse_samples_per_s

    assert parse_samples_per_s(line) == value


def test_reported_throughput_is_bounded_and_its_median_is_the_runs():
    from entrypoint.jobreport.metric_lines import MAX_VALUES, ReportedThroughput

    seen = ReportedThroughput()
    assert seen.median() is None
    for i in range(MAX_VALUES * 3):
        seen.take(f"{100 + i % 3} samples/s")
    assert len(seen.values) <= MAX_VALUES and seen.median() == 101.0


@pytest.mark.parametrize("field, value", [("phases", 5), ("ranks", 7), ("phases", "x"), ("ranks", {"a": 1})])
def test_figures_of_the_wrong_shape_are_left_out_not_raised_on(field, value):
    got = parse_host_figures(json.dumps({"host": "algo-2", field: value}), "algo-2")
    assert got is not None and got[field] == []


def test_numbers_too_large_for_a_training_job_are_no_figures():
    text = json.dumps({"host": "algo-2", "sampler_cpu_s": 1e308, "cores": 10 ** 400,
                       "ranks": [{"rank": 0, "steps": 50, "compute_ms": 1e308, "step_ms": 1e300, "backward_ms": 1e308,
                                  "compute_source": "DDP: step minus backward wait"}]})
    got = parse_host_figures(text, "algo-2")
    assert got["sampler_cpu_s"] is None and got["cores"] is None and got["ranks"][0]["compute_ms"] is None
    report = build_report("x", "algo-1", ("algo-1", "algo-2"), 0, {"algo-2": got}, [])
    json.dumps(report, allow_nan=False)
    build_summary_lines(report)


def test_the_figures_fit_the_port_as_carried_with_many_ranks():
    """The figures travel as a JSON string in the word, every quote escaped: that is what must fit."""
    figures, text = fit_figures("algo-2", points(64), {"end": 2000.0}, [rank_file(r, 64) for r in range(224)],
                                1.0, 96, 0.5, 60000)
    record = build_record(HostFigures("algo-2", text), time.time())
    assert len(build_signed_line(KEY, record).encode()) <= MAX_MESSAGE_BYTES


def test_restarts_are_counted_and_each_costs_from_its_failure_to_the_next_start():
    restarts = [{"attempt": 1, "exit_code": 137, "cause": "rank 1 on algo-2: SIGKILL", "failed": 100.0,
                 "next_started": 104.25},
                {"attempt": 2, "exit_code": 1, "cause": "ValueError: x", "failed": 200.0, "next_started": None}]
    report = build_report("torchrun on 2 host(s)", "algo-1", ("algo-1",), 1, {}, [], restarts)
    assert report["job"]["attempts"] == 3 and report["job"]["restarts_s"] == 4.25
    assert [r["restart_s"] for r in report["restarts"]] == [4.25, None]
    lines = [line for line in build_summary_lines(report) if "restart:" in line]
    assert lines == ["job report: restart: attempt 1 failed (exit code 137: rank 1 on algo-2: SIGKILL); attempt 2 "
                     "started 4.2 s later",
                     "job report: restart: attempt 2 failed (exit code 1: ValueError: x); no attempt 3 started"]
    json.dumps(report, allow_nan=False)
    plain = build_report("x", "algo-1", ("algo-1",), 0, {}, [])
    assert plain["job"]["attempts"] == 1 and plain["restarts"] == [] and plain["job"]["restarts_s"] == 0


def attempt_rank_file(r, attempt, first, last, steps, resumed, earlier=()):
    """A rank file as rank/step_figures.py writes it when the entrypoint restarts in place, as
    the host reads it (load_rank_files)."""
    import tempfile

    from entrypoint.jobreport.figures import load_rank_files

    data = {**rank_file(r, steps), "attempt": attempt, "first_step_at": first, "last_step_at": last,
            "resumed_step": resumed, "attempts": list(earlier),
            "series": {**rank_file(r, steps)["series"], "step_ms": [1000.0] * steps}}
    with tempfile.TemporaryDirectory() as folder:
        with open(f"{folder}/rank-{r}.json", "w") as f:
            json.dump(data, f)
        (loaded,), notes = load_rank_files(folder)
    assert notes == []
    return loaded


def test_each_failure_costs_the_time_to_the_next_first_step_and_its_steps_redone():
    """Attempt 1 steps from 100 s to 160 s (60 steps, from step 0) and fails at 161 s; attempt 2
    resumes from step 55 and makes its first step at 165 s: from step 55's end (155 s, at 1 s a
    step) to 165 s, 10 s of 200 s of training were lost; 4 s to the first step, 5 steps redone.
    The worker's figures cross the job port (fit, then parse) as the leader gets them."""
    first = {"attempt": 1, "first_step_at": 100.0, "last_step_at": 160.0, "steps": 60, "resumed_step": 0}
    leader = attempt_rank_file(0, 2, 165.0, 300.0, 135, 55, [first])
    worker = attempt_rank_file(1, 2, 165.5, 299.5, 134, 55, [{**first, "first_step_at": 100.5, "steps": 59}])
    _, text = fit_figures("algo-2", points(8), {"end": 300.0}, [worker], 1.0, 8, 0.1, 60000)
    hosts = {"algo-1": fit_figures("algo-1", points(8), {"end": 300.0}, [leader], 1.0, 8, 0.1, 60000)[0],
             "algo-2": parse_host_figures(text, "algo-2")}
    restarts = [{"attempt": 1, "exit_code": 137, "cause": "rank 1 on algo-2: SIGKILL", "failed": 161.0,
                 "next_started": 163.0}]
    report = build_report("torchrun on 2 host(s)", "algo-1", ("algo-1", "algo-2"), 0, hosts, [], restarts)
    (failure,) = report["restarts"]
    assert (failure["to_first_step_s"], failure["steps_redone"], failure["lost_s"]) == (4.0, 5, 10.0)
    assert (report["job"]["training_s"], report["job"]["lost_s"], report["job"]["efficiency"]) == (200.0, 10.0, 0.95)
    assert [(a["attempt"], a["reached"], a["resumed_step"]) for a in report["attempts"]] == [(1, 60, 0), (2, 190, 55)]
    lines = [line for line in build_summary_lines(report) if "restart:" in line or "efficiency" in line]
    assert lines == ["job report: restart: attempt 1 failed (exit code 137: rank 1 on algo-2: SIGKILL); attempt 2 "
                     "started 2.0 s later; 10.0 s lost (4.0 s to the next first step, at least 5 step(s) redone)",
                     "job report: efficiency 0.950: 10.0 s of 200.0 s of training lost to 1 failure(s)"]
    json.dumps(report, allow_nan=False)


def test_a_failure_whose_cost_the_figures_do_not_tell_leaves_the_efficiency_unknown():
    """No step after the restart (the next attempt failed before one), or a script that does
    not say where it resumed: what is known is given, the rest is None, never a made-up 1.0."""
    first = {"attempt": 1, "first_step_at": 100.0, "last_step_at": 160.0, "steps": 60, "resumed_step": None}
    ranks = [attempt_rank_file(0, 2, 165.0, 300.0, 135, None, [first])]
    hosts = {"algo-1": fit_figures("algo-1", points(8), {}, ranks, 1.0, 8, 0.1, 60000)[0]}
    restarts = [{"attempt": 1, "exit_code": 1, "cause": "x", "failed": 161.0, "next_started": 163.0},
                {"attempt": 2, "exit_code": 1, "cause": "y", "failed": 301.0, "next_started": 302.0}]
    report = build_report("torchrun", "algo-1", ("algo-1",), 1, hosts, [], restarts)
    assert [(r["to_first_step_s"], r["steps_redone"], r["lost_s"]) for r in report["restarts"]] == [
        (4.0, None, None), (None, None, None)]
    assert report["job"]["efficiency"] is None and report["job"]["training_s"] == 200.0
    plain = build_report("x", "algo-1", ("algo-1",), 0, {"algo-1": fit_figures(
        "algo-1", points(8), {}, [attempt_rank_file(0, 1, 10.0, 20.0, 10, 0)], 1.0, 8, 0.1, 60000)[0]}, [])
    assert plain["job"]["efficiency"] == 1.0 and plain["job"]["lost_s"] == 0
    # torchrun's own restarts on one host (TORCHELASTIC_RESTART_COUNT): no failure time to cost them by
    local = attempt_rank_file(0, 1, 10.0, 20.0, 10, 0)
    local = {**local, "local_restarts": 1}
    itself = build_report("x", "algo-1", ("algo-1",), 0, {"algo-1": fit_figures(
        "algo-1", points(8), {}, [local], 1.0, 8, 0.1, 60000)[0]}, [])
    assert itself["job"]["efficiency"] is None
    assert any(n.startswith("torchrun restarted ranks itself") for n in itself["notes"]), itself["notes"]


@pytest.mark.parametrize("attempts", [
    "not a list", [1, "x", None], [{"attempt": float("nan")}, {"attempt": True}, {"attempt": 0}, {"attempt": -3}],
    [{"attempt": 1, "first_step_at": float("inf"), "last_step_at": "soon", "steps": 1e300, "resumed_step": [1]}],
    [{"attempt": 1, "first_step_at": 0.0, "last_step_at": 1e12, "steps": -7, "resumed_step": -3, "reached": -1e12},
     {"attempt": 2, "first_step_at": 16.0, "last_step_at": 17.0, "steps": 1, "resumed_step": 1e12}],
    [{"attempt": n, "first_step_at": float(n), "last_step_at": n + 0.5, "steps": 1, "resumed_step": 0}
     for n in range(1, 5000)],
])
def test_hostile_attempts_from_a_worker_are_cleaned_and_bounded(attempts):
    """A worker's word may hold anything: an attempt is a whole number from 1, every figure a
    finite number or None, at most MAX_ATTEMPTS of them, and the report stays valid JSON."""
    from entrypoint.jobreport.figures import MAX_ATTEMPTS

    figures, _ = fit_figures("algo-2", points(4), {}, [attempt_rank_file(1, 1, 10.0, 20.0, 10, 0)], 1.0, 8, 0.1, 60000)
    parsed = parse_host_figures(json.dumps({**figures, "attempts": attempts}), "algo-2")
    assert len(parsed["attempts"]) <= MAX_ATTEMPTS
    for a in parsed["attempts"]:
        assert isinstance(a["attempt"], int) and a["attempt"] >= 1
        assert all(v is None or (isinstance(v, (int, float)) and math.isfinite(v)) for v in a.values())
    restarts = [{"attempt": 1, "exit_code": 1, "cause": "x", "failed": 15.0, "next_started": 16.0}]
    ranks = [{**r, "step_ms": -5.0} for r in parsed["ranks"]]  # a worker's word: any number
    report = build_report("x", "algo-1", ("algo-2",), 0, {"algo-2": {**parsed, "ranks": ranks}}, [], restarts)
    json.dumps(report, allow_nan=False)
    assert report["job"]["efficiency"] is None or 0.0 <= report["job"]["efficiency"] <= 1.0


RANK_ATTEMPT = """import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("byoc_rank_figures", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
module.start(os.environ, module)
module.set_resumed_step(int(sys.argv[2]))
for _ in range(int(sys.argv[3])):
    module._figures.on_step_end()
"""


def test_a_ranks_file_keeps_each_earlier_attempts_summary_for_the_report(tmp_path):
    """The real writer (rank/step_figures.py, in a process of its own as in a rank): attempt 2's
    rank finds attempt 1's file and keeps its summary; a rank of the same attempt started again
    (torchrun's own restart on one host) does not count it twice. Written at exit."""
    import subprocess
    import sys

    from entrypoint.jobreport.figures import load_rank_files
    from support.jobtree import REPO

    writer = str(REPO / "entrypoint" / "rank" / "step_figures.py")
    for attempt, resumed, steps in (("1", 0, 6), ("2", 4, 3), ("2", 4, 5)):
        env = {"BYOC_REPORT_DIR": str(tmp_path), "RANK": "3", "BYOC_ATTEMPT": attempt, "PATH": "/usr/bin:/bin"}
        subprocess.run([sys.executable, "-c", RANK_ATTEMPT, writer, str(resumed), str(steps)], env=env, check=True)
    (rank,), notes = load_rank_files(str(tmp_path))
    assert notes == []
    assert [(a["attempt"], a["steps"], a["resumed_step"]) for a in rank["attempts"]] == [(1, 6, 0), (2, 5, 4)]
    assert all(a["first_step_at"] <= a["last_step_at"] for a in rank["attempts"])


@pytest.mark.parametrize("seen_after_failure_s, expected_lost_s", [
    (-2.0, 7.5),   # the last figures 2 s before the failure, 1 step (0.5 s) redone: 5 + 2 + 0.5
    (0.0, 5.5),    # at the failure: 5 s to the first step, plus the step redone
    (0.25, 5.25),  # a surviving rank's step seen just after it: the step redone still ends by then
    (2.0, 5.0),    # far after (slower steps than the median): never less than failure to first step
])
def test_the_time_a_failure_lost_is_never_less_than_the_failure_to_the_next_first_step(seen_after_failure_s,
                                                                                    expected_lost_s):
    """build_failure_costs: the resumed step was done no later than the failure, whatever the
    figures say (a loaded mpirun job's surviving rank finished a step 0.25 s after its peer died:
    lost_s 13.98 < to_first_step_s 14.23)."""
    from entrypoint.jobreport.build import build_failure_costs

    failed = 1000.0
    restarts = [{"attempt": 1, "exit_code": 137, "cause": "x", "failed": failed, "next_started": failed + 1}]
    attempts = [{"attempt": 1, "last_step_at": failed + seen_after_failure_s, "reached": 41},
                {"attempt": 2, "first_step_at": failed + 5.0, "resumed_step": 40}]
    (cost,) = build_failure_costs(restarts, attempts, step_ms=500.0)
    assert cost["to_first_step_s"] == 5.0 and cost["steps_redone"] == 1
    assert cost["lost_s"] == pytest.approx(expected_lost_s) and cost["lost_s"] >= cost["to_first_step_s"]


def test_a_streaming_tools_readings_are_read_by_the_sampler_without_a_thread_of_their_own(tmp_path):
    """nvidia-smi --loop-ms as the sampler reads it (accelerators.StreamingTool): whole lines only,
    in order, the reading complete at the next GPU 0; a line cut in two waits for its end; stop
    ends the tool and leaves no thread behind."""
    import select
    import sys
    import threading

    tool_script = tmp_path / "nvidia-smi.py"
    tool_script.write_text("import sys, time\n"
                           "sys.stdout.write('0, 10, 100, 50.5\\n1, 20, 200, [N/A]\\n0, 30, 300, 70\\n1, 4')\n"
                           "sys.stdout.flush()\n"
                           "time.sleep(3600)\n")
    threads = threading.active_count()
    tool = accelerators.StreamingTool([sys.executable, str(tool_script)], accelerators.GpuReadings().take)
    try:
        assert threading.active_count() == threads
        fd = tool.proc.stdout.fileno()
        while tool._partial != b"1, 4":  # the tool's whole output, waited for on its pipe
            select.select([fd], [], [])
            tool.read_available()
        assert tool.latest == [{"util": 10.0, "mem_mb": 100.0, "power_w": 50.5},
                               {"util": 20.0, "mem_mb": 200.0, "power_w": None}]
        assert tool._partial == b"1, 4"  # the cut line waits for its end
    finally:
        tool.stop()
    assert tool.proc.returncode is not None


def test_the_live_view_ticks_on_the_samplers_thread_until_it_is_detached():
    """The job report's one thread (sampler.HostSampler): it samples and ticks the live view
    once attached (live/loop.LiveLoop.start); detach waits for a tick under way, and no tick
    comes after it."""
    import threading

    from entrypoint.jobreport.sampler import HostSampler

    class StandInLive:
        tick_s = 0.01

        def __init__(self):
            self.threads, self.third = [], threading.Event()

        def tick(self):
            self.threads.append(threading.current_thread().name)
            if len(self.threads) == 3:
                self.third.set()

    sampler, live = HostSampler(0.02, os.getpid()).start(), StandInLive()
    try:
        sampler.attach(live)
        assert live.third.wait(600)  # a failsafe, not a measure: the ticks come on their own
        sampler.detach(live)
        ticks = len(live.threads)
        sampler.mark("after the detach")
        assert set(live.threads) == {"byoc-report-sampler"}
        points_before = len(sampler.snapshot()[0])
        while len(sampler.snapshot()[0]) < points_before + 2:  # it goes on sampling, without ticks
            time.sleep(0.01)
        assert len(live.threads) == ticks
    finally:
        sampler.stop()

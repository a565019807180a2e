"""The deep health check (BYOC_HEALTH_CHECK=deep): settings, the plan (golden argv), the
verdict's words (pure); then its mechanics for real with gloo on CPU: one host through the
entrypoint (a failing and a passing check), and two hosts' ranks on the loopback. The GPU
figures (nccl) are checked by scripts/gpu_smoke.py --deep on a GPU machine."""

import json
import os
import socket
import subprocess

import pytest

from entrypoint.cli import render_plan
from entrypoint.decide import health
from entrypoint.decide.plan import LaunchPlan
from entrypoint.decide.settings import parse_launch_settings
from entrypoint.errors import JobDefinitionError
from support.jobs import CPU, GPU4, GPU8_EFA, PY, TRN1_EFA, make_job, plan_for
from support.jobtree import PYTHON, failure_text, run_entrypoint, write_tree
from support.ports import free_port

TORCH = {"sagemaker_torch_distributed_enabled": True}
MPI2 = {"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2}
DEEP = {"BYOC_HEALTH_CHECK": "deep"}
P5 = {"current_instance_type": "ml.p5.48xlarge"}


# --- settings and the plan (pure) -----------------------------------------------------------


def test_the_check_is_off_unless_asked_for_and_its_settings_are_checked():
    assert parse_launch_settings({}).health_check == ""
    assert parse_launch_settings({"BYOC_HEALTH_CHECK": "off"}).health_check == ""
    on = parse_launch_settings({"BYOC_HEALTH_CHECK": "Deep", "BYOC_MASTER_PORT": "29400"})
    assert (on.health_check, on.health_check_port, on.health_check_min_fraction) == ("deep", 29402, 0.5)
    for bad in ({"BYOC_HEALTH_CHECK": "quick"}, {"BYOC_HEALTH_CHECK_MIN_FRACTION": "1.5"},
                {"BYOC_HEALTH_CHECK_MIB": "0"}, {"BYOC_HEALTH_CHECK_TIMEOUT_S": "soon"}):
        with pytest.raises(JobDefinitionError, match=next(iter(bad))):
            parse_launch_settings(bad)
    assert plan_for(make_job(hps=TORCH), GPU4).health_check is None


def test_bus_bandwidth_is_nccl_tests_all_reduce_definition():
    """busbw = algbw x 2(n-1)/n, GB/s of 10^9 bytes (nccl-tests doc/PERFORMANCE.md)."""
    assert health.build_bus_gbps(10**9, 1.0, 8) == pytest.approx(1.75)
    assert health.build_bus_gbps(10**9, 0.5, 2) == pytest.approx(2.0)
    assert health.build_bus_gbps(10**9, 1.0, 1) == 0.0


def test_one_gpu_host_runs_one_nccl_rank_per_gpu_and_expects_the_instance_types_figure():
    plan = plan_for(make_job(hps=TORCH, resource_extra=P5, environ=DEEP), GPU8_EFA)
    check = plan.health_check
    assert (check.backend, check.hosts, check.expected_host_gbps, check.min_fraction) == ("nccl", ("algo-1",), 450.0, 0.5)
    assert [p.name for p in check.processes] == [f"health-check{i}" for i in range(8)]
    assert check.processes[3].argv == (PY, health.ALLREDUCE_CHECK, "--backend", "nccl", "--mib", "1024", "--warmup", "5",
                                       "--iterations", "20", "--timeout-s", "600",
                                       "--result", "/tmp/byoc/health-check.json")
    assert dict(check.processes[3].env) == {"RANK": "3", "LOCAL_RANK": "3", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8",
                                            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "7779"}
    assert any(n.startswith("deep health check") and "450 GB/s" in n for n in plan.notes)


@pytest.mark.parametrize("hps", [TORCH, {"sagemaker_mpi_enabled": True}])
def test_every_host_of_a_distributed_launch_checks_together_on_the_leaders_port(hps):
    """algo-2's ranks are 8..15 of 16, on algo-1's port: an MPI worker takes part too."""
    job = make_job(hosts=("algo-1", "algo-2"), current="algo-2", hps=hps, resource_extra=P5,
                   environ={**DEEP, "BYOC_HEALTH_CHECK_PORT": "29500"})
    check = plan_for(job, GPU8_EFA).health_check
    assert check.hosts == ("algo-1", "algo-2") and (check.expected_host_gbps, check.expected_job_gbps) == (450, 400)
    assert [dict(p.env)["RANK"] for p in check.processes] == [str(r) for r in range(8, 16)]
    assert {(dict(p.env)["MASTER_ADDR"], dict(p.env)["MASTER_PORT"], dict(p.env)["WORLD_SIZE"])
            for p in check.processes} == {("algo-1", "29500", "16")}


def test_a_host_without_a_launcher_checks_alone_and_some_hosts_run_nothing():
    alone = plan_for(make_job(hosts=("algo-1", "algo-2"), current="algo-2", environ=DEEP), GPU4).health_check
    assert alone.hosts == ("algo-2",) and alone.expected_host_gbps is None  # no type in the table: reported only
    trn = plan_for(make_job(hps=TORCH, environ=DEEP), TRN1_EFA)
    assert trn.health_check is None and any("nccom-test" in n for n in trn.notes)
    cpu = plan_for(make_job(hps=TORCH, environ=DEEP), CPU)
    assert cpu.health_check is None and any("one process on one host" in n for n in cpu.notes)


def test_the_jobs_own_expected_figures_win_and_dry_run_shows_the_check():
    job = make_job(hps=TORCH, resource_extra=P5, environ={**DEEP, "BYOC_HEALTH_CHECK_HOST_GBPS": "300"})
    plan: LaunchPlan = plan_for(job, GPU8_EFA)
    assert plan.health_check.expected_host_gbps == 300.0 and "BYOC_HEALTH_CHECK_HOST_GBPS" in plan.health_check.source
    shown = json.loads(render_plan(plan, {}))["health_check"]
    assert (shown["backend"], shown["ranks_per_host"], shown["expected_host_gbps"]) == ("nccl", 8, 300.0)
    assert len(shown["processes"]) == 8 and shown["processes"][0]["argv"][1] == health.ALLREDUCE_CHECK
    assert "health_check" not in json.loads(render_plan(plan_for(make_job(hps=TORCH), GPU8_EFA), {}))


# --- the verdict (pure) ---------------------------------------------------------------------------


def two_host_check(**environ):
    job = make_job(hosts=("algo-1", "algo-2"), hps=TORCH, resource_extra=P5, environ={**DEEP, **environ})
    return plan_for(job, GPU8_EFA).health_check


def result(host_seconds, job_seconds, correct=True):
    """Timings of a 1 GiB all-reduce: 8 ranks per host, 16 in all."""
    return {"bytes": 2**30, "host": [{"ranks": 8, "seconds": s, "correct": correct} for s in host_seconds],
            "job": {"ranks": 16, "seconds": job_seconds, "correct": True}}


def test_a_slow_host_fails_every_host_naming_it_its_figures_and_the_fix():
    check = two_host_check()
    # 2^30 B in 4 ms: 268 GB/s algbw, 470 GB/s busbw over 8 ranks; in 40 ms, 47 GB/s.
    figures = health.build_figures(check, result([0.004, 0.040], 0.006))
    assert [round(f.bus_gbps) for f in figures] == [470, 47, 336]
    assert health.build_health_failure(check, health.build_figures(check, result([0.004, 0.004], 0.006)), "algo-1") is None
    on_bad = health.build_health_failure(check, figures, "algo-2")
    on_good = health.build_health_failure(check, figures, "algo-1")
    first = on_bad.splitlines()[0]
    assert "failed on host(s) algo-2 (within algo-2: 47.0 GB/s, below 0.5 x 450 GB/s)" in first
    assert "this host is one of them" in first and "this host (algo-1) passed" in on_good.splitlines()[0]
    assert "within algo-1: 469.8 GB/s" in on_bad and "TOO LOW" in on_bad and "ml.p5.48xlarge" in on_bad
    assert "run the job again" in on_bad and "nccl-tests" in on_bad and "EFA" not in on_bad


def test_a_slow_network_or_a_wrong_sum_fails_with_its_own_fix():
    check = two_host_check(BYOC_HEALTH_CHECK_MIN_FRACTION="0.8")
    slow = health.build_health_failure(check, health.build_figures(check, result([0.004, 0.004], 0.03)), "algo-1")
    assert "failed on the network between the 2 hosts (across 2 hosts: 67.1 GB/s, below 0.8 x 400 GB/s)" in slow
    assert "AWS Libfabric" in slow
    wrong = health.build_health_failure(check, health.build_figures(check, result([0.004, 0.004], 0.006, False)), "algo-1")
    assert "within algo-1: sums wrong" in wrong


# --- real processes: gloo on CPU --------------------------------------------------------------


def run_checked_job(tmp_path, **environ):
    """One host, mpirun with 2 processes per host: 2 gloo ranks in the check. The host is this
    machine's own name, so that mpirun starts the ranks here, not over SSH."""
    host = socket.gethostname()
    root = write_tree(tmp_path / "ml", hosts=(host,), current_host=host, hyperparameters=MPI2,
                      script="open('trained', 'w').close()\n")
    env = {**DEEP, "BYOC_HEALTH_CHECK_MIB": "1", "BYOC_HEALTH_CHECK_PORT": str(free_port()),
           "BYOC_RUNTIME_DIR": str(tmp_path / "run"), **environ}
    return root, run_entrypoint(root, **env)


def test_a_failing_check_ends_the_job_before_the_training_with_the_figures(tmp_path):
    root, done = run_checked_job(tmp_path, BYOC_HEALTH_CHECK_HOST_GBPS="1000000")
    assert done.returncode == 2, done.stderr[-3000:]
    text = failure_text(root)
    host = socket.gethostname()
    assert text.startswith(f"Deep health check (BYOC_HEALTH_CHECK=deep) failed on host(s) {host} (within {host}: ")
    assert "GB/s bus bandwidth over 2 ranks" in text and "The fix:" in text
    assert not (root / "code/trained").exists()  # the training never started


def test_a_passing_check_logs_its_figure_then_the_training_runs(tmp_path):
    root, done = run_checked_job(tmp_path, BYOC_HEALTH_CHECK_HOST_GBPS="0.000001")
    assert done.returncode == 0, done.stderr[-3000:]
    host = socket.gethostname()
    assert f"{host}: deep health check: within {host}: " in done.stderr and ": OK" in done.stderr
    assert "deep health check: passed" in done.stderr
    assert (root / "code/trained").exists() and (root / "output/success").exists()


def test_two_hosts_ranks_meet_on_the_leaders_port_and_judge_every_host_alike(tmp_path):
    """Two hosts of two gloo ranks each on the loopback, as the plan starts them (the leader's
    address given as 127.0.0.1): each host's figure and the one across hosts, on both hosts."""
    port = str(free_port())
    checks = {}
    procs = []
    for host in ("algo-1", "algo-2"):
        job = make_job(hosts=("algo-1", "algo-2"), current=host, hps=MPI2, environ={**DEEP, "BYOC_HEALTH_CHECK_MIB": "1"})
        plan = plan_for(job, CPU)
        check = health.build_health_check(plan.settings._replace(health_check_port=int(port)), PYTHON, "local",
                                          plan.health_check.hosts, host, "127.0.0.1", 2, False, str(tmp_path / host))
        os.makedirs(tmp_path / host)
        checks[host] = check
        procs += [subprocess.Popen(p.argv, env={**os.environ, **dict(p.env)}, stderr=subprocess.PIPE, text=True)
                  for p in check.processes]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, errors
    verdicts = []
    for host, check in checks.items():
        with open(check.result_file) as f:
            timings = json.load(f)
        assert (timings["hosts"], timings["ranks_per_host"], timings["bytes"]) == (2, 2, 2**20)
        figures = health.build_figures(check, timings)
        assert [(f.what, f.ranks, f.correct) for f in figures] == [
            ("within algo-1", 2, True), ("within algo-2", 2, True), ("across 2 hosts", 4, True)]
        assert all(f.bus_gbps > 0 for f in figures)
        assert health.build_health_failure(check, figures, host) is None  # no expected figure: not judged
        strict = check._replace(expected_host_gbps=1e6)
        verdicts.append(health.build_health_failure(strict, health.build_figures(strict, timings), host))
    assert verdicts[0] == verdicts[1]  # the same words on every host
    assert verdicts[0].startswith("Deep health check (BYOC_HEALTH_CHECK=deep) failed on host(s) algo-1, algo-2 ")


def test_gpu_smoke_deep_runs_the_entrypoints_check(monkeypatch):
    """scripts/gpu_smoke.py --deep runs this very check (nccl there; gloo and one rank here)."""
    import importlib.util
    import types

    from support.jobtree import REPO

    spec = importlib.util.spec_from_file_location("gpu_smoke", REPO / "scripts" / "gpu_smoke.py")
    smoke = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(smoke)
    build = health.build_health_check
    monkeypatch.setattr(health, "build_health_check", lambda *a: build(*a[:7], False, a[8]))
    deep, problems = smoke.run_deep_check(1, types.SimpleNamespace(instance_type="ml.p5.48xlarge", mib=1, timeout=60))
    assert problems == [] and deep["timings"]["host"][0]["correct"] and deep["expected_host_gbps"] == 450.0
    assert deep["figures"] == ["within this-host: one rank, nothing crosses a link (bus bandwidth 0 by definition): "
                               "not judged"]

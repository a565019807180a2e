"""Restarts in place across hosts (BYOC_MAX_RESTARTS) with torchrun, the launcher most jobs
use, through the real entrypoint on 2 and 3 emulated hosts (roles/attempts.py): a rank
SIGKILLed once on a worker host or on the leader's, a crash during the restart itself, and a
stop during a restart. The script (scripts/restart_job.py) checkpoints every 10 steps and
resumes from its checkpoint: a restarted job ends with the same total as one that never
failed, every rank of the last attempt met only peers of that attempt, and every host exits 0.

BYOC_RESTART_REPEATS (default 1) runs each kill case that many times in a row (scripts/
check-restarts.sh runs them 20 times each before a release)."""

import json
import os
import signal
import time

import pytest

from localcluster import EmulatedCluster
from support.multihost import assert_nothing_left, failure, job, needs_root, start

pytestmark = [needs_root, pytest.mark.slow]

REPEATS = int(os.environ.get("BYOC_RESTART_REPEATS", "1"))
STEPS, EVERY = 60, 10


def expected_total(world: int, steps: int = STEPS) -> float:
    """sum over steps s and ranks r of (r + 1 + s): what every rank's running total ends at."""
    return steps * world * (world + 1) / 2 + world * steps * (steps - 1) / 2


def run_restart_job(hosts, hps, restarts=1, inject=None):
    with EmulatedCluster(hosts, job("restart_job.py", "torch_distributed", steps=STEPS, every=EVERY, **hps)) as cluster:
        run = start(cluster, env={"BYOC_MAX_RESTARTS": str(restarts)})
        if inject is not None:
            inject(cluster, run)
        result = run.wait(timeout=240, fail_fast=False)
        assert_nothing_left(cluster)
        results = {}
        for name in os.listdir(cluster.model_dir):
            if name.startswith("result-"):
                with open(os.path.join(cluster.model_dir, name)) as f:
                    results[name] = json.load(f)
        report_path = os.path.join(cluster.opt_ml(hosts[0]), "output", "data", "report", "report.json")
        report = json.load(open(report_path)) if os.path.exists(report_path) else None
        failures = {h: failure(cluster, h) for h in hosts
                    if os.path.exists(os.path.join(cluster.opt_ml(h), "output", "failure"))}
        return result, results, report, failures


def logs(result) -> str:
    return "\n\n".join(f"{h}:\n{r.output[-4000:]}" for h, r in result.results.items())


def assert_restarted_once_and_finished(hosts, result, results, report, last_attempt=2):
    for host, r in result.results.items():
        assert r.returncode == 0, logs(result)
    world = len(hosts)
    assert sorted(results) == [f"result-{r}.json" for r in range(world)], logs(result)
    for got in results.values():
        # Every rank of the last attempt: the whole world, that attempt's, resumed from a
        # checkpoint, and the same total as a run that never failed.
        assert (got["size"], got["attempt"]) == (world, last_attempt), got
        assert got["resumed_at"] > 0 and got["resumed_at"] % EVERY == 0, got
        assert got["total"] == expected_total(world), got
    leader_log = result.results[hosts[0]].output
    assert "restart 1 of " in leader_log and f"torchrun on {world} host(s) exited with code" in leader_log, leader_log
    assert "every host's processes of attempt 1 are gone: starting attempt 2" in leader_log, leader_log
    for host in hosts[1:]:
        assert f"{host}: the leader starts attempt 2" in result.results[host].output, logs(result)
    assert report is not None and report["job"]["attempts"] == last_attempt, report and report["job"]
    first = report["restarts"][0]
    assert first["attempt"] == 1 and first["restart_s"] is not None and first["restart_s"] > 0, report["restarts"]
    names = [p["name"] for p in report["phases"] if p["host"] == hosts[0]]
    failed = [n for n in names if n.startswith("attempt 1 failed (exit code ")]
    assert failed and names.index(failed[0]) < names.index("attempt 2 started"), names


@pytest.mark.parametrize("hosts", [["algo-1", "algo-2"], ["algo-1", "algo-2", "algo-3"]], ids=["2-hosts", "3-hosts"])
@pytest.mark.parametrize("victim", ["worker", "leader"])
def test_a_rank_killed_once_is_restarted_on_every_host_and_the_job_succeeds(hosts, victim):
    for _ in range(REPEATS):
        result, results, report, _ = run_restart_job(hosts, {"kill": victim})
        assert_restarted_once_and_finished(hosts, result, results, report)


HELD = "torchrun of attempt 2 started ahead, held until that attempt starts"
HELD_LINE = "torchrun of attempt 2: the one started ahead runs now (its imports done)"


def test_a_restart_past_the_attempts_start_up_runs_the_torchrun_each_host_started_ahead():
    """A crash after the attempt's start-up (settings.held_start_after_s, 10 s): each host had
    started attempt 2's torchrun during attempt 1, which imported torch and waited (run/held.py);
    the restart runs it, and the job ends as one restarted with fresh processes does."""
    hosts = ["algo-1", "algo-2"]
    result, results, report, _ = run_restart_job(hosts, {"kill": "worker", "step-s": 0.5})
    assert_restarted_once_and_finished(hosts, result, results, report)
    for host in hosts:
        out = result.results[host].output
        assert out.count(HELD) == 1 and out.count(HELD_LINE) == 1, logs(result)
        assert out.index(HELD) < out.index(HELD_LINE), logs(result)


def test_a_torchrun_started_ahead_that_no_attempt_needs_is_ended_with_the_job():
    """No failure: attempt 2's torchrun, started ahead and held, is never run; the job succeeds
    and nothing of it is left on any host (run_restart_job checks)."""
    hosts = ["algo-1", "algo-2"]
    result, results, report, _ = run_restart_job(hosts, {"kill": "none", "step-s": 0.3})
    assert all(r.returncode == 0 for r in result.results.values()), logs(result)
    assert sorted(results) == ["result-0.json", "result-1.json"] and report["job"]["attempts"] == 1
    for r in result.results.values():  # started ahead on each host, never run
        assert r.output.count(HELD) == 1 and HELD_LINE not in r.output, logs(result)
        assert "starting attempt 2" not in r.output and "the leader starts attempt 2" not in r.output, logs(result)


def test_a_stop_while_a_torchrun_is_held_ends_it_with_the_job():
    """SIGTERM to every host once each holds attempt 2's torchrun: the job stops on every host,
    no attempt 2 runs, and no held process is left (run_restart_job checks)."""
    hosts = ["algo-1", "algo-2"]

    def stop_once_held(cluster, run):
        while not all(HELD in run.procs[h].output for h in hosts):
            assert all(code is None for code in run.exit_codes().values()), logs_of(run)
            time.sleep(0.05)
        run.signal(signal.SIGTERM)

    result, results, _, failures = run_restart_job(hosts, {"kill": "none", "step-s": 0.3}, inject=stop_once_held)
    assert all(r.returncode != 0 for r in result.results.values()), logs(result)  # torchrun's own code
    assert results == {} and all(HELD_LINE not in r.output for r in result.results.values()), logs(result)
    for host in hosts:
        assert failures[host].startswith("Training was stopped by SIGTERM"), failures[host][:600]


def logs_of(run) -> str:
    return "\n\n".join(f"{h}:\n{p.output[-3000:]}" for h, p in run.procs.items())


def test_a_crash_during_the_restart_is_restarted_again():
    """The killed rank's host crashes again as attempt 2 starts, before its first step: a
    third attempt (BYOC_MAX_RESTARTS=2) runs through."""
    hosts = ["algo-1", "algo-2"]
    result, results, report, _ = run_restart_job(hosts, {"kill": "worker", "kill-again": 1}, restarts=2)
    assert_restarted_once_and_finished(hosts, result, results, report, last_attempt=3)
    assert "every host's processes of attempt 2 are gone: starting attempt 3" in result.results["algo-1"].output


def test_a_crash_during_the_restart_with_no_restart_left_fails_naming_both():
    hosts = ["algo-1", "algo-2"]
    result, results, report, failures = run_restart_job(hosts, {"kill": "worker", "kill-again": 1}, restarts=1)
    assert all(r.returncode != 0 for r in result.results.values()), logs(result)
    assert results == {}
    assert "The job was restarted 1 time(s) before this failure (BYOC_MAX_RESTARTS)" in failures["algo-1"], failures
    assert report["job"]["attempts"] == 2 and report["job"]["exit_code"] != 0, report["job"]


def test_a_stop_during_a_restart_stops_the_job_and_starts_no_attempt():
    """The worker's rank dies; the leader's is stuck in its teardown, so attempt 1 ends on the
    leader only with the entrypoint's SIGKILL, and the worker waits for the leader's word
    meanwhile: SIGTERM to every host then. No host starts attempt 2; each ends as stopped."""
    hosts = ["algo-1", "algo-2"]

    def stop_while_waiting(cluster, run):
        worker = run.procs["algo-2"]
        assert worker.wait_for_text("waiting for the leader's word on a restart", 300), worker.output[-3000:]
        run.signal(signal.SIGTERM)

    result, results, _, failures = run_restart_job(hosts, {"kill": "worker", "slow-end": 1},
                                                   inject=stop_while_waiting)
    # The leader's stuck rank is SIGKILLed when the grace period ends (137); the worker's were gone.
    assert [r.returncode for r in result.results.values()] == [137, 143], logs(result)
    assert results == {}
    # Attempt 2's torchrun may be started ahead and held (run/held.py: 10 s into attempt 1, which a
    # loaded machine reaches): held, it starts no attempt; it must never be told to run.
    leader = result.results["algo-1"].output
    said = [line for line in leader.splitlines() if "attempt 2" in line
            and "before attempt 2 started" not in line and "started ahead, held until that attempt starts" not in line]
    assert said == [] and "the one started ahead runs now" not in leader, logs(result)
    assert failures["algo-2"].startswith("Stopped by SIGTERM before attempt 2 started"), failures["algo-2"][:600]


@pytest.mark.parametrize("host", ["algo-2", "algo-1"])
def test_a_parameter_server_job_whose_worker_fails_once_is_restarted_on_every_host(host):
    """The parameter-server launch restarts the same way: every host's shard and workers of
    attempt 1 gone, then attempt 2's, whose RPC group forms and ends; every host exits 0."""
    hosts = ["algo-1", "algo-2"]
    spec = job("ps_job.py", "parameter_server", **{"fail-once-on": host})
    with EmulatedCluster(hosts, spec) as cluster:
        result = start(cluster, env={"BYOC_MAX_RESTARTS": "1"}).wait(timeout=240, fail_fast=False)
        assert_nothing_left(cluster)
        done = sorted(n for n in os.listdir(cluster.model_dir) if n.startswith("done-"))
    assert all(r.returncode == 0 for r in result.results.values()), logs(result)
    assert done == ["done-0-2", "done-1-2"], (done, logs(result))
    assert "every host's processes of attempt 1 are gone: starting attempt 2" in result.results["algo-1"].output

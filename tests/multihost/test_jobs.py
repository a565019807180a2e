"""Multi-host jobs through the real entrypoint on emulated hosts (no mocks)."""

import json
import os

import pytest

from support.multihost import ENTRYPOINT, FAST, assert_nothing_left, failure, job, needs_root, start
from localcluster import EmulatedCluster
from localcluster.optml import InstanceGroupSpec, JobSpec

pytestmark = [needs_root, pytest.mark.slow]


def ranks(model_dir):
    found = [json.load(open(os.path.join(model_dir, n))) for n in os.listdir(model_dir) if n.startswith("rank-")]
    return sorted(found, key=lambda r: r["rank"])


def test_mpirun_over_ssh_two_hosts_ranks_see_their_own_host():
    spec = JobSpec(**{**job("mpi_job.py", "mpi").__dict__, "processes_per_host": 2})
    with EmulatedCluster(["algo-1", "algo-2"], spec) as cluster:
        result = cluster.run_all(ENTRYPOINT, env=FAST, timeout=120)
        assert result.ok, {h: r.output[-3000:] for h, r in result.results.items()}
        assert [(r["rank"], r["host"], r["sm_current_host"], r["sum"]) for r in ranks(cluster.model_dir)] == [
            (0, "algo-1", "algo-1", 10), (1, "algo-1", "algo-1", 10), (2, "algo-2", "algo-2", 10), (3, "algo-2", "algo-2", 10),
        ]
        for host in cluster.host_names:
            assert os.path.exists(os.path.join(cluster.opt_ml(host), "output", "success"))
        assert_no_internal_line(result)
        assert_nothing_left(cluster)


def assert_no_internal_line(result) -> None:
    """No event went unhandled and no handler raised (entrypoint/loop/: each is logged as
    `internal`), on any host of a job that went as it should."""
    said = {h: [line for line in r.output.splitlines() if "[entrypoint] internal" in line]
            for h, r in result.results.items()}
    assert not any(said.values()), said


def test_a_shell_script_rank_sees_its_own_hosts_values_as_a_python_rank_does():
    """Issue 33, case 9: mpirun forwards the leader's SM_* values; the rank wrapper lays each
    host's own over them, now for a shell script too (record_errors.py --exec)."""
    spec = JobSpec(**{**job("host_env.sh", "mpi").__dict__, "processes_per_host": 1})
    with EmulatedCluster(["algo-1", "algo-2"], spec) as cluster:
        result = cluster.run_all(ENTRYPOINT, env=FAST, timeout=120)
        assert result.ok, {h: r.output[-3000:] for h, r in result.results.items()}
        seen = {}
        for rank in (0, 1):
            with open(os.path.join(cluster.model_dir, f"shell-rank-{rank}")) as f:
                seen[rank] = f.read().split()
        assert seen == {0: ["algo-1", "algo-1"], 1: ["algo-2", "algo-2"]}


def test_mpi_worker_collects_orphans_while_the_job_runs_and_a_success_logs_no_error():
    """On an MPI worker host the entrypoint is the ranks' subreaper (orted leaves its SSH
    session): an orphan that exits is collected during the run, not left defunct until the
    job ends. And a successful job's leader logs no error about telling the workers."""
    base = job("mpi_job.py", "mpi", **{"orphan-check": 1})
    with EmulatedCluster(["algo-1", "algo-2"], base) as cluster:
        result = cluster.run_all(ENTRYPOINT, env=FAST, timeout=120)
        assert result.ok, {h: r.output[-3000:] for h, r in result.results.items()}
        states = {}
        for rank in (0, 1):
            with open(os.path.join(cluster.model_dir, f"orphan-{rank}")) as f:
                states[rank] = f.read()
        assert states == {0: "gone", 1: "gone"}
        assert "could not tell" not in result.results["algo-1"].output


def test_torchrun_two_hosts_gloo_allreduce():
    with EmulatedCluster(["algo-1", "algo-2"], job("torch_job.py", "torch_distributed")) as cluster:
        result = cluster.run_all(ENTRYPOINT, env=FAST, timeout=180)
        assert result.ok, {h: r.output[-3000:] for h, r in result.results.items()}
        assert [(r["rank"], r["host"], r["sum"]) for r in ranks(cluster.model_dir)] == [(0, "algo-1", 3.0), (1, "algo-2", 3.0)]
        assert_nothing_left(cluster)


def test_three_hosts_whose_names_sort_out_of_numeric_order():
    """SageMaker lists algo-1, algo-10, algo-2: rank order follows that list, never the number."""
    with EmulatedCluster(["algo-2", "algo-10", "algo-1"], job("mpi_job.py", "mpi")) as cluster:
        result = cluster.run_all(ENTRYPOINT, env=FAST, timeout=120)
        assert result.ok, {h: r.output[-3000:] for h, r in result.results.items()}
        assert [(r["rank"], r["host"]) for r in ranks(cluster.model_dir)] == [(0, "algo-1"), (1, "algo-10"), (2, "algo-2")]


def test_heterogeneous_groups_only_the_distribution_group_trains():
    base = job("mpi_job.py", "mpi")
    spec = JobSpec(**{**base.__dict__, "instance_groups": (InstanceGroupSpec("train", 2), InstanceGroupSpec("data", 1)),
                      "distribution_instance_groups": ("train",), "program": "hetero_job.py"})
    with EmulatedCluster(["algo-1", "algo-2", "algo-3"], spec) as cluster:
        result = cluster.run_all(ENTRYPOINT, env=FAST, timeout=120)
        assert result.ok, {h: r.output[-3000:] for h, r in result.results.items()}
        assert [(r["rank"], r["host"]) for r in ranks(cluster.model_dir)] == [(0, "algo-1"), (1, "algo-2")]
        with open(os.path.join(cluster.model_dir, "outside-algo-3")) as f:
            assert f.read() == "data"
        assert "outside the distribution's groups (train)" in result.results["algo-3"].output


def run_ps_job_whose_worker_host_ends_last(**hps):
    with EmulatedCluster(["algo-1", "algo-2"], job("ps_job.py", "parameter_server", **{"linger-on": "algo-2", **hps})) as cluster:
        result = cluster.run_all(ENTRYPOINT, env=FAST, timeout=120)
        with open(os.path.join(cluster.model_dir, "ended-1")) as f:
            worker_ended = float(f.read())
        outputs = {h: os.listdir(os.path.join(cluster.opt_ml(h), "output")) for h in cluster.host_names}
        failure = os.path.join(cluster.opt_ml("algo-1"), "output", "failure")
        leader_outcome = os.path.join(cluster.opt_ml("algo-1"), "output", "success" if result.ok else "failure")
        leader_done = os.stat(leader_outcome).st_mtime
        failure_text = open(failure).read() if os.path.exists(failure) else ""
        assert_nothing_left(cluster)
        return result, worker_ended, leader_done, outputs, failure_text


def test_a_parameter_server_leader_ends_after_its_workers_hosts():
    """SDK v2 local mode stops every container when the first exits: a PS leader that ended
    while a worker host's processes were still finishing had that host stopped (exit 143, the
    job failed; seen in CI). The leader now writes its outcome only once every worker host
    has told it its part ended."""
    result, worker_ended, leader_done, outputs, _ = run_ps_job_whose_worker_host_ends_last(**{"linger-s": 4})
    assert result.ok, {h: r.output[-3000:] for h, r in result.results.items()}
    assert leader_done >= worker_ended, f"the leader finished {worker_ended - leader_done:.1f} s before algo-2's worker"
    assert "waiting for 1 worker host(s) to finish: algo-2" in result.results["algo-1"].output
    assert all("success" in names for names in outputs.values()), outputs


def test_a_worker_host_that_fails_last_fails_the_leader_too():
    """The job's outcome is every host's: a worker host whose part ends with exit code 3 after
    the leader's succeeded makes the leader report that failure, naming the host, not success."""
    result, worker_ended, leader_done, outputs, failure_text = run_ps_job_whose_worker_host_ends_last(
        **{"linger-s": 2, "exit-code": 3})
    assert {h: r.returncode for h, r in result.results.items()} == {"algo-1": 3, "algo-2": 3}
    assert "success" not in outputs["algo-1"] and "failure" in outputs["algo-1"], outputs
    assert failure_text.startswith("the parameter-server job on 2 host(s) failed on host algo-2 with exit code 3.\n"
                                   "This host (algo-1) ran its own part to the end"), failure_text
    assert "Last " not in failure_text  # the leader's own lines are not algo-2's output


def test_a_worker_host_that_fails_mid_run_stops_the_leader_at_once_saying_so():
    """A worker host's part that fails while the leader's runs (here before the RPC group
    forms, where the leader's processes would wait for it) stops the leader when the worker's
    word arrives, not a host-lost timeout later, and the leader says which host failed."""
    hps = {"fail-early-on": "algo-2", "linger-on": "nobody"}
    with EmulatedCluster(["algo-1", "algo-2"], job("ps_job.py", "parameter_server", **hps)) as cluster:
        run = start(cluster)
        result = run.wait(timeout=120, fail_fast=False)
        assert {h: r.returncode != 0 for h, r in result.results.items()} == {"algo-1": True, "algo-2": True}
        text = failure(cluster, "algo-1")
        assert "Host algo-2's part of the job failed (exit code 3), so this host's processes were stopped." in text[:1024], text
        assert "lost a host" not in text, text
        assert_nothing_left(cluster)


def test_a_parameter_server_rank_killed_by_a_signal_is_named_first_on_every_host():
    """A rank the entrypoint starts itself (no launcher to see it die) and that SIGABRT kills:
    the entrypoint that saw it reports it, on its host and to every host's job port."""
    hps = {"abort-early-on": "algo-2", "linger-on": "nobody"}
    with EmulatedCluster(["algo-1", "algo-2"], job("ps_job.py", "parameter_server", **hps)) as cluster:
        run = start(cluster)
        result = run.wait(timeout=120, fail_fast=False)
        assert {h: r.returncode != 0 for h, r in result.results.items()} == {"algo-1": True, "algo-2": True}
        for host in ("algo-1", "algo-2"):
            first = failure(cluster, host)[:1024].splitlines()[0]
            assert first == ("SIGABRT: rank 3 (local rank 0) on algo-2 was killed by SIGABRT (signal 6): the process "
                             "aborted, often a C++ assertion or `terminate` in a library"), f"{host}: {first}"
        assert_nothing_left(cluster)


@pytest.mark.parametrize("distribution, ready_s", [("mpi", 12), ("torch_distributed", 20)])  # every rank ready by then, under load too
def test_every_host_stops_its_ranks_before_a_training_plans_capacity_ends(distribution, ready_s):
    """SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP (decide/capacity.py): at the stop
    time every host's ranks get SIGTERM (an MPI worker's from its own entrypoint) and
    checkpoint. The job then ends as the same stop from `docker stop` ends it (issue 33, case 7):
    with the launcher's exit code, not a made-up 143. The ranks exit 0 after saving: mpirun then
    exits 0 (success); torchrun exits 1 after any signal (its agent's SignalException), and
    output/failure leads with why the job was stopped."""
    import time

    ends = time.time() + 1800 + ready_s  # BYOC_CAPACITY_STOP_LEAD_S=0: the stop is ready_s from now
    env = {**FAST, "SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP": f"{ends:.3f}",
           "BYOC_CAPACITY_STOP_LEAD_S": "0", "BYOC_GRACE_PERIOD_S": "15"}
    with EmulatedCluster(["algo-1", "algo-2"], job("checkpoint_on_term.py", distribution)) as cluster:
        # fail_fast=False: with it, the cluster SIGTERMs the hosts still running once one has
        # exited non-zero (torchrun: 1), a second stop that the leader rightly forwards to its
        # torchrun, then in its interpreter's exit, where SIGTERM kills it (143): the harness's
        # stop, not the capacity's.
        result = cluster.run_all(ENTRYPOINT, env=env, timeout=120, fail_fast=False)
        codes = {h: r.returncode for h, r in result.results.items()}
        outputs = {h: r.output[-3000:] for h, r in result.results.items()}
        expected = {"mpi": 0, "torch_distributed": 1}[distribution]
        assert codes == {"algo-1": expected, "algo-2": expected}, outputs
        checkpointed = {n[len("checkpointed-"):].rsplit("-", 1)[0] for n in os.listdir(cluster.model_dir)
                        if n.startswith("checkpointed-")}
        assert checkpointed == {"algo-1", "algo-2"}, outputs
        for host in cluster.host_names:
            if expected == 0:
                assert "the training plan's capacity" in outputs[host], (host, outputs[host])  # each host said why it stopped
                continue
            first = failure(cluster, host).splitlines()[0]
            assert "because the training plan's reserved capacity ends at" in first, (host, first)
        assert "finished" not in "".join(outputs.values())


def test_torchrun_two_hosts_one_report_on_the_leader_covers_both():
    """The worker's figures reach the leader's job port (BYOC-HOST-FIGURES) before its outcome;
    the leader's report has both hosts and names the slow rank on the worker; the worker writes
    no report of its own (SDK v2 local mode merges the hosts' output/data)."""
    with EmulatedCluster(["algo-1", "algo-2"], job("steps_job.py", "torch_distributed", **{"slow-rank": 1})) as cluster:
        result = cluster.run_all(ENTRYPOINT, env=FAST, timeout=180)
        assert result.ok, {h: r.output[-3000:] for h, r in result.results.items()}
        folder = os.path.join(cluster.opt_ml("algo-1"), "output", "data", "report")
        report = json.load(open(os.path.join(folder, "report.json")))
        assert {h: v["status"] for h, v in report["hosts"].items()} == {"algo-1": "reported", "algo-2": "reported"}
        assert [(r["rank"], r["host"], r["steps"]) for r in report["ranks"]] == [(0, "algo-1", 40), (1, "algo-2", 40)]
        assert [(s["kind"], s["host"]) for s in report["stragglers"]] == [("rank", "algo-2"), ("host", "algo-2")]
        assert {p["host"] for p in report["phases"] if p["name"] == "peers ready"} == {"algo-1", "algo-2"}
        # Issue 43, case 6: each host's timeline has its processes' start, after its peers were ready.
        for name in ("algo-1", "algo-2"):
            phases = [p["name"] for p in report["phases"] if p["host"] == name]
            assert "peers ready" in phases and "processes started" in phases, (name, phases)
            assert phases.index("peers ready") < phases.index("processes started"), (name, phases)
        # no note but the compile cache's state (issue 35: its folder and size are shown in the report)
        assert len(report["hosts"]["algo-2"]["series"]["time"]) >= 2
        assert [n for n in report["notes"] if "torch.compile cache" not in n] == [], report["notes"]
        assert os.path.exists(os.path.join(folder, "index.html"))
        assert not os.path.exists(os.path.join(cluster.opt_ml("algo-2"), "output", "data", "report"))
        assert "job report: straggler: rank 1 on algo-2" in result.results["algo-1"].output
        assert_no_internal_line(result)
        assert_nothing_left(cluster)


def test_mpirun_two_hosts_the_leader_asks_the_workers_for_their_figures_on_the_job_port():
    spec = JobSpec(**{**job("steps_job.py", "mpi", **{"slow-rank": 3}).__dict__, "processes_per_host": 2})
    with EmulatedCluster(["algo-1", "algo-2"], spec) as cluster:
        result = cluster.run_all(ENTRYPOINT, env=FAST, timeout=180)
        assert result.ok, {h: r.output[-3000:] for h, r in result.results.items()}
        report = json.load(open(os.path.join(cluster.opt_ml("algo-1"), "output", "data", "report", "report.json")))
        assert {h: v["status"] for h, v in report["hosts"].items()} == {"algo-1": "reported", "algo-2": "reported"}
        assert [(r["rank"], r["host"]) for r in report["ranks"]] == [(0, "algo-1"), (1, "algo-1"), (2, "algo-2"),
                                                                     (3, "algo-2")]
        assert [(s["kind"], s.get("rank"), s["host"]) for s in report["stragglers"]][0] == ("rank", 3, "algo-2")
        # Issue 43, case 6: the leader's timeline has mpirun's start, after its peers were ready.
        leader = [p["name"] for p in report["phases"] if p["host"] == "algo-1"]
        assert leader.index("peers ready") < leader.index("processes started"), leader
        assert not os.path.exists(os.path.join(cluster.opt_ml("algo-2"), "output", "data", "report"))
        assert_nothing_left(cluster)


def test_a_stop_while_the_leader_ends_keeps_its_exit_code():
    """SDK v2 local mode stops every container once one has exited: a SIGTERM reaching the
    leader just after it wrote its outcome (its report, closing its port, its interpreter's
    teardown, which restores SIGTERM's default action) must leave its exit code alone. Before
    the entrypoint ended with os._exit, 2 of 4 such stops ended it as killed by SIGTERM (-15)."""
    import signal
    import time

    for delay in (0.0, 0.02, 0.04, 0.06):
        spec = job("ps_job.py", "parameter_server", **{"linger-on": "algo-2", "linger-s": 2, "exit-code": 3})
        with EmulatedCluster(["algo-1", "algo-2"], spec) as cluster:
            run = start(cluster)
            leader = run.procs["algo-1"]
            assert leader.wait_for_text("FAILED", 120), leader.output[-3000:]
            time.sleep(delay)  # the stop's moment: just after the outcome, and a little later
            leader.send_signal(signal.SIGTERM)
            result = run.wait(timeout=60, fail_fast=False)
            assert {h: r.returncode for h, r in result.results.items()} == {"algo-1": 3, "algo-2": 3}, delay


def test_a_worker_ranks_lines_reach_the_leaders_log_whole_and_all_of_them():
    """Issue 33, case 6: a rank on the worker host prints mpirun's tag mid-line (stdout and
    stderr), a burst of 1,000 short lines in one write and 700 'é': each worker's rank files are
    streamed to the leader (hosts/worker_output.py), so every line is in the leader's
    log whole, under the rank's tag, none lost (under --tag-output the tag glued the rank's text
    onto rank 0's line, and Open MPI dropped lines of the burst)."""
    with EmulatedCluster(["algo-1", "algo-2"], job("worker_lines.py", "mpi")) as cluster:
        result = cluster.run_all(ENTRYPOINT, env={**FAST, "PYTHONUNBUFFERED": "1"}, timeout=120)
        assert result.ok, {h: r.output[-3000:] for h, r in result.results.items()}
        lines = result.results["algo-1"].output.splitlines()
        for rank in (0, 1):
            said = [line for line in lines if line.startswith(f"[1,{rank}]<stdout>:rank {rank} ")]
            assert said == [f"[1,{rank}]<stdout>:rank {rank} i={i} {text}" for i in range(200)
                            for text in ("says [1,0]<stdout>: mid-line [1,1]<stdout>: twice", "the next line")], said[:4]
            assert f"[1,{rank}]<stderr>:rank {rank} on stderr [1,0]<stderr>: mid-line" in lines
        assert [line for line in lines if line.startswith("[1,1]<stdout>:") and len(line) == 17] == \
            [f"[1,1]<stdout>:{i:03d}" for i in range(1000)]
        assert "[1,1]<stdout>:" + "é" * 700 in lines
        assert "cannot reach this log" not in result.results["algo-1"].output
        assert_nothing_left(cluster)

"""Teardown, faults and parallel clusters with real hosts (root needed)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from localcluster import ClusterError, EmulatedCluster, registry
from localcluster.network import probe_link_names, probe_netns_names

PYTHON = sys.executable
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="emulated hosts need root (namespaces, veths, mounts)")

TRAP_TERM = 'trap "echo got TERM; exit 7" TERM; echo started; sleep 60 & wait'


def test_teardown_leaves_nothing(footprint, assert_no_leftovers):
    with EmulatedCluster(["algo-1", "algo-2", "algo-3"]) as cluster:
        fp = footprint(cluster)
        cluster.start_on("algo-2", ["sleep", "60"])  # still running at teardown
        assert os.path.isdir(fp.workdir) and len(fp.namespace_links) == 6
    assert_no_leftovers(fp)


def test_keep_keeps_only_the_files(footprint, assert_no_leftovers):
    with EmulatedCluster(["algo-1"], keep=True) as cluster:
        fp = footprint(cluster)
        cluster.run_on("algo-1", ["sh", "-c", "echo weights > /opt/ml/model/model.pt"])
    try:
        assert_no_leftovers(fp, workdir_kept=True)
        with open(os.path.join(fp.workdir, "shared", "model", "model.pt")) as f:
            assert f.read() == "weights\n"
        assert os.path.isfile(os.path.join(fp.workdir, "logs", "algo-1.log"))
    finally:
        subprocess.run(["rm", "-rf", fp.workdir], check=True)


def test_host_dies(footprint, assert_no_leftovers):
    probe = "import socket; socket.create_connection(('algo-2', 22), timeout=1)"
    with EmulatedCluster(["algo-1", "algo-2"]) as cluster:
        fp = footprint(cluster)
        jobs = cluster.start_all(["sleep", "60"])
        cluster.start_on("algo-2", ["sh", "-c", "sleep 60 & sleep 60 & wait"])
        time.sleep(0.2)
        cluster.kill_host("algo-2")
        assert jobs.procs["algo-2"].wait(5).describe() == "killed by SIGKILL"
        assert jobs.procs["algo-1"].poll() is None  # the other host lives on
        assert not cluster.is_up("algo-2") and cluster.is_up("algo-1")
        # Its cable is cut: peers see silence (a timeout), not a refused connection.
        result = cluster.run_on("algo-1", [PYTHON, "-c", probe])
        assert "TimeoutError" in result.output or "timed out" in result.output, result.output
        with pytest.raises(ClusterError, match="algo-2 is down"):
            cluster.run_on("algo-2", ["true"])
    assert_no_leftovers(fp)


def test_disconnect_and_reconnect_a_live_host(wait_for_text):
    server = "import socket; s = socket.create_server(('algo-2', 6000)); print('up', flush=True); s.accept(); s.accept()"
    connect = "import socket; socket.create_connection(('algo-2', 6000), timeout=1); print('connected')"
    with EmulatedCluster(["algo-1", "algo-2"]) as cluster:
        listener = cluster.start_on("algo-2", [PYTHON, "-c", server])
        wait_for_text(listener, "up")
        assert cluster.run_on("algo-1", [PYTHON, "-c", connect]).output == "connected\n"
        cluster.disconnect("algo-2")
        cut = cluster.run_on("algo-1", [PYTHON, "-c", connect])
        assert cut.returncode != 0 and "timed out" in cut.output, cut.output
        cluster.reconnect("algo-2")
        assert cluster.run_on("algo-1", [PYTHON, "-c", connect]).output == "connected\n"
        assert listener.wait(5).returncode == 0


def test_signal_all_reaches_every_main_process():
    with EmulatedCluster(["algo-1", "algo-2"]) as cluster:
        run = cluster.start_all(["sh", "-c", TRAP_TERM])
        for proc in run.procs.values():
            assert proc.wait_for_text("started", 60), proc.output
        cluster.signal_all(signal.SIGTERM)
        results = run.wait(timeout=10)
        assert {h: (r.returncode, r.output) for h, r in results.results.items()} == {
            "algo-1": (7, "started\ngot TERM\n"),
            "algo-2": (7, "started\ngot TERM\n"),
        }


def test_fail_fast_stops_the_other_hosts():
    argv = {"algo-1": ["sh", "-c", TRAP_TERM], "algo-2": ["sh", "-c", "sleep 0.3; exit 3"]}
    with EmulatedCluster(["algo-1", "algo-2"]) as cluster:
        result = cluster.run_all(lambda host: argv[host], timeout=60, grace=5)
        assert result.stop_reason == "algo-2 failed"  # algo-2's failure ended it, not the 60 s limit
        assert (result.results["algo-1"].returncode, result.results["algo-2"].returncode) == (7, 3)


def test_timeout_then_sigkill_after_grace():
    with EmulatedCluster(["algo-1"]) as cluster:
        result = cluster.run_all(["sh", "-c", "trap '' TERM; sleep 60 & wait"], timeout=0.5, grace=0.5)
        assert result.stop_reason == "the job ran past its 0.5 s limit"
        assert result.results["algo-1"].describe() == "killed by SIGKILL"
        with pytest.raises(subprocess.TimeoutExpired):
            cluster.run_on("algo-1", ["sleep", "60"], timeout=0.3)


STUCK = textwrap.dedent(
    """
    import time
    def stuck_in_its_rendezvous():
        print("stuck", flush=True)
        time.sleep(600)
    stuck_in_its_rendezvous()
    """
)


def test_a_job_past_its_time_says_where_each_process_was_stuck(capfd):
    with EmulatedCluster(["algo-1", "algo-2"]) as cluster:
        run = cluster.start_all([PYTHON, "-c", STUCK])
        for proc in run.procs.values():
            assert proc.wait_for_text("stuck", 60), proc.output
        result = run.wait(timeout=0.1, grace=0.5)
    assert result.stop_reason == "the job ran past its 0.1 s limit"
    err = capfd.readouterr().err
    for host in ("algo-1", "algo-2"):
        assert f"localcluster: {host}: stacks of pid " in err, err[-3000:]
    assert err.count("stuck_in_its_rendezvous") >= 2, err[-3000:]


def test_stop_host_on_exit_ends_what_the_command_left_running():
    with EmulatedCluster(["algo-1"]) as cluster:
        init = cluster.init_pid("algo-1")
        leave = ["sh", "-c", "sleep 60 > /dev/null 2>&1 & echo left"]
        assert cluster.start_on("algo-1", leave).wait(5).output == "left\n"
        assert "sleep 60" in cluster.run_on("algo-1", ["ps", "-eo", "args"]).output
        assert cluster.start_on("algo-1", leave, stop_host_on_exit=True).wait(5).returncode == 0
        time.sleep(0.1)
        assert "sleep 60" not in cluster.run_on("algo-1", ["ps", "-eo", "args"]).output
        assert cluster.init_pid("algo-1") == init  # the host itself stays up


def test_two_clusters_side_by_side(footprint, assert_no_leftovers):
    probe = "import socket; print(socket.gethostbyname('algo-2'))"
    with EmulatedCluster(["algo-1", "algo-2"]) as a, EmulatedCluster(["algo-1", "algo-2"]) as b:
        assert a.plan.subnet != b.plan.subnet and a.cluster_id != b.cluster_id
        assert a.run_on("algo-1", [PYTHON, "-c", probe]).output.strip() == a.address("algo-2")
        assert b.run_on("algo-1", [PYTHON, "-c", probe]).output.strip() == b.address("algo-2")
        # No route between clusters: a host of one cannot reach a host of the other.
        reach = f"import socket; socket.create_connection(('{b.address('algo-2')}', 22), timeout=1)"
        result = a.run_on("algo-1", [PYTHON, "-c", reach])
        assert "Network is unreachable" in result.output, result.output
        fp_a = footprint(a)
        fp_b = footprint(b)
    assert_no_leftovers(fp_a)
    assert_no_leftovers(fp_b)


def test_a_host_that_cannot_start_leaves_nothing():
    cluster = EmulatedCluster(["algo-1", "algo-2"], python="/nonexistent/python")
    with pytest.raises(ClusterError, match="algo-1: the host did not come up"):
        cluster.start()
    plan = cluster.plan  # made before the hosts failed: the names it would have used
    assert not {plan.bridge, *(h.veth for h in plan.hosts)} & probe_link_names()
    assert not {h.netns for h in plan.hosts} & probe_netns_names()
    assert plan.cluster_id not in {r["id"] for r in registry.load_records()}
    assert not os.path.exists(cluster.workdir)


OWNER = textwrap.dedent(
    """
    import subprocess, sys, time
    from localcluster import EmulatedCluster
    cluster = EmulatedCluster(["algo-1", "algo-2"]).start()
    # A process in a host's network that outlives its init by a moment, as the init's own
    # `unshare` does: cleanup waits for it.
    subprocess.Popen(["ip", "netns", "exec", cluster.plan.hosts[0].netns, "sleep", "2"], start_new_session=True)
    print(cluster.cluster_id, flush=True)
    time.sleep(60)
    """
)


def test_a_killed_owner_is_cleaned_up(footprint, assert_no_leftovers):
    owner = subprocess.Popen([PYTHON, "-c", OWNER], stdout=subprocess.PIPE, text=True)
    try:
        cluster_id = owner.stdout.readline().strip()
        fp = footprint(cluster_id)
        record = next(r for r in registry.load_records() if r["id"] == cluster_id)
    finally:
        owner.kill()  # SIGKILL: no teardown runs
        owner.wait()
    # The hosts die with their owner: their lifeline (stdin) closes ...
    inits = [(int(pid), start) for pid, start, *_ns in record["inits"]]
    deadline = time.monotonic() + 5
    while any(registry.is_alive(pid, start) for pid, start in inits):
        assert time.monotonic() < deadline, "hosts outlived their owner"
        time.sleep(0.05)
    # ... and `cleanup` removes the network and the files (or another cluster starting on
    # this machine meanwhile already did).
    done = subprocess.run([PYTHON, "-m", "localcluster", "cleanup"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert_no_leftovers(fp)


def test_waiting_for_a_hosts_text_wakes_on_its_line_and_ends_with_its_output():
    """HostProcess.wait_for_text: woken by the line that holds the text (it comes after the
    wait began), and False once the output has ended without it, however long the wait was
    given (an hour here: a wait that ran to its limit would hang the test, not pass it)."""
    from localcluster.processes import HostProcess

    # SIGUSR1 blocked, then taken by sigwait: one sent before the wait begins is not lost.
    script = ("import signal\nsignal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})\nprint('begun', flush=True)\n"
              "signal.sigwait({signal.SIGUSR1})\nprint('the word', flush=True)\n")
    proc = HostProcess("h", [sys.executable, "-c", script], dict(os.environ))
    assert proc.wait_for_text("begun", 3600), proc.output
    assert not proc.wait_for_text("the word", 0.0)  # not yet: it waits for the signal
    os.kill(proc.pid, signal.SIGUSR1)
    assert proc.wait_for_text("the word", 3600), proc.output
    assert not proc.wait_for_text("never printed", 3600)  # its output ended
    assert proc.wait(timeout=60).returncode == 0

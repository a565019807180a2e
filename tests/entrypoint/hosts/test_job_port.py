"""A failing rank's record reaches the leader's job port from another process (as from
another host); a bare connection is only a liveness probe."""

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from entrypoint.hosts.job_port import parse_root_cause_line
from entrypoint.hosts.job_port import JobPort
from entrypoint.decide.plan import RECORD_ERRORS
from entrypoint.hosts.net import can_connect
from support.deadlines import DeadlineStop


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


KEY = "ab" * 32


@pytest.mark.parametrize("key_name", ["BYOC_JOB_PORT_KEY", "BYOC_JOB_REPORT_KEY"])  # the old name, for one release
def test_failing_rank_reports_to_the_leaders_job_port(tmp_path, key_name):
    port = free_port()
    lines = []
    job_port = JobPort(port, on_root_cause=lines.append, report_key=KEY)
    try:
        assert can_connect("127.0.0.1", port)  # a liveness probe: no report
        script = tmp_path / "rank.py"
        script.write_text("raise KeyError('missing shard 7')\n")
        env = {"PATH": "/usr/bin:/bin", "BYOC_JOB_PORTS": f"127.0.0.1:{port}", "SM_CURRENT_HOST": "algo-2", "RANK": "3",
               key_name: KEY}
        done = subprocess.run([sys.executable, RECORD_ERRORS, str(script)], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 1
        deadline = time.monotonic() + 10
        while not lines and time.monotonic() < deadline:
            time.sleep(0.05)
        causes = [parse_root_cause_line(line) for line in lines]
        assert [(c.host, c.rank, c.type, c.message) for c in causes] == [("algo-2", "3", "KeyError", "'missing shard 7'")]
    finally:
        job_port.close()
    assert not can_connect("127.0.0.1", port)


def test_worker_waits_until_the_leaders_job_port_closes():
    """A worker host that finished waits for its leader (local mode stops every container as
    soon as one exits): the wait ends when the leader closes its port, or at the bound."""
    import threading

    from entrypoint.hosts.job_port import wait_until_port_closes

    port = free_port()
    leader = JobPort(port)
    closing = threading.Event()

    def close_leader() -> None:
        closing.set()
        leader.close()

    threading.Timer(0.5, close_leader).start()
    assert wait_until_port_closes("127.0.0.1", port, timeout_s=60) == "closed"  # the close ended it, not the bound
    assert closing.is_set()  # and not before the leader closed

    still_running = JobPort(port)
    try:
        stop = DeadlineStop(timeout_s=1.0)
        start = time.monotonic()
        assert wait_until_port_closes("127.0.0.1", port, timeout_s=1.0, stopped=stop) == "timeout"
        assert time.monotonic() - start >= 1.0  # not before its deadline (nor on past it: that would be "stopped")
        assert wait_until_port_closes("127.0.0.1", port, timeout_s=30, stopped=lambda: True) == "stopped"
    finally:
        still_running.close()


def send(port: int, text: str) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(text.encode())


def test_the_job_port_takes_reports_only_from_this_jobs_ranks(tmp_path):
    """Anyone can connect; only a rank holding the job's report key is heard. Forged, unsigned,
    re-keyed and replayed reports are dropped and logged."""
    import json

    from entrypoint.rank.record_errors import MARKER, sign_report

    port = free_port()
    heard, refused = [], []
    job_port = JobPort(port, on_root_cause=heard.append, report_key=KEY, on_refused=lambda a, why: refused.append(why))
    try:
        def record(message: str, made: float) -> str:
            return MARKER + json.dumps({"host": "algo-9", "rank": "0", "type": "Forged", "message": message, "time": made})

        now = time.time()
        send(port, record("unsigned", now) + "\n")
        send(port, f"BYOC-SIGNED {sign_report('cd' * 32, record('other key', now))} {record('other key', now)}\n")
        tampered = record("tampered", now)
        send(port, f"BYOC-SIGNED {sign_report(KEY, record('original', now))} {tampered}\n")
        old = record("replayed", now - 3600)
        send(port, f"BYOC-SIGNED {sign_report(KEY, old)} {old}\n")
        good = record("genuine", now)
        send(port, f"BYOC-SIGNED {sign_report(KEY, good)} {good}\n")
        deadline = time.monotonic() + 10
        while (not heard or len(refused) < 4) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        job_port.close()
    assert [parse_root_cause_line(line).message for line in heard] == ["genuine"]
    assert sorted(refused) == sorted(["not signed", "signed with another key", "signed with another key",
                                      "made before this job started (a replay)"])


def test_the_report_key_is_the_same_on_every_host_and_differs_between_jobs(tmp_path):
    """Derived with no message between the hosts: from the job's name, hosts and
    hyperparameters, and BYOC_JOB_SECRET; in the plan's env (masked in the dry run: a *KEY)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from support.jobtree import run_entrypoint, write_tree

    def key(host: str, **env: str) -> str:
        root = write_tree(tmp_path / f"{host}{len(env)}{sorted(env.items())!s:.40}".replace("/", "_"),
                          script="pass\n", hosts=("algo-1", "algo-2"), current_host=host,
                          hyperparameters={"sagemaker_torch_distributed_enabled": True, "lr": 0.1})
        from entrypoint.cli import load_runtime, load_plan
        from entrypoint.job.config import load_job
        from entrypoint.job.paths import build_paths
        from entrypoint.job.probe import probe_machine

        environ = {"SAGEMAKER_BASE_DIR": str(root), "TRAINING_JOB_NAME": "job-a", **env}
        plan = load_plan(load_job(build_paths(environ), environ), probe_machine(), load_runtime(environ, "0" * 16))
        dry = run_entrypoint(root, "--dry-run", **{"TRAINING_JOB_NAME": "job-a", **env})
        key = plan.env_dict["BYOC_JOB_PORT_KEY"]
        assert key not in dry.stdout and "BYOC_JOB_PORT_KEY" in dry.stdout and "BYOC_JOB_REPORT_KEY" in dry.stdout
        assert plan.env_dict["BYOC_JOB_REPORT_KEY"] == key  # the old name, for one release
        return key

    assert key("algo-1") == key("algo-2")
    assert key("algo-1", BYOC_JOB_SECRET="s3cr3t") == key("algo-2", BYOC_JOB_SECRET="s3cr3t") != key("algo-1")
    assert key("algo-1", TRAINING_JOB_NAME="job-b") != key("algo-1")


def test_a_signed_report_sent_again_during_the_run_is_taken_once():
    """A replay made during the run (its time is after the port opened) is known by its
    signature: the second copy is refused and logged with the reason."""
    import json

    from entrypoint.rank.record_errors import MARKER, sign_report

    port = free_port()
    heard, refused = [], []
    job_port = JobPort(port, on_root_cause=heard.append, report_key=KEY,
                       on_refused=lambda address, why: refused.append((address, why)))
    try:
        record = MARKER + json.dumps({"host": "algo-2", "rank": "1", "type": "KeyError", "message": "'shard 7'",
                                      "time": time.time()})
        signed = f"BYOC-SIGNED {sign_report(KEY, record)} {record}\n"
        send(port, signed)
        deadline = time.monotonic() + 10
        while not heard and time.monotonic() < deadline:
            time.sleep(0.05)
        send(port, signed)
        other = record.replace("'shard 7'", "'shard 8'")  # another report of the run is still heard
        send(port, f"BYOC-SIGNED {sign_report(KEY, other)} {other}\n")
        while (len(heard) < 2 or not refused) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # nothing more arrives
    finally:
        job_port.close()
    assert [parse_root_cause_line(line).message for line in heard] == ["'shard 7'", "'shard 8'"]
    assert refused == [("127.0.0.1", "received before (a replay)")]


def test_the_signatures_remembered_are_bounded():
    from hypothesis import given
    from hypothesis import strategies as st

    from entrypoint.hosts.job_port import SeenSignatures

    @given(st.lists(st.text(alphabet="0123456789abcdef", min_size=1, max_size=4), max_size=60),
           st.integers(min_value=1, max_value=8))
    def check(signatures, kept):
        seen = SeenSignatures(kept)
        recent: list[str] = []  # the model: the last `kept` distinct signatures taken
        for signature in signatures:
            assert seen.add(signature) == (signature not in recent)
            if signature not in recent:
                recent = (recent + [signature])[-kept:]
            assert len(seen._seen) == len(seen._order) <= kept

    check()


def test_a_worker_hosts_outcome_reaches_the_leader_signed_and_once():
    """send_host_done delivers (host, exit code) to the leader's on_host_done; with another
    job's key, or sent again as it was (a replay), it is refused."""
    from entrypoint.hosts.job_port import send_host_done

    port, done, refused = free_port(), [], []
    job_port = JobPort(port, on_root_cause=lambda line: None, report_key=KEY, on_host_done=lambda h, c: done.append((h, c)),
                       on_refused=lambda address, why: refused.append(why))
    try:
        assert send_host_done("127.0.0.1", port, KEY, "algo-2", 3)
        assert send_host_done("127.0.0.1", port, "cd" * 32, "algo-3", 0)
        deadline = time.monotonic() + 10
        while len(done) + len(refused) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert done == [("algo-2", 3)]
        assert refused == ["a host's outcome, signed with another key"]  # named as one: always logged
    finally:
        job_port.close()
    assert not send_host_done("127.0.0.1", port, KEY, "algo-2", 0, within_s=0.5)  # nobody listens


def test_the_leader_waits_for_every_worker_host_or_its_silence():
    """HostOutcomes.wait_for ends when each host has reported or stopped answering; a host
    still answering without a word keeps it waiting until the bound; a signal ends it."""
    import threading

    from entrypoint.hosts.job_port import HostOutcomes

    outcomes = HostOutcomes()
    quiet = socket.create_server(("127.0.0.1", 0))  # a worker host still running: answers, no word yet
    port = quiet.getsockname()[1]
    try:
        added = threading.Event()

        def add() -> None:
            outcomes.add("127.0.0.1", 0)
            added.set()

        def stopped_after_the_word() -> bool:
            return added.is_set()  # a wait that looks again after the word missed it: "stopped"

        threading.Timer(0.5, add).start()
        assert outcomes.wait_for(["127.0.0.1"], port, timeout_s=3600, stopped=stopped_after_the_word) == \
            ({"127.0.0.1": 0}, [], "all")

        later = HostOutcomes()
        stop = DeadlineStop(timeout_s=1.0)
        started = time.monotonic()
        assert later.wait_for(["127.0.0.1"], port, timeout_s=1.0, stopped=stop) == ({}, [], "timeout")
        assert time.monotonic() - started >= 1.0  # not before its deadline (nor on past it: that would be "stopped")
        assert later.wait_for(["127.0.0.1"], port, timeout_s=30, stopped=lambda: True) == ({}, [], "stopped")
        later.add("127.0.0.1", 2)
        later.add("127.0.0.1", 0)  # the first word stands
        assert later.codes() == {"127.0.0.1": 2}
    finally:
        quiet.close()
    # The port closed with no word: the host went away (its own output/failure has why).
    assert HostOutcomes().wait_for(["127.0.0.1"], port, timeout_s=30) == ({}, ["127.0.0.1"], "all")

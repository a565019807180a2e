"""A failing rank's record reaches the leader's job port from another process (as from
another host); a bare connection is only a liveness probe. What the port reads comes out
typed, on the host's loop (entrypoint/loop/)."""

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from entrypoint.hosts.job_port import (ClosedWatch, HostDone, JobPort, PortClosed, Refused, RootCauseLine, Sent,
                                       deliver, parse_root_cause_line, send_message)
from entrypoint.decide.plan import RECORD_ERRORS
from entrypoint.hosts.net import can_connect
from entrypoint.loop import HostLoop, StopRequested, Waited


def free_port() -> int:
    # Picked as the job port binds (every address, SO_REUSEADDR): a port a closed connection
    # still holds (TIME_WAIT, after many probes) is not picked to fail that bind.
    with socket.create_server(("", 0)) as s:
        return s.getsockname()[1]


KEY = "ab" * 32


class Heard:
    """A host loop that keeps every event of the given types, in the order it took them."""

    def __init__(self, *kinds) -> None:
        self.loop = HostLoop()
        self.events: list = []
        self.loop.on({kind: self.events.append for kind in kinds})

    def wait_for(self, count: int) -> list:
        self.loop.wait(lambda: len(self.events) >= count, time.monotonic() + 60)
        return self.events

    def of(self, kind) -> list:
        return [e for e in self.events if isinstance(e, kind)]


@pytest.mark.parametrize("key_name", ["BYOC_JOB_PORT_KEY", "BYOC_JOB_REPORT_KEY"])  # the old name, for one release
def test_failing_rank_reports_to_the_leaders_job_port(tmp_path, key_name):
    port, heard = free_port(), Heard(RootCauseLine, Refused)
    job_port = JobPort(port, heard.loop.post, job_key=KEY)
    try:
        assert can_connect("127.0.0.1", port)  # a liveness probe: nothing posted
        script = tmp_path / "rank.py"
        script.write_text("raise KeyError('missing shard 7')\n")
        env = {"PATH": "/usr/bin:/bin", "BYOC_JOB_PORTS": f"127.0.0.1:{port}", "SM_CURRENT_HOST": "algo-2", "RANK": "3",
               key_name: KEY}
        done = subprocess.run([sys.executable, RECORD_ERRORS, str(script)], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 1
        causes = [parse_root_cause_line(event.line) for event in heard.wait_for(1)]
        assert [(c.host, c.rank, c.type, c.message) for c in causes] == [("algo-2", "3", "KeyError", "'missing shard 7'")]
    finally:
        job_port.close()
    assert not can_connect("127.0.0.1", port)


def test_a_wait_for_a_port_to_close_ends_when_it_closes_at_its_deadline_or_on_a_stop():
    """A worker host that finished waits for its leader (local mode stops every container as
    soon as one exits): the wait ends when the leader closes its port (ClosedWatch posts
    PortClosed), at the deadline and not before, or when a stop is posted."""
    import threading

    port = free_port()
    leader = JobPort(port, lambda event: None)
    closing = threading.Event()

    def close_leader() -> None:
        closing.set()
        leader.close()

    heard = Heard(PortClosed)
    threading.Timer(0.5, close_leader).start()
    watch = ClosedWatch(["127.0.0.1"], port, heard.loop.post)
    assert heard.wait_for(1) == [PortClosed("127.0.0.1", port)]
    assert closing.is_set()  # and not before the leader closed
    watch.close()

    still_running = JobPort(port, lambda event: None)
    try:
        quiet = Heard(PortClosed)
        watch = ClosedWatch(["127.0.0.1"], port, quiet.loop.post)
        deadline = time.monotonic() + 1.0
        assert quiet.loop.wait(lambda: bool(quiet.events), deadline) is Waited.TIMEOUT
        assert time.monotonic() >= deadline  # not before its deadline
        quiet.loop.post(StopRequested(15))
        assert quiet.loop.wait(lambda: bool(quiet.events), time.monotonic() + 3600) is Waited.STOPPED
        watch.close()
    finally:
        still_running.close()


def send(port: int, text: str) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(text.encode())


def test_the_job_port_takes_root_causes_only_from_this_jobs_ranks(tmp_path):
    """Anyone can connect; only a rank holding the job's key is heard. Forged, unsigned,
    re-keyed and replayed messages are refused, saying why."""
    import json

    from entrypoint.rank.record_errors import MARKER, sign_record

    port, heard = free_port(), Heard(RootCauseLine, Refused)
    job_port = JobPort(port, heard.loop.post, job_key=KEY)
    try:
        def record(message: str, made: float) -> str:
            return MARKER + json.dumps({"host": "algo-9", "rank": "0", "type": "Forged", "message": message, "time": made})

        now = time.time()
        send(port, record("unsigned", now) + "\n")
        send(port, f"BYOC-SIGNED {sign_record('cd' * 32, record('other key', now))} {record('other key', now)}\n")
        tampered = record("tampered", now)
        send(port, f"BYOC-SIGNED {sign_record(KEY, record('original', now))} {tampered}\n")
        old = record("replayed", now - 3600)
        send(port, f"BYOC-SIGNED {sign_record(KEY, old)} {old}\n")
        good = record("genuine", now)
        send(port, f"BYOC-SIGNED {sign_record(KEY, good)} {good}\n")
        heard.wait_for(5)
    finally:
        job_port.close()
    assert [parse_root_cause_line(e.line).message for e in heard.of(RootCauseLine)] == ["genuine"]
    assert sorted(e.why for e in heard.of(Refused)) == sorted(["not signed", "signed with another key",
                                                               "signed with another key",
                                                               "made before this job started (a replay)"])


def test_the_job_key_is_the_same_on_every_host_and_differs_between_jobs(tmp_path):
    """Derived with no message between the hosts: from the job's name, hosts and
    hyperparameters, and BYOC_JOB_SECRET; in the plan's env (masked in the dry run: a *KEY)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from support.jobtree import run_entrypoint, write_tree

    def key(host: str, **env: str) -> str:
        root = write_tree(tmp_path / f"{host}{len(env)}{sorted(env.items())!s:.40}".replace("/", "_"),
                          script="pass\n", hosts=("algo-1", "algo-2"), current_host=host,
                          hyperparameters={"sagemaker_torch_distributed_enabled": True, "lr": 0.1})
        from entrypoint.cli import load_runtime, load_plan
        from entrypoint.decide.settings import parse_launch_settings
        from entrypoint.job.config import load_job
        from entrypoint.job.paths import build_paths
        from entrypoint.job.probe import probe_machine

        environ = {"SAGEMAKER_BASE_DIR": str(root), "TRAINING_JOB_NAME": "job-a", **env}
        settings = parse_launch_settings(environ)
        plan = load_plan(load_job(build_paths(environ), environ), probe_machine(), load_runtime(settings, "0" * 16),
                         settings)
        dry = run_entrypoint(root, "--dry-run", **{"TRAINING_JOB_NAME": "job-a", **env})
        key = plan.env_dict["BYOC_JOB_PORT_KEY"]
        assert key not in dry.stdout and "BYOC_JOB_PORT_KEY" in dry.stdout and "BYOC_JOB_REPORT_KEY" in dry.stdout
        assert plan.env_dict["BYOC_JOB_REPORT_KEY"] == key  # the old name, for one release
        return key

    assert key("algo-1") == key("algo-2")
    assert key("algo-1", BYOC_JOB_SECRET="s3cr3t") == key("algo-2", BYOC_JOB_SECRET="s3cr3t") != key("algo-1")
    assert key("algo-1", TRAINING_JOB_NAME="job-b") != key("algo-1")


def test_a_signed_message_sent_again_during_the_run_is_taken_once():
    """A replay made during the run (its time is after the port opened) is known by its
    signature: the second copy is refused, saying why."""
    import json

    from entrypoint.rank.record_errors import MARKER, sign_record

    port, heard = free_port(), Heard(RootCauseLine, Refused)
    job_port = JobPort(port, heard.loop.post, job_key=KEY)
    try:
        record = MARKER + json.dumps({"host": "algo-2", "rank": "1", "type": "KeyError", "message": "'shard 7'",
                                      "time": time.time()})
        signed = f"BYOC-SIGNED {sign_record(KEY, record)} {record}\n"
        send(port, signed)
        heard.wait_for(1)
        send(port, signed)
        heard.wait_for(2)
        other = record.replace("'shard 7'", "'shard 8'")  # another root cause of the run is still heard
        send(port, f"BYOC-SIGNED {sign_record(KEY, other)} {other}\n")
        heard.wait_for(3)
    finally:
        job_port.close()
    assert [parse_root_cause_line(e.line).message for e in heard.of(RootCauseLine)] == ["'shard 7'", "'shard 8'"]
    assert heard.of(Refused) == [Refused("127.0.0.1", "received before (a replay)")]


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
    """deliver brings a HostDone to the leader's loop, typed, with the sender's address; with
    another job's key it is refused, named as a host's outcome (always logged), and the sender
    is told so (the port's answer: not delivered, not tried again); to a closed port it is not
    delivered, and not tried again."""
    port, heard = free_port(), Heard(HostDone, Refused)
    job_port = JobPort(port, heard.loop.post, job_key=KEY)
    try:
        assert deliver(heard.loop, "127.0.0.1", port, KEY, HostDone("algo-2", 3), 5.0)
        assert send_message("127.0.0.1", port, "cd" * 32, HostDone("algo-3", 0)) is Sent.REFUSED
        heard.wait_for(2)
        assert heard.of(HostDone) == [HostDone("algo-2", 3, "127.0.0.1")]
        assert heard.of(Refused) == [Refused("127.0.0.1", "signed with another key", host_done=True)]
    finally:
        job_port.close()
    assert send_message("127.0.0.1", port, KEY, HostDone("algo-2", 0)) is Sent.CLOSED  # nobody listens
    assert not deliver(heard.loop, "127.0.0.1", port, KEY, HostDone("algo-2", 0), 3600.0)  # refused: not retried


def test_a_delivery_to_an_unreachable_host_gives_up_at_its_deadline_or_on_a_stop():
    loop = HostLoop()
    started = time.monotonic()
    assert not deliver(loop, "host.invalid", 1, KEY, HostDone("algo-2", 0), 0.5)
    assert time.monotonic() - started >= 0.5  # tried until its deadline, not less
    loop.post(StopRequested(15))
    assert not deliver(loop, "host.invalid", 1, KEY, HostDone("algo-2", 0), 3600.0)  # the stop ends it


def test_a_send_off_the_loop_is_tried_until_its_deadline_and_not_again_once_refused():
    """send_until (send_to_each's senders, each on a thread of its own): tried again while the
    host is unreachable, up to its deadline, its pauses the host loop's, which a stop does not
    end (the sender's deadline is its own); a refused port (that host has ended) ends it."""
    from entrypoint.hosts.job_port import send_until

    stopped = HostLoop()
    stopped.post(StopRequested(signal.SIGTERM))
    started = time.monotonic()
    assert not send_until("host.invalid", 1, KEY, HostDone("algo-2", 0), 0.5, stopped)
    assert time.monotonic() - started >= 0.5  # not before its deadline, a stop or not
    assert not send_until("127.0.0.1", free_port(), KEY, HostDone("algo-2", 0), 3600.0, HostLoop())  # refused: at once
    port, heard = free_port(), Heard(HostDone)
    job_port = JobPort(port, heard.loop.post, job_key=KEY)
    try:
        assert send_until("127.0.0.1", port, KEY, HostDone("algo-2", 0), 5.0, HostLoop())
        assert heard.wait_for(1) == [HostDone("algo-2", 0, "127.0.0.1")]
    finally:
        job_port.close()

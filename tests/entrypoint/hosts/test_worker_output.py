"""A multi-host MPI job's worker rank output, streamed to the leader (hosts/worker_output.py,
run/rank_output.run_for_leader): the remote command, the framing (a line's first tag is the
follower's, all after it the rank's), and real sessions: `ssh` here is a stand-in on PATH that
runs the remote command with `sh -c` as sshd does (or fails, or never answers, by host name),
and the worker's side is the real follower reading real files."""

from __future__ import annotations

import os
import shlex
import signal
import stat
import sys
import threading
import time

import pytest

from entrypoint.hosts import mpi_wire
from entrypoint.hosts import worker_output
from entrypoint.hosts.worker_output import MAX_LINE_BYTES, build_worker_lines, parse_worker_line, start_worker_output
from entrypoint.run import rank_output
from entrypoint.loop import HostLoop, StopRequested
from entrypoint.run.supervise import OutputCollector
from support.jobs import make_job, plan_for

class Sink:
    """The leader's stdout or stderr."""

    def __init__(self):
        self.data, self.lock = b"", threading.Lock()

    def write(self, b):
        with self.lock:
            self.data += bytes(b)

    def flush(self):
        pass


def write(folder, relative, data: bytes) -> None:
    """As Open MPI's daemon writes a rank's file on the worker."""
    path = os.path.join(folder, relative)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "ab") as f:
        f.write(data)


def wait_until(condition) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.01)


STAND_IN_SSH = """#!/bin/sh
case "$3" in
  refused) echo "ssh: connect to host refused port 22: Connection refused" >&2; exit 255 ;;
  silent) exec sleep 600 ;;
esac
exec sh -c "$4"
"""


def test_the_remote_command_names_only_our_python_our_file_the_folder_and_two_numbers():
    folder = "/run/byoc/job-1/rank output $(touch /tmp/x) 'q'"
    command = mpi_wire.build_follow_command("/usr/bin/python3", folder, 0.5, 0.05)
    assert shlex.split(command) == ["exec", "/usr/bin/python3", "-I", os.path.abspath(rank_output.__file__), folder,
                                    "0.5", "0.05"]


def test_the_follower_and_the_leader_say_the_same_ready_line_and_line_limit():
    """run/rank_output.py runs by path on the worker: it keeps its own copy of the words."""
    assert rank_output.READY_LINE == worker_output.READY_LINE
    assert len(b"[1,4294967295]<stddiag>:") + rank_output.MAX_PENDING_BYTES <= MAX_LINE_BYTES


@pytest.mark.parametrize("line, stream", [
    (b"[1,1]<stdout>:[1,0]<stderr>: the rank's own text", "stdout"),
    (b"[1,1]<stderr>:[1,0]<stdout>: x", "stderr"),
    (b"[1,12]<stddiag>:open mpi says", "stderr"),
    (b"no tag [1,0]<stdout>: later", "stderr"),
    (b"", "stderr"),
])
def test_only_the_first_tag_of_a_followers_line_says_its_stream(line, stream):
    assert parse_worker_line(line) == stream


@pytest.mark.parametrize("size, waits", [(MAX_LINE_BYTES - 1, True), (MAX_LINE_BYTES, True), (MAX_LINE_BYTES + 1, False)])
def test_a_piece_waits_for_its_line_end_up_to_the_limit(size, waits):
    lines, rest = build_worker_lines(b"[1,0]<stdout>:a", b"b\n" + b"x" * size)
    assert lines == [b"[1,0]<stdout>:ab"] + ([] if waits else [b"x" * size])
    assert rest == (b"x" * size if waits else b"")


@pytest.fixture
def ssh_on_path(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(STAND_IN_SSH)
    (bin_dir / "ssh").chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def lost(said: list[str]) -> list[str]:
    return [line for line in said if "cannot reach this log" in line]


def leader_plan(peers, ready_s=30.0):
    plan = plan_for(make_job(hosts=("algo-1", *peers), hps={"sagemaker_mpi_enabled": True}))
    return plan._replace(settings=plan.settings._replace(ssh_session_timeout_s=ready_s, quiet_line_s=0.2))


def test_a_workers_lines_arrive_whole_as_written_and_to_the_end(tmp_path, ssh_on_path):
    """The follower clears what an earlier run left, then every line its ranks write comes to
    the leader's stdout or stderr by the rank's stream, hostile bytes as they are, and to the
    collector; closing the session reads each file to its end (a piece with no newline too)."""
    folder = str(tmp_path / "rank output $(touch x) 'q'")
    write(folder, "1/rank.0/stdout", b"from an earlier run\n")
    collector, sinks, said, seen = OutputCollector(), {"stdout": Sink(), "stderr": Sink()}, [], []
    collector.on_line = seen.append
    output = start_worker_output(leader_plan(("algo-2",)), folder, sys.executable, collector, HostLoop(), sinks, said.append)
    assert len(output.sessions) == 1 and lost(said) == []
    assert [line.split(" (")[0] for line in said] == ["1 worker(s) stream their ranks' output here over SSH"]
    hostile = b"[1,0]<stdout>: tag \r\x00\x1b[2J \xff\xfe \xed\xa0\x80 lone surrogate"
    write(folder, "1/rank.1/stdout", b"".join(b"%03d\n" % i for i in range(1000)) + hostile + b"\n" + "é".encode() * 700)
    write(folder, "1/rank.1/stderr", b"[1,1]<stdout>: on stderr\n")
    wait_until(lambda: b"[1,1]<stderr>:" in sinks["stderr"].data)
    output.stop(30.0)
    assert sinks["stdout"].data == b"".join(b"[1,1]<stdout>:%03d\n" % i for i in range(1000)) + \
        b"[1,1]<stdout>:" + hostile + b"\n" + b"[1,1]<stdout>:" + "é".encode() * 700 + b"\n"
    assert sinks["stderr"].data == b"[1,1]<stderr>:[1,1]<stdout>: on stderr\n"
    expected = [line.decode("utf-8", "replace") for line in (sinks["stdout"].data + sinks["stderr"].data).split(b"\n")[:-1]]
    assert sorted(seen) == sorted(expected)  # every line counts here as a local rank's (root causes, silence, live view)
    assert lost(said) == [] and output.sessions[0].proc.returncode == 0


def test_a_worker_whose_session_fails_or_never_answers_is_said_once_and_the_others_follow(tmp_path, ssh_on_path):
    collector, sinks, said = OutputCollector(), {"stdout": Sink(), "stderr": Sink()}, []
    plan = leader_plan(("algo-2", "refused", "silent"), ready_s=1.0)
    output = start_worker_output(plan, str(tmp_path / "out"), sys.executable, collector, HostLoop(), sinks, said.append)
    assert [s.host for s in output.sessions] == ["algo-2"]
    assert sorted(lost(said)) == [
        "refused: its ranks' output cannot reach this log: its session ended before it was ready "
        "(ssh: connect to host refused port 22: Connection refused); the job goes on",
        "silent: its ranks' output cannot reach this log: its session was not ready within 1 s; the job goes on",
    ]
    output.stop(30.0)
    assert len(lost(said)) == 2


def test_a_session_that_ends_during_the_run_is_said_once(tmp_path, ssh_on_path):
    said, loop = [], HostLoop()
    output = start_worker_output(leader_plan(("algo-2",)), str(tmp_path / "out"), sys.executable, OutputCollector(),
                                 loop, {"stdout": Sink(), "stderr": Sink()}, said.append)
    os.killpg(output.sessions[0].proc.pid, signal.SIGKILL)
    loop.wait(lambda: bool(lost(said)), time.monotonic() + 60)  # the session's end is an event on the loop
    output.stop(30.0)
    assert lost(said) == ["algo-2: its ranks' output cannot reach this log: its session ended before mpirun did; the job goes on"]


def test_a_stop_while_waiting_for_the_workers_ends_the_wait_and_their_sessions(tmp_path, ssh_on_path):
    loop, said = HostLoop(), []
    loop.post(StopRequested(signal.SIGTERM))
    output = start_worker_output(leader_plan(("silent",)), str(tmp_path / "out"), sys.executable, OutputCollector(),
                                 loop, {"stdout": Sink(), "stderr": Sink()}, said.append)
    assert output.sessions == [] and said == []  # no run starts: nothing of it is lost

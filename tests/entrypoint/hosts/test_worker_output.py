"""A multi-host MPI job's worker rank output, streamed to the leader (hosts/worker_output.py):
the framing (a line's first tag is the follower's, all after it the rank's), the stream's
opening (signed, this run's nonce, from the worker's own addresses, once a worker), and real
streams: the leader's real OutputPump and the workers' real RankStream, each following real
files, over loopback TCP. Only the ask (FOLLOW-RANKS, a job-port word: test_mpi_words.py and
the launch tests) is handed to the workers directly here."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import pytest

from entrypoint.hosts import job_port
from entrypoint.hosts.job_port import Refused
from entrypoint.hosts.worker_output import (MAX_LINE_BYTES, build_opening, build_worker_lines, parse_opening,
                                            parse_worker_line, start_worker_output)
from entrypoint.run.rank_stream import RankStream
from entrypoint.run import rank_output
from entrypoint.loop import HostLoop, StopRequested
from entrypoint.run.supervise import OutputCollector
from support.jobs import make_job, plan_for

KEY = "ab" * 32
NONCE = "0123456789abcdef" * 2


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


def test_the_follower_and_the_leader_agree_on_the_longest_line():
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


def lost(said: list[str]) -> list[str]:
    return [line for line in said if "cannot reach this log" in line]


def leader_plan(peers, ready_s=30.0):
    plan = plan_for(make_job(hosts=("algo-1", *peers), hps={"sagemaker_mpi_enabled": True}))
    return plan._replace(settings=plan.settings._replace(rank_stream_timeout_s=ready_s, quiet_line_s=0.2,
                                                         message_read_timeout_s=1.0))


class Workers:
    """The workers' side: each host named in folders follows its own folder with a real
    RankStream once asked (as roles/mpi.MpiWorker.on_follow_ranks does); a host not in folders
    does not take the ask; one in silent takes it and never opens its stream."""

    def __init__(self, folders: dict, silent=(), key=KEY):
        self.folders, self.silent, self.key = folders, set(silent), key
        self.streams: dict[str, RankStream] = {}
        self.said: list[str] = []

    def ask_each(self, message_of, within_s):
        taken = {}
        for host, folder in self.folders.items():
            ask = message_of(host)
            assert isinstance(ask, job_port.FollowRanks)
            taken[host] = True
            if host not in self.silent:
                opening = build_opening(self.key, host, ask.nonce, time.time())
                self.streams[host] = RankStream(folder, "127.0.0.1", ask.port, opening, self.said.append).start()
        return taken

    def end(self):
        for stream in self.streams.values():
            stream.end(30.0)
            assert not stream.thread.is_alive()


LOOPBACK = frozenset({"127.0.0.1"})


def start(plan, workers, loop=None, collector=None, sinks=None, said=None, addresses=None):
    return start_worker_output(plan, collector or OutputCollector(), loop or HostLoop(),
                               sinks or {"stdout": Sink(), "stderr": Sink()}, (said if said is not None else []).append,
                               workers.ask_each, addresses or {h: LOOPBACK for h in plan.peers}, KEY)


def test_a_workers_lines_arrive_whole_as_written_and_to_the_end(tmp_path):
    """The worker clears what an earlier run left, then every line its ranks write comes to the
    leader's stdout or stderr by the rank's stream, hostile bytes as they are, and to the
    collector; the leader's end of the run reads each file to its end (a piece with no newline
    too)."""
    folder = str(tmp_path / "rank output $(touch x) 'q'")
    write(folder, "1/rank.0/stdout", b"from an earlier run\n")
    collector, sinks, said, seen = OutputCollector(), {"stdout": Sink(), "stderr": Sink()}, [], []
    collector.on_line = seen.append
    workers = Workers({"algo-2": folder})
    output = start(leader_plan(("algo-2",)), workers, collector=collector, sinks=sinks, said=said)
    assert len(output.sessions) == 1 and lost(said) == []
    assert [line.split(" (")[0] for line in said] == ["1 worker(s) stream their ranks' output here"]
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
    assert lost(said) == [] and output.sessions[0].ended
    workers.end()
    assert workers.said == []


def test_many_workers_stream_at_once_on_one_leader_thread(tmp_path):
    """64 workers' streams, each rank's lines whole and all of them, read by the pump's one thread."""
    hosts = tuple(f"algo-{i}" for i in range(2, 66))
    folders = {h: str(tmp_path / h) for h in hosts}
    sinks = {"stdout": Sink(), "stderr": Sink()}
    workers = Workers(folders)
    output = start(leader_plan(hosts), workers, sinks=sinks)
    assert len(output.sessions) == 64
    assert [t.name for t in threading.enumerate()].count("byoc-worker-output") == 1  # the leader's one pump
    for n, host in enumerate(hosts):
        write(folders[host], f"1/rank.{n}/stdout", b"".join(b"rank %d line %d\n" % (n, i) for i in range(50)))
    wait_until(lambda: sinks["stdout"].data.count(b"\n") == 64 * 50)
    output.stop(30.0)
    lines = sinks["stdout"].data.decode().splitlines()
    assert sorted(lines) == sorted(f"[1,{n}]<stdout>:rank {n} line {i}" for n in range(64) for i in range(50))
    workers.end()


def test_a_worker_that_is_not_asked_or_never_opens_is_said_once_and_the_others_follow(tmp_path):
    class PartlyTaken(Workers):
        def ask_each(self, message_of, within_s):
            taken = super().ask_each(message_of, within_s)
            return {**taken, "refused": False}

    said = []
    workers = PartlyTaken({"algo-2": str(tmp_path / "a"), "silent": str(tmp_path / "s")}, silent={"silent"})
    output = start(leader_plan(("algo-2", "refused", "silent"), ready_s=1.0), workers, said=said)
    assert [s.host for s in output.sessions] == ["algo-2"]
    assert sorted(lost(said)) == [
        "refused: its ranks' output cannot reach this log: it could not be asked to stream them; the job goes on",
        "silent: its ranks' output cannot reach this log: its stream did not open within 1 s; the job goes on",
    ]
    output.stop(30.0)
    assert len(lost(said)) == 2
    workers.end()


def test_a_stream_that_ends_during_the_run_is_said_once(tmp_path):
    said, loop = [], HostLoop()
    workers = Workers({"algo-2": str(tmp_path / "out")})
    output = start(leader_plan(("algo-2",)), workers, loop=loop, said=said)
    workers.streams["algo-2"].end(30.0)  # the worker's part ended under the run
    loop.wait(lambda: bool(lost(said)), time.monotonic() + 60)  # the stream's end is an event on the loop
    output.stop(30.0)
    assert lost(said) == ["algo-2: its ranks' output cannot reach this log: its stream ended before mpirun did; "
                          "the job goes on"]


def test_a_stop_while_waiting_for_the_workers_ends_the_wait_and_their_streams(tmp_path):
    loop, said = HostLoop(), []
    loop.post(StopRequested(signal.SIGTERM))
    workers = Workers({"silent": str(tmp_path / "s")}, silent={"silent"})
    output = start(leader_plan(("silent",)), workers, loop=loop, said=said)
    assert output.sessions == [] and said == []  # no run starts: nothing of it is lost
    output.stop(30.0)
    assert not output.pump.thread.is_alive()


def test_the_leader_cutting_a_stream_ends_the_workers_follower(tmp_path):
    """A leader gone (its pump stopped) does not leave the worker's stream waiting."""
    workers = Workers({"algo-2": str(tmp_path / "out")})
    output = start(leader_plan(("algo-2",)), workers)
    output.pump.stop()
    workers.streams["algo-2"].thread.join(30.0)
    assert not workers.streams["algo-2"].thread.is_alive()


def opening_of(host="algo-2", nonce=NONCE, key=KEY, now=None) -> bytes:
    return build_opening(key, host, nonce, time.time() if now is None else now)


@pytest.mark.parametrize("make_line, why", [  # made when the test runs: a record signed at collection may be too old
    (lambda: opening_of(), None),
    (lambda: opening_of(nonce="f" * 32), "a rank-output stream of another run"),
    (lambda: opening_of(key="cd" * 32), "signed with another key"),
    (lambda: opening_of(now=0.0), "made before this job started (a replay)"),
    (lambda: b"BYOC-RANK-OUTPUT {}\n", "not signed"),
    (lambda: job_port.build_signed_line(KEY, job_port.build_record(job_port.JobOutcome(0), time.time())).encode(),
     "not a rank-output stream's opening"),
    (lambda: "\udcff".encode("utf-8", "surrogatepass") + b"\n", "not signed"),
])
def test_an_opening_counts_only_signed_with_the_jobs_key_for_this_run(make_line, why):
    host, said = parse_opening(make_line(), KEY, NONCE, time.time())
    assert (host, said) == (("algo-2", "") if why is None else (None, why))


def test_a_stream_is_taken_only_from_its_workers_addresses_once_and_in_time(tmp_path):
    """Each refusal is posted as the job port's are (the role logs the first few), and the
    worker's own stream is taken all the same."""
    loop, refused = HostLoop(), []
    loop.on({Refused: refused.append})
    plan = leader_plan(("algo-2", "algo-3"))
    workers = Workers({"algo-2": str(tmp_path / "a")})

    def hostile_then_real(message_of, within_s):
        port = message_of("algo-2").port
        nonce = message_of("algo-2").nonce
        attempts = [
            opening_of("algo-3", nonce),  # algo-3's addresses are not loopback here
            opening_of("algo-9", nonce),  # not a worker of this leader
            opening_of("algo-2", "e" * 32),  # another run
            b"x" * (job_port.MAX_MESSAGE_BYTES + 1),  # no line within the limit
            b"",  # says nothing: refused at message_read_timeout_s
        ]
        for data in attempts:
            sock = socket.create_connection(("127.0.0.1", port))
            held.append(sock)  # open until the end: the one that says nothing must not close
            sock.sendall(data)
            if data:
                sock.shutdown(socket.SHUT_WR)
        return workers.ask_each(message_of, within_s)

    held: list = []
    output = start_worker_output(plan, OutputCollector(), loop, {"stdout": Sink(), "stderr": Sink()}, lambda _: None,
                                 hostile_then_real, {"algo-2": LOOPBACK, "algo-3": frozenset({"10.9.9.9"})}, KEY)
    assert [s.host for s in output.sessions] == ["algo-2"]
    second = socket.create_connection(("127.0.0.1", output.pump.port))
    second.sendall(opening_of("algo-2", output.pump.nonce))  # algo-2 again
    loop.wait(lambda: len(refused) == 6, time.monotonic() + 60)
    assert sorted(r.why for r in refused) == sorted([
        "a rank-output stream: a stream for 'algo-3' not from that host's addresses",
        "a rank-output stream: 'algo-9' is not one of this leader's workers",
        "a rank-output stream: a rank-output stream of another run",
        "a rank-output stream: no first line",
        "a rank-output stream: its first line did not come in time",
        "a rank-output stream: a second stream for 'algo-2', or one after the wait for it",
    ])
    assert {r.sender for r in refused} == {"127.0.0.1"}
    output.stop(30.0)
    workers.end()
    for sock in (second, *held):
        sock.close()


@pytest.mark.parametrize("size, refused", [(job_port.MAX_MESSAGE_BYTES - 1, False), (job_port.MAX_MESSAGE_BYTES, False),
                                           (job_port.MAX_MESSAGE_BYTES + 1, True)])
def test_an_opening_waits_for_its_line_end_up_to_the_ports_limit(size, refused):
    """Just under, at and over MAX_MESSAGE_BYTES without a newline yet: waited for, or refused."""
    loop, seen = HostLoop(), []
    loop.on({Refused: seen.append})
    plan = leader_plan(("algo-2",), ready_s=0.5)
    # No refusal for its slowness here, however loaded the machine: only the size can refuse it.
    plan = plan._replace(settings=plan.settings._replace(message_read_timeout_s=3600.0))
    output = start_worker_output(plan, OutputCollector(), loop, {"stdout": Sink(), "stderr": Sink()}, lambda _: None,
                                 lambda message_of, within_s: {"algo-2": True}, {"algo-2": LOOPBACK}, KEY)
    sock = socket.create_connection(("127.0.0.1", output.pump.port))
    sock.sendall(b"y" * size)
    loop.wait(lambda: bool(seen), time.monotonic() + (60 if refused else 0.5))
    assert [r.why for r in seen] == (["a rank-output stream: no first line"] if refused else [])
    output.stop(30.0)
    sock.close()

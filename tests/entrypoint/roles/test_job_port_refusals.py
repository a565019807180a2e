"""What a host's log says of the messages its job port refuses (roles/peers.Peers.refuse):
the first MAX_REFUSED_LOGGED a line each, then one line with the exact count when the port
closes, whatever the kind, however many connections carried them (issue 62: 60 KB of unsigned
BYOC-HOST-DONE lines on one connection added 1,203 lines to the leader's log). Through the real
role, its real port on a real socket, and the real log writer; a valid word sent after the flood
is still taken."""

from __future__ import annotations

import json
import socket
import time

import pytest

from entrypoint.decide.specs import RuntimeFiles
from entrypoint.hosts.job_port import (HOST_DONE, AttemptWord, HostDone, HostFigures, HostLive, JobOutcome, LeaderAsk,
                                       MpiReady, Sent, Word, build_record, build_signed_line, send_message)
from entrypoint.job.paths import build_paths
from entrypoint.loop.events import Ask
from entrypoint.outcome.records import Outcome
from entrypoint.rank.record_errors import MARKER
from entrypoint.orchestrate import build_host
from entrypoint.roles.job_port import JobPortLeader, JobPortWorker
from entrypoint.roles.peers import MAX_REFUSED_LOGGED, build_refusal_line
from entrypoint.run.stop import Stop
from support.jobs import make_job, plan_for
from support.ports import free_port

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

LEADER, WORKER = "127.0.0.1", "127.0.0.2"  # the test's connections come from LEADER's address
REFUSAL = "ignored a message on the job port from "
COUNT = "the job port refused "
OTHER_KEY = "ef" * 32


def build_role(tmp_path, capfd, current: str):
    """The host `current` in a job of LEADER and WORKER with its real torchrun role, started: its
    job port open on a free port (roles/peers.Peers.start: the port, the peers' addresses, the
    handlers); what start-up logged is not the test's to count."""
    job = make_job(hosts=(LEADER, WORKER), current=current, hps={"sagemaker_torch_distributed_enabled": True},
                   environ={"BYOC_JOB_PORT": str(free_port())})
    plan = plan_for(job)._replace(files=RuntimeFiles(str(tmp_path / "run" / "job")))
    host = build_host(plan, build_paths({"SAGEMAKER_BASE_DIR": str(tmp_path)}), {}, Stop())
    assert isinstance(host.role, JobPortLeader if current == LEADER else JobPortWorker)
    assert host.role.start(host) is None and host.role.peers.key
    capfd.readouterr()
    return host


def say(role, text: bytes) -> bytes:
    """text on one connection to the role's port, and the port's answers (all of them: read until
    it closes). The port posts each line before it answers, so once this returns the role's
    loop holds every one, and handle_pending takes them: no wait, no deadline."""
    answers = b""
    with socket.create_connection((LEADER, role.plan.settings.job_port), timeout=60) as conn:
        try:
            conn.sendall(text)
            conn.shutdown(socket.SHUT_WR)
            while chunk := conn.recv(65536):
                answers += chunk
        except OSError:  # a reset, a broken pipe, not connected: the port already closed it
            pass  # (a line past its limit: it read what the limit holds, answered and closed)
    return answers


def build_unsigned_outcome(n: int) -> bytes:
    """An unsigned BYOC-HOST-DONE line of about 50 bytes, as in the issue (1,203 in 60 KB)."""
    return (HOST_DONE + json.dumps({"host": f"algo-{n}", "exit_code": 0}, separators=(",", ":")) + "\n").encode()


def build_bad_line(role, n: int) -> bytes:
    """The n-th of a cycle of lines the leader refuses, each a different way: unsigned words,
    another key, a replay, a forged sender, a word this host does not take, text that is no
    message at all, control characters, bytes that are not UTF-8, and a line past the port's
    length limit. Each is one refusal, wherever it falls in the cycle."""
    key, now = role.role.peers.key, time.time()

    def signed(message, key_hex: str = key, made: float = now) -> bytes:
        return build_signed_line(key_hex, build_record(message, made)).encode()

    cycle = [
        lambda: build_unsigned_outcome(n),
        lambda: (MARKER + json.dumps({"host": "algo-9", "rank": "0", "type": "E", "message": "m", "time": now})
                 + "\n").encode(),  # an unsigned root cause
        lambda: signed(HostDone(WORKER, 0), OTHER_KEY),  # another job's key
        lambda: signed(HostDone(WORKER, 0), made=now - 3600),  # made before the port opened
        lambda: signed(HostDone("algo-9", 1)),  # signed, but not one of this leader's workers
        lambda: signed(AttemptWord(Word.ENDED, 1, WORKER, 1)),  # a worker's word from another address
        lambda: signed(HostFigures(WORKER, "{}")),  # a worker's figures from another address
        lambda: signed(HostLive(WORKER, "{}")),
        lambda: signed(MpiReady(WORKER, "ssh-ed25519 " + "A" * 68)),  # an MPI word: not a torchrun host's
        lambda: signed(LeaderAsk(Ask.STACKS)),
        lambda: signed(JobOutcome(0, "x\ny")),
        lambda: b"GET / HTTP/1.1\r\n",  # text that is no message at all
        # (no \r, \x0b-\x0c, \x1c-\x1e, \x85 or \u2028 here: the port reads each as a line of its own)
        lambda: b"BYOC-HOST-DONE \x1b[2J\x00\xff\xfe\xed\xa0\x80 forged\x07\x7fline\n",
        lambda: b"BYOC-SIGNED " + b"0" * 64 + b" BYOC-ROOT-CAUSE {}\n",
        lambda: b"x" * 70_000,  # past MAX_MESSAGE_BYTES, no newline: cut at the limit, one line
        lambda: signed(HostFigures(WORKER, "again"), made=SIGNED_ONCE_AT),  # the same bytes each cycle: a replay
    ]
    assert len(cycle) == CYCLE
    return cycle[n % CYCLE]()


CYCLE = 16
CLAIMS_AN_OUTCOME = {0, 2, 3, 4, 12}  # build_bad_line's lines that claim to be a host's outcome
# Signed once, sent each cycle: from its second sending a replay ("received before", or, past the
# clock-skew window after this module loaded, "made before this job started": refused either way).
SIGNED_ONCE_AT = time.time()


def closed_log(role, capfd, close=None) -> list[str]:
    """The role closed (its port, then the count), and every line the log holds since it started.
    close: the role's own (the leader's); a worker's tells its leader first, here this very port,
    so its test runs the part every job-port role's close runs (Peers.close)."""
    role.role.close(role, Outcome(0)) if close is None else close()
    return capfd.readouterr().err.splitlines()


def check_log(lines: list[str], refused: int, outcomes: int | None = None) -> None:
    """At most MAX_REFUSED_LOGGED refusal lines, then the count, once, last, exact; nothing else."""
    logged = [line for line in lines if line.startswith("[entrypoint] " + REFUSAL)]
    counts = [line for line in lines if line.startswith("[entrypoint] " + COUNT)]
    assert len(logged) == min(refused, MAX_REFUSED_LOGGED)
    assert lines == logged + counts  # one line each: nothing a sender wrote broke one in two
    if refused <= MAX_REFUSED_LOGGED:
        assert counts == []
        return
    claimed = f", {outcomes} of them claiming to be a host's outcome" if outcomes else ""
    assert counts == [f"[entrypoint] {COUNT}{refused} message(s) in all{claimed}; "
                      f"{refused - MAX_REFUSED_LOGGED} after the first {MAX_REFUSED_LOGGED} were not logged"]
    assert logged[-1].endswith("(further ones are counted, not logged: their number is said when the port closes)")


def check_still_takes_a_workers_outcome(role) -> None:
    assert send_message(LEADER, role.plan.settings.job_port, role.role.peers.key, HostDone(WORKER, 3)) is \
        Sent.DELIVERED
    role.loop.handle_pending()
    assert role.role.worker_outcomes == {WORKER: 3}


@pytest.mark.parametrize("lines", [4, 5, 6, pytest.param(0, id="60KB")])  # 0: as many as 60 KB holds
def test_unsigned_host_outcomes_on_one_connection_log_five_lines_then_one_count(tmp_path, capfd, lines):
    leader = build_role(tmp_path, capfd, LEADER)
    flood = b""
    while (len(flood) < 60_000) if lines == 0 else (flood.count(b"\n") < lines):
        flood += build_unsigned_outcome(flood.count(b"\n"))
    refused = flood.count(b"\n")
    assert lines or refused > 1_000
    try:
        answers = say(leader, flood).splitlines()
        assert len(answers) == refused and all(a.startswith(b"BYOC-REFUSED ") for a in answers)
        leader.loop.handle_pending()
        check_still_takes_a_workers_outcome(leader)
    finally:
        lines_logged = closed_log(leader, capfd)
    check_log(lines_logged, refused, outcomes=refused)
    assert "a host's outcome, not signed" in lines_logged[0]
    assert leader.role.peers.refused_messages == leader.role.peers.refused_outcomes == refused


@pytest.mark.parametrize("connections", [4, 5, 6, 45])
def test_many_connections_each_with_one_bad_line_of_any_kind_are_counted_together(tmp_path, capfd, connections):
    leader = build_role(tmp_path, capfd, LEADER)
    try:
        for n in range(connections):
            say(leader, build_bad_line(leader, n))
        leader.loop.handle_pending()
        check_still_takes_a_workers_outcome(leader)
    finally:
        lines = closed_log(leader, capfd)
    outcomes = sum(1 for n in range(connections) if n % CYCLE in CLAIMS_AN_OUTCOME)
    check_log(lines, connections, outcomes)
    assert (leader.role.peers.refused_messages, leader.role.peers.refused_outcomes) == (connections, outcomes)


def test_a_flood_of_every_kind_on_one_connection_and_one_line_each_on_many_are_one_count(tmp_path, capfd):
    """Mixed: 60 KB of cycled kinds on one connection, then 30 connections of one line each;
    the count is the total, the log stays five lines and one."""
    leader = build_role(tmp_path, capfd, LEADER)
    flood, n = b"", 0
    while len(flood) < 60_000:
        line = build_bad_line(leader, n)
        if not line.endswith(b"\n"):  # the over-long one would end the connection's lines
            n += 1
            continue
        flood, n = flood + line, n + 1
    refused = flood.count(b"\n")
    try:
        say(leader, flood)
        for m in range(30):
            say(leader, build_bad_line(leader, m))
        leader.loop.handle_pending()
        check_still_takes_a_workers_outcome(leader)
    finally:
        lines = closed_log(leader, capfd)
    assert len(lines) == MAX_REFUSED_LOGGED + 1
    assert lines[-1].startswith(f"[entrypoint] {COUNT}{refused + 30} message(s) in all")
    assert leader.role.peers.refused_messages == refused + 30


def test_a_worker_counts_its_refusals_the_same_way_and_still_takes_a_root_cause(tmp_path, capfd):
    worker = build_role(tmp_path, capfd, WORKER)
    flood = b""
    while len(flood) < 60_000:
        flood += build_unsigned_outcome(flood.count(b"\n"))
    signed_outcome = build_signed_line(worker.role.peers.key, build_record(HostDone(WORKER, 0), time.time())).encode()
    refused = flood.count(b"\n") + 1  # and a signed outcome: a worker takes none
    try:
        say(worker, flood + signed_outcome)
        record = MARKER + json.dumps({"host": LEADER, "rank": "0", "type": "E", "message": "kept", "time": time.time()})
        assert say(worker, build_signed_line(worker.role.peers.key, record).encode()) == b"BYOC-TAKEN\n"
        worker.loop.handle_pending()
        assert [cause.message for cause in worker.collector.root_causes] == ["kept"]
    finally:
        lines = closed_log(worker, capfd, worker.role.peers.close)
    check_log(lines, refused, outcomes=refused)
    assert worker.role.peers.refused_messages == refused


@pytest.mark.parametrize("why", ["line\nforged", "\x1b[2J\x00\r", "h\ud800st \udcff", "\u2028tab\there", "x" * 300])
def test_a_refusal_line_is_one_readable_line_through_the_real_writer(capfd, why):
    from entrypoint.log import log

    log(build_refusal_line("10.0.0.9", why, 1))
    lines = capfd.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"[entrypoint] {REFUSAL}10.0.0.9: ")
    assert lines[0].replace("\t", " ").isprintable()
    assert build_refusal_line("10.0.0.9", why, MAX_REFUSED_LOGGED + 1) is None

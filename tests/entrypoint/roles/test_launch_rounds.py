"""The leader's launch steps over SSH are one round each, not one session after another:
probe_workers, tell_workers and ask_workers_for_stacks (entrypoint/roles/mpi.py) run every
worker's session at once, at most MAX_PARALLEL_SESSIONS at a time, and a worker whose SSH
port does not answer costs a TCP connect, not an ssh process.

`ssh` here is a real executable on PATH, a stand-in that records its argv, its stdin and when
it ran, and holds its session open (a barrier on files) until the number of sessions the test
expects run at once. Run one after another, the first session would wait out the barrier's
deadline alone, and the sessions' lifetimes would not overlap. The proof is overlap of the
sessions' lifetimes and the number running at once, as the sessions themselves saw it,
never elapsed time."""

from __future__ import annotations

import json
import os
import shlex
import socket
import stat
from pathlib import Path

import pytest

from entrypoint.hosts import mpi_wire as mpi_hosts, ssh
from entrypoint.decide.specs import RuntimeFiles
from support.jobs import make_job, plan_for
from support.jobtree import PYTHON

# The stand-in holds a session until FAKE_SSH_TARGET sessions run at once or every one of the
# FAKE_SSH_HOSTS sessions has started (the last round under a cap is smaller than the cap),
# then lingers LINGER_S still counting, so sessions beyond a cap would be seen; at most
# BARRIER_S, after which no later session waits (sessions run one after another fail in
# seconds, not minutes). `python -S`: the stand-in needs nothing but the standard library.
BARRIER_S = 8.0
FAKE_SSH = f"""#!{PYTHON} -S
import json, os, sys, time
start = time.monotonic()
record = os.environ["FAKE_SSH_DIR"]
host = sys.argv[3]
running, started = os.path.join(record, "running"), os.path.join(record, "started")
open(os.path.join(running, host), "w").close()
open(os.path.join(started, host), "w").close()
target, total = int(os.environ["FAKE_SSH_TARGET"]), int(os.environ["FAKE_SSH_HOSTS"])
missed = os.path.join(record, "barrier-missed")
peak, reached, deadline = 0, None, start + {BARRIER_S}
while not os.path.exists(missed):  # one session that waited in vain is proof enough: no more waits
    peak = max(peak, len(os.listdir(running)))
    if reached is None and (peak >= target or len(os.listdir(started)) >= total):
        reached = time.monotonic()
    if reached is not None and time.monotonic() - reached >= {{linger}}:
        break
    if time.monotonic() >= deadline:
        open(missed, "w").close()
        break
    time.sleep(0.01)
stdin = sys.stdin.buffer.read().decode() if os.environ.get("FAKE_SSH_READ_STDIN") else None
os.remove(os.path.join(running, host))
refused = host in os.environ.get("FAKE_SSH_REFUSE", "").split(",")
with open(os.path.join(record, host + ".json"), "w") as f:
    json.dump({{"argv": sys.argv[1:], "stdin": stdin, "start": start, "end": time.monotonic(),
               "peak": peak, "barrier_met": reached is not None}}, f)
if refused:
    sys.stderr.write("Permission denied (publickey).\\n")
    sys.exit(255)
"""
LINGER_S = 0.3


@pytest.fixture
def fake_ssh(tmp_path, monkeypatch):
    """Put the stand-in `ssh` first on PATH; returns a function that sets how many sessions
    it expects (target at once, total) and one that reads its records: {host: record}."""
    bin_dir, record = tmp_path / "bin", tmp_path / "sessions"
    for folder in (bin_dir, record / "running", record / "started"):
        folder.mkdir(parents=True)
    program = bin_dir / "ssh"
    program.write_text(FAKE_SSH.replace("{linger}", str(LINGER_S)))
    program.chmod(program.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SSH_DIR", str(record))

    def expect(target: int, total: int, refuse: tuple[str, ...] = (), read_stdin: bool = False) -> None:
        monkeypatch.setenv("FAKE_SSH_TARGET", str(target))
        monkeypatch.setenv("FAKE_SSH_HOSTS", str(total))
        monkeypatch.setenv("FAKE_SSH_REFUSE", ",".join(refuse))
        if read_stdin:
            monkeypatch.setenv("FAKE_SSH_READ_STDIN", "1")

    def sessions() -> dict[str, dict]:
        return {p.stem: json.loads(p.read_text()) for p in record.glob("*.json")}

    return expect, sessions


@pytest.fixture
def listening_hosts():
    """Hosts 127.0.0.2, 127.0.0.3, … whose port (the same on each) answers TCP connects: a
    listening socket the kernel completes handshakes for. Returns a function of the count
    that gives (hosts, port)."""
    sockets: list[socket.socket] = []

    def listen(count: int) -> tuple[list[str], int]:
        hosts = [f"127.0.0.{i}" for i in range(2, 2 + count)]
        for _ in range(20):
            first = socket.create_server((hosts[0], 0), backlog=128)
            port = first.getsockname()[1]
            group = [first]
            try:
                group += [socket.create_server((h, port), backlog=128) for h in hosts[1:]]
            except OSError:  # that port is taken on one of the addresses: another port
                for s in group:
                    s.close()
                continue
            sockets.extend(group)
            return hosts, port
        raise RuntimeError("no port free on every 127.0.0.x address")

    yield listen
    for s in sockets:
        s.close()


def _plan(tmp_path: Path, workers: list[str]):
    plan = plan_for(make_job(hosts=("algo-1", *workers), current="algo-1", hps={"sagemaker_mpi_enabled": True}))
    return plan._replace(files=RuntimeFiles(str(tmp_path / "job")))


def _all_at_once(records: list[dict]) -> bool:
    """Every session had started before any of them ended."""
    return max(r["start"] for r in records) < min(r["end"] for r in records)


# --- probe_workers -------------------------------------------------------------------------------


def test_probe_runs_every_answering_workers_session_at_once_and_none_for_a_closed_port(
        tmp_path, fake_ssh, listening_hosts):
    expect, sessions = fake_ssh
    answering, port = listening_hosts(6)
    closed = "127.0.0.99"  # nothing listens there on that port: the connect is refused
    refusing = answering[-1]  # its port answers, its sshd does not accept us (yet)
    expect(target=len(answering), total=len(answering), refuse=(refusing,))
    files = ssh.SshFiles(str(tmp_path / "ssh"))

    accepted = mpi_hosts.probe_workers(files, [*answering[:3], closed, *answering[3:]], port)

    assert accepted == set(answering) - {refusing}
    ran = sessions()
    assert sorted(ran) == sorted(answering)  # no ssh process for the closed port
    assert all(r["argv"] == ["-F", files.client_config, h, "true"] for h, r in ran.items())
    assert all(r["barrier_met"] for r in ran.values())
    assert _all_at_once(list(ran.values()))
    assert {r["peak"] for r in ran.values()} == {len(answering)}


def test_probe_of_only_closed_ports_starts_no_ssh_at_all(tmp_path, fake_ssh, listening_hosts):
    expect, sessions = fake_ssh
    _, port = listening_hosts(1)
    expect(target=1, total=1)
    closed = ["127.0.0.97", "127.0.0.98"]
    assert mpi_hosts.probe_workers(ssh.SshFiles(str(tmp_path / "ssh")), closed, port) == set()
    assert sessions() == {}


# --- every launch step: one round, capped ----------------------------------------------------------


def _run_step(step: str, tmp_path: Path, hosts: list[str], port: int) -> None:
    logged: list[str] = []
    if step == "probe_workers":
        assert mpi_hosts.probe_workers(ssh.SshFiles(str(tmp_path / "ssh")), hosts, port) == set(hosts)
    elif step == "tell_workers":
        mpi_hosts.tell_workers(_plan(tmp_path, hosts), 0, None, logged.append)
    else:
        mpi_hosts.ask_workers_for_stacks(_plan(tmp_path, hosts), logged.append)
    assert logged == []


STEPS = ["probe_workers", "tell_workers", "ask_workers_for_stacks"]


@pytest.mark.parametrize("step", STEPS)
def test_each_launch_step_runs_all_its_sessions_at_the_same_time(step, tmp_path, fake_ssh, listening_hosts):
    expect, sessions = fake_ssh
    hosts, port = listening_hosts(5)
    expect(target=len(hosts), total=len(hosts))
    _run_step(step, tmp_path, hosts, port)
    ran = list(sessions().values())
    assert len(ran) == len(hosts)
    assert all(r["barrier_met"] for r in ran)  # none waited out the barrier alone
    assert _all_at_once(ran)


@pytest.mark.parametrize("step", STEPS)
def test_each_launch_step_runs_at_most_the_cap_of_sessions_at_once(step, tmp_path, fake_ssh, listening_hosts,
                                                                   monkeypatch):
    cap = 3
    monkeypatch.setattr(mpi_hosts, "MAX_PARALLEL_SESSIONS", cap)
    expect, sessions = fake_ssh
    hosts, port = listening_hosts(8)
    expect(target=cap, total=len(hosts))
    _run_step(step, tmp_path, hosts, port)
    ran = sessions()
    assert sorted(ran) == sorted(hosts)  # every worker had its session
    assert max(r["peak"] for r in ran.values()) == cap  # in parallel, never beyond the cap


# --- what the sessions carry ------------------------------------------------------------------------


def test_tell_workers_sends_each_worker_the_outcome_command_and_the_report_and_names_the_one_it_missed(
        tmp_path, fake_ssh):
    expect, sessions = fake_ssh
    workers = [f"algo-{i}" for i in range(2, 6)]
    expect(target=len(workers), total=len(workers), refuse=("algo-4",), read_stdin=True)
    plan = _plan(tmp_path, workers)
    logged: list[str] = []

    mpi_hosts.tell_workers(plan, 3, "RuntimeError: boom on algo-2 rank 1\n", logged.append)

    ran = sessions()
    assert sorted(ran) == workers  # not the leader itself
    command = mpi_hosts.build_tell_command(plan, 3)
    assert all(r["argv"] == ["-F", plan.files.ssh.client_config, h, command] for h, r in ran.items())
    assert all(r["stdin"] == "RuntimeError: boom on algo-2 rank 1\n" for r in ran.values())
    assert _all_at_once(list(ran.values()))
    assert logged == ["could not tell algo-4 the outcome: Permission denied (publickey)."]


def test_ask_workers_for_stacks_signals_each_workers_entrypoint_by_its_owner_file(tmp_path, fake_ssh):
    expect, sessions = fake_ssh
    workers = ["algo-2", "algo-3"]
    expect(target=len(workers), total=len(workers))
    plan = _plan(tmp_path, workers)
    logged: list[str] = []
    mpi_hosts.ask_workers_for_stacks(plan, logged.append)
    assert logged == []
    ran = sessions()
    owner = shlex.quote(plan.files.owner)
    assert {h: r["argv"] for h, r in ran.items()} == {
        h: ["-F", plan.files.ssh.client_config, h, f"kill -USR1 \"$(cut -d' ' -f1 {owner})\""] for h in workers}

"""The real MPI leader (roles/mpi.MpiLeader) against 255 light stand-in workers that speak the
real job-port words with the job's key (tests/support/mpi_stand_ins.py, one other process):
readiness, every host's key to every worker, an ask, and the outcome, each to every worker at
once, with the leader's threads bounded whatever the number of hosts. Not an SSH session, not a
thread a worker. Each stand-in has its own loopback address, which the leader checks its words
against; the leader's port is on another port number than the workers' (one machine)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from entrypoint.decide.specs import RuntimeFiles
from entrypoint.hosts import job_port
from entrypoint.job.paths import build_paths
from entrypoint.loop import Waited
from entrypoint.outcome.records import Outcome
from entrypoint.roles import peers as peers_role
from entrypoint.orchestrate import build_host
from entrypoint.roles.peers import decide_job_key
from entrypoint.roles.mpi import MpiLeader
from entrypoint.run.stop import Stop
from support.jobs import make_job, plan_for
from support.mpi_stand_ins import stand_in_address, stand_in_key
from support.ports import free_port

STAND_INS = Path(__file__).resolve().parents[2] / "support" / "mpi_stand_ins.py"
LEADER = "127.0.0.1"


def build_leader(tmp_path, workers: list[str], environ: dict[str, str]):
    job = make_job(hosts=(LEADER, *workers), current=LEADER, hps={"sagemaker_mpi_enabled": True}, environ=environ)
    plan = plan_for(job)._replace(files=RuntimeFiles(str(tmp_path / "run" / "job")))
    env = {**environ, **plan.env_dict}
    host = build_host(plan, build_paths({"SAGEMAKER_BASE_DIR": str(tmp_path)}), env, Stop())
    assert isinstance(host.role, MpiLeader)
    return host


class ThreadPeak:
    """The most threads this process ran at once while it watched, beyond those it ran when it
    began (earlier tests' daemon threads, the process's sender pool once made); itself not
    counted."""

    def __init__(self):
        self.base = threading.active_count()
        self.peak, self._done = 0, threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self):
        while not self._done.wait(0.002):
            self.peak = max(self.peak, threading.active_count())

    def stop(self) -> int:
        """The threads added at the peak."""
        self._done.set()
        self._thread.join()
        return self.peak - 1 - self.base


@pytest.fixture
def leader_port(monkeypatch):
    """The leader's job port on a port of its own (the stand-ins hold the workers' on every
    loopback address they use)."""
    port = free_port()
    real = job_port.JobPort
    monkeypatch.setattr(peers_role, "JobPort", lambda _port, *args, **kwargs: real(port, *args, **kwargs))
    return port


def test_255_workers_are_ready_keyed_asked_and_told_at_once_by_a_leader_of_at_most_16_threads(tmp_path, leader_port):
    count, worker_port = 255, free_port()
    workers = [stand_in_address(i) for i in range(count)]
    host = build_leader(tmp_path, workers, {"BYOC_JOB_PORT": str(worker_port), "BYOC_PEER_WAIT_TIMEOUT_S": "120"})
    stand_ins = subprocess.Popen([sys.executable, str(STAND_INS), str(count), str(leader_port), str(worker_port),
                                  decide_job_key(host.plan)], stdout=subprocess.PIPE, text=True)
    try:
        assert stand_ins.stdout.readline() == "listening\n"
        peak = ThreadPeak()
        assert host.role.start(host) is None, host.collector.tail
        assert host.role.ready
        leader_key = (tmp_path / "run" / "job" / "ssh" / "host_ed25519_key.pub").read_text().split()[:2]
        known_hosts = (tmp_path / "run" / "job" / "ssh" / "known_hosts").read_text()
        asked: list = []
        handlers = host.loop.on({job_port.Delivered: asked.append})
        host.role.ask_other_hosts(host)  # off the loop, as a hang's ask is; every worker takes it
        assert host.loop.wait(lambda: len(asked) == count, time.monotonic() + 120) is Waited.DONE
        host.loop.off(handlers)
        assert all(d.delivered for d in asked)
        host.role.close(host, Outcome(1, "RuntimeError: boom on rank 7\n"))
        threads = peak.stop()
        report = json.loads(stand_ins.stdout.readline())
    finally:
        stand_ins.kill()
        stand_ins.wait()
    # Beside the main thread: the port's and the 12 senders at most (fewer when the pool was made
    # before), never one a worker.
    assert threads <= 15, threads
    assert report["refused"] == []
    # Every host's key, the leader's first, each with the address it came from, to every worker.
    expected = [[LEADER, [LEADER], " ".join(leader_key)], *([w, [w], stand_in_key(i)] for i, w in enumerate(workers))]
    assert all(report["keys"][str(i)] == expected for i in range(count))
    assert known_hosts.count("\n") == count + 1 and f"{workers[-1]} {stand_in_key(count - 1)}\n" in known_hosts
    # The outcome reached every worker, with the leader's failure, once; the stacks ask too.
    assert report["outcomes"] == {str(i): [1, "RuntimeError: boom on rank 7\n"] for i in range(count)}
    assert report["asks"] == {str(i): ["stacks"] for i in range(count)}
    assert not (tmp_path / "run" / "job" / "ssh" / "host_ed25519_key").exists()  # the job's key is gone


def test_a_worker_that_never_says_it_is_ready_is_named_at_the_deadline_and_the_others_are_told(tmp_path, leader_port):
    count, worker_port = 20, free_port()
    workers = [stand_in_address(i) for i in range(count)]
    silent = stand_in_address(count)  # in the job, served by nobody
    host = build_leader(tmp_path, [*workers, silent], {"BYOC_JOB_PORT": str(worker_port), "BYOC_PEER_WAIT_TIMEOUT_S": "3"})
    stand_ins = subprocess.Popen([sys.executable, str(STAND_INS), str(count), str(leader_port), str(worker_port),
                                  decide_job_key(host.plan)], stdout=subprocess.PIPE, text=True)
    try:
        assert stand_ins.stdout.readline() == "listening\n"
        outcome = host.role.start(host)
        assert outcome is not None and outcome.exit_code == 1
        said = f"host(s) {silent} did not say they serve SSH within 3 s (BYOC_PEER_WAIT_TIMEOUT_S)"
        assert said in host.collector.tail, host.collector.tail
        assert not host.role.ready
        host.role.close(host, outcome)
        report = json.loads(stand_ins.stdout.readline())
    finally:
        stand_ins.kill()
        stand_ins.wait()
    assert report["keys"] == {str(i): [] for i in range(count)}  # no key list went out
    assert all(code == 1 and said in text for code, text in report["outcomes"].values())
    assert len(report["outcomes"]) == count


def test_a_worker_whose_leader_never_opens_its_port_fails_at_its_deadline_naming_it(tmp_path, monkeypatch):
    """The worker's readiness is tried until the leader's port opens (a leader still starting),
    and no longer than BYOC_PEER_WAIT_TIMEOUT_S; its sshd and key are gone after."""
    own_port = free_port()
    real = job_port.JobPort
    monkeypatch.setattr(peers_role, "JobPort", lambda _port, *args, **kwargs: real(own_port, *args, **kwargs))
    worker = stand_in_address(0)
    environ = {"BYOC_JOB_PORT": str(free_port()), "BYOC_PEER_WAIT_TIMEOUT_S": "2", "BYOC_SSH_PORT": str(free_port())}
    job = make_job(hosts=(LEADER, worker), current=worker, hps={"sagemaker_mpi_enabled": True}, environ=environ)
    plan = plan_for(job)._replace(files=RuntimeFiles(str(tmp_path / "run" / "job")))
    env = {**environ, **plan.env_dict}
    host = build_host(plan, build_paths({"SAGEMAKER_BASE_DIR": str(tmp_path)}), env, Stop())
    started = time.monotonic()
    outcome = host.role.start(host)
    assert time.monotonic() - started >= 2  # tried until its deadline, not given up on the first refusal
    assert outcome is not None and outcome.exit_code == 1
    assert f"the leader {LEADER} did not answer on its job port" in outcome.reason and "within 2 s" in outcome.reason
    assert host.role.sshd is not None and host.role.sshd.poll() is None  # it served SSH while it waited
    host.role.close(host, outcome)
    assert host.role.sshd.poll() is not None
    assert not (tmp_path / "run" / "job" / "ssh" / "host_ed25519_key").exists()


def test_a_worker_says_it_serves_ssh_only_once_its_sshd_accepts_connections(tmp_path, monkeypatch):
    """sshd binds its port a moment after it starts; a leader told before opens a session that is
    refused (seen on a slower machine: the rank-output session to algo-2, "Connection refused",
    and the worker's ranks' lines lost). Here sshd's stand-in binds 1 s late, and the leader's
    port notes, as each word arrives, whether the worker's SSH port accepts."""
    from entrypoint.hosts.net import can_connect
    from entrypoint.roles import mpi as mpi_role

    own_port, leader_port, ssh_port = free_port(), free_port(), free_port()
    real = job_port.JobPort
    monkeypatch.setattr(peers_role, "JobPort", lambda _port, *args, **kwargs: real(own_port, *args, **kwargs))
    late_sshd = f"import socket, time; time.sleep(1); s = socket.create_server(('', {ssh_port})); time.sleep(600)"
    monkeypatch.setattr(mpi_role, "start_sshd", lambda files: subprocess.Popen([sys.executable, "-c", late_sshd]))
    worker = stand_in_address(0)
    environ = {"BYOC_JOB_PORT": str(leader_port), "BYOC_PEER_WAIT_TIMEOUT_S": "2", "BYOC_SSH_PORT": str(ssh_port)}
    job = make_job(hosts=(LEADER, worker), current=worker, hps={"sagemaker_mpi_enabled": True}, environ=environ)
    plan = plan_for(job)._replace(files=RuntimeFiles(str(tmp_path / "run" / "job")))
    env = {**environ, **plan.env_dict}
    host = build_host(plan, build_paths({"SAGEMAKER_BASE_DIR": str(tmp_path)}), env, Stop())
    heard: list = []
    leader = real(leader_port, lambda message: heard.append((type(message).__name__,
                                                             can_connect("127.0.0.1", ssh_port))),
                  job_key=decide_job_key(host.plan))
    try:
        outcome = host.role.start(host)  # no keys ever come: it ends at its deadline
    finally:
        leader.close()
        if host.role.sshd is not None:
            host.role.sshd.kill()
            host.role.sshd.wait()
    assert outcome is not None and outcome.exit_code == 1
    assert heard[:1] == [("MpiReady", True)], heard  # told only once its SSH port accepted

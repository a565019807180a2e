"""The real roles' own ordering rules (roles/mpi.py, roles/job_port.py), driven through
cli.main with stand-ins for their transports (no other host, no sshd, no port): what each
step does, in which order, around the one write of output/, and what a SIGTERM at a step
does to the steps after it (the job's one stop token, run/stop.py). End to end on emulated
hosts: tests/multihost."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from support.jobtree import write_tree  # noqa: E402

from entrypoint import cli  # noqa: E402
from entrypoint.outcome.records import SUCCESS  # noqa: E402
from entrypoint.roles import mpi as mpi_role, peers as peers_role  # noqa: E402
from entrypoint import orchestrate  # noqa: E402
from entrypoint.hosts import job_port  # noqa: E402
from entrypoint.hosts.job_port import HostFigures  # noqa: E402
from entrypoint.loop import Waited  # noqa: E402

MPI = {"sagemaker_mpi_enabled": True}
TORCH = {"sagemaker_torch_distributed_enabled": True}


@pytest.fixture
def host(tmp_path, monkeypatch):
    """cli.main as one host of a 2-host job, every other host a stand-in; returns (main,
    events, written): written() names what output/ holds right now."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2,
                                              signal.SIGALRM)}
    for name in list(os.environ):
        if name.startswith(("SM_", "SAGEMAKER_", "BYOC_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("BYOC_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("BYOC_COMPILE_CACHE", "0")
    monkeypatch.setattr(peers_role, "wait_for_hosts", lambda hosts, timeout_s, loop: [])  # every name resolves
    root = tmp_path / "ml"
    events: list = []

    def written() -> list[str]:
        return [name for name in ("success", "failure") if (root / "output" / name).exists()]

    def main(current: str, hyperparameters: dict) -> int:
        write_tree(root, hosts=("algo-1", "algo-2"), current_host=current, hyperparameters=hyperparameters,
                   script="print('trained')\n")
        monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(root))
        return cli.main(["train"])

    yield main, events, written
    for s, handler in saved.items():
        signal.signal(s, handler)


def sigterm_then_wait(loop) -> bool:
    """A step that gets SIGTERM, then waits on a peer that never answers, as the real waits do:
    on the host's loop. Whether the stop ended the wait."""
    os.kill(os.getpid(), signal.SIGTERM)
    return loop.wait(deadline=time.monotonic() + 3600) is Waited.STOPPED


# --- the MPI worker: sshd from start to close ----------------------------------------------------

@pytest.fixture
def mpi_worker(host, monkeypatch):
    main, events, written = host

    class StandInPort:  # the job port opens; nothing reaches it
        def __init__(self, *args, **kwargs):
            pass

        def close(self):
            events.append("close the job port")

    def start_ssh(self, host):
        events.append(("start sshd", written()))
        self.sshd = "sshd"
        return None

    def run_attempt(self, host, hooks):
        events.append(("serve until the outcome", self.sshd))
        return self.build_outcome(host, mpi_role.WorkerOutcome(0))

    monkeypatch.setattr(peers_role, "JobPort", StandInPort)
    monkeypatch.setattr(mpi_role.MpiWorker, "start_ssh", start_ssh)
    monkeypatch.setattr(mpi_role.MpiWorker, "run_attempt", run_attempt)
    monkeypatch.setattr(mpi_role, "stop_worker", lambda plan, sshd: events.append(("stop sshd", sshd, written())))
    return main, events, written


def test_an_mpi_worker_serves_ssh_from_start_and_stops_it_only_after_its_outcome_is_written(mpi_worker):
    main, events, written = mpi_worker
    assert main("algo-2", MPI) == 0
    assert events == [("start sshd", []), ("serve until the outcome", "sshd"), ("stop sshd", "sshd", ["success"]),
                      "close the job port"]


def test_an_mpi_worker_stopped_while_its_leader_has_not_started_still_stops_sshd(mpi_worker, monkeypatch):
    main, events, written = mpi_worker

    def start_ssh(self, host):
        saw = sigterm_then_wait(host.loop)
        events.append(("start: saw the stop", saw))
        return self.ended_before_start(host, "never reached")

    monkeypatch.setattr(mpi_role.MpiWorker, "start_ssh", start_ssh)
    assert main("algo-2", MPI) == 143
    assert events == [("start: saw the stop", True), ("stop sshd", None, ["failure"]), "close the job port"]


# --- the MPI leader: the workers' figures, then the outcome on every worker, then its key gone ---

def test_an_mpi_leader_tells_its_workers_after_its_outcome_is_written_then_closes_its_port(host, monkeypatch):
    main, events, written = host

    class StandInPort:
        def __init__(self, *args, **kwargs):
            pass

        def close(self):
            events.append("close the job port")

    def start_ssh(self, host):
        events.append("workers ready")
        self.ready = True

    monkeypatch.setattr(peers_role, "JobPort", StandInPort)
    monkeypatch.setattr(mpi_role.MpiLeader, "start_ssh", start_ssh)
    monkeypatch.setattr(orchestrate, "run_attempt", lambda *args: events.append("mpirun") or SUCCESS)
    monkeypatch.setattr(mpi_role.MpiLeader, "tell_workers",
                        lambda self, host, code, report: events.append(("tell the workers", code, written())))
    assert main("algo-1", MPI) == 0
    assert events == ["workers ready", "mpirun", ("tell the workers", 0, ["success"]), "close the job port"]


# --- the torchrun/PS worker: its figures, then its word to the leader, then the leader's end ------

@pytest.fixture
def job_port_worker(host, monkeypatch):
    main, events, written = host

    class StandInPort:
        def __init__(self, *args, **kwargs):
            events.append("open the job port")

        def close(self):
            events.append("close the job port")

    monkeypatch.setattr(peers_role, "JobPort", StandInPort)
    monkeypatch.setattr(orchestrate, "run_attempt", lambda *args: events.append("torchrun") or SUCCESS)
    return main, events, written


def test_a_torchrun_worker_sends_its_figures_then_its_outcome_then_waits_for_the_leader(job_port_worker, monkeypatch):
    main, events, written = job_port_worker

    def deliver(loop, host, port, key, message, within_s, settings, until_open=False):
        events.append(("figures", written()) if isinstance(message, HostFigures) else ("outcome", message.exit_code))
        return True

    monkeypatch.setattr(job_port, "deliver", deliver)
    monkeypatch.setattr(peers_role.Peers, "wait_until_closed",
                        lambda self, *a, **k: events.append("wait for the leader"))
    assert main("algo-2", TORCH) == 0
    assert events == ["open the job port", "torchrun", ("figures", ["success"]), ("outcome", 0), "wait for the leader",
                      "close the job port"]


def test_a_sigterm_taken_while_a_worker_sends_its_figures_is_still_seen_by_its_close(job_port_worker, monkeypatch):
    """Before one token, the stop the report's wait took was lost: close then waited
    BYOC_PEER_WAIT_TIMEOUT_S (300 s) for a leader that was gone."""
    main, events, written = job_port_worker

    def deliver(loop, host, port, key, message, within_s, settings, until_open=False):
        if isinstance(message, HostFigures):
            events.append(("figures: saw the stop", sigterm_then_wait(loop)))
        else:
            loop.handle_pending()
            events.append(("outcome: stopped already", loop.stopped()))
        return False

    monkeypatch.setattr(job_port, "deliver", deliver)
    monkeypatch.setattr(peers_role.Peers, "wait_until_closed",
                        lambda self, *a, **k: events.append("wait for the leader"))
    assert main("algo-2", TORCH) == 0  # the outcome was written before the stop: it stands
    assert ("outcome: stopped already", True) in events
    assert "wait for the leader" not in events
    assert events[-1] == "close the job port"

"""An MPI worker's part of the rank-output stream (roles/mpi.MpiWorker.on_follow_ranks), with
the leader's real end (hosts/worker_output.start_worker_output): the worker follows the folder
its own plan names (its plan has no processes: mpirun on the leader starts its ranks), streams
to the address the ask came from, and takes the ask only from its leader's addresses."""

from __future__ import annotations

import os
import threading
import time

from entrypoint.decide.specs import RuntimeFiles
from entrypoint.hosts.job_port import FollowRanks
from entrypoint.hosts.worker_output import start_worker_output
from entrypoint.job.paths import build_paths
from entrypoint.loop import HostLoop
from entrypoint.orchestrate import build_host
from entrypoint.roles.peers import decide_job_key
from entrypoint.roles.mpi import MpiWorker
from entrypoint.run.stop import Stop
from entrypoint.run.supervise import OutputCollector
from support.jobs import make_job, plan_for
import pytest

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

LEADER, WORKER = "127.0.0.1", "127.0.0.2"


class Sink:
    def __init__(self):
        self.data, self.lock = b"", threading.Lock()

    def write(self, b):
        with self.lock:
            self.data += bytes(b)

    def flush(self):
        pass


def build_worker(tmp_path):
    """The host WORKER with its real MPI worker role, its leader's address as its start resolves it."""
    job = make_job(hosts=(LEADER, WORKER), current=WORKER, hps={"sagemaker_mpi_enabled": True})
    plan = plan_for(job)._replace(files=RuntimeFiles(str(tmp_path / "run" / "job")))
    env = {**plan.env_dict}
    host = build_host(plan, build_paths({"SAGEMAKER_BASE_DIR": str(tmp_path)}), env, Stop())
    assert isinstance(host.role, MpiWorker) and host.plan.processes == ()
    host.role.peers.addresses = {LEADER: [LEADER]}  # as Peers.open resolves them
    host.role.peers.key = decide_job_key(plan)
    return host


def leader_plan(worker_plan):
    plan = plan_for(make_job(hosts=(LEADER, WORKER), current=LEADER, hps={"sagemaker_mpi_enabled": True}))
    return plan._replace(job_key=worker_plan.job_key, settings=plan.settings._replace(rank_stream_timeout_s=5.0))


def test_a_worker_streams_its_own_plans_folder_to_the_leader_that_asked(tmp_path):
    worker = build_worker(tmp_path)
    folder = worker.plan.files.rank_output
    os.makedirs(os.path.join(folder, "1", "rank.1"))
    with open(os.path.join(folder, "1", "rank.1", "stdout"), "wb") as f:
        f.write(b"an earlier run's line\n")  # cleared before the stream opens

    def ask_each(message_of, within_s):
        worker.role.on_follow_ranks(worker, message_of(WORKER)._replace(sender=LEADER))
        return {WORKER: True}

    sinks, said = {"stdout": Sink(), "stderr": Sink()}, []
    plan = leader_plan(worker.plan)
    output = start_worker_output(plan, OutputCollector(), HostLoop(), sinks, said.append, ask_each,
                                 {WORKER: frozenset({"127.0.0.1"})}, plan.job_key)
    assert [s.host for s in output.sessions] == [WORKER], said
    assert not os.path.exists(folder)  # what an earlier run left is gone
    os.makedirs(os.path.join(folder, "1", "rank.1"))  # as this run's orted makes them
    with open(os.path.join(folder, "1", "rank.1", "stdout"), "ab") as f:
        f.write(b"hello from the worker's rank\n")
    deadline = time.monotonic() + 30
    while b"hello" not in sinks["stdout"].data:
        assert time.monotonic() < deadline, "the worker's line never came"
        time.sleep(0.01)
    output.stop(30.0)
    worker.role.end_rank_stream(worker)
    assert sinks["stdout"].data == b"[1,1]<stdout>:hello from the worker's rank\n"


def test_a_worker_takes_the_ask_only_from_its_leader(tmp_path):
    worker = build_worker(tmp_path)
    worker.role.on_follow_ranks(worker, FollowRanks(1, "0" * 32, sender="10.9.9.9"))
    assert worker.role.rank_stream is None and worker.role.peers.refused_messages == 1

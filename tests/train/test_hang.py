"""Hang detection (train/watchdog.py): a rank that stops making progress fails the job within
hang_timeout_s, every rank's Python stack is in the log, and output/failure names the stuck
rank and the call it is stuck in. Real processes: our entrypoint, mpirun, 2 ranks; one rank
stops in a call of its own, the other waits for it in an allreduce."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from support.jobtree import PYTHON, entrypoint_env, failure_text, write_tree  # noqa: E402

from train.config import TrainConfig  # noqa: E402
from train.watchdog import HANG_EXIT_CODE, build_hang_message  # noqa: E402

SCRIPT = """\
import time
from mpi4py import MPI
from train.watchdog import StepWatchdog

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
watchdog = StepWatchdog(2.0, rank, "algo-1").start()

def stuck_reading_a_file():
    time.sleep(600)  # as if blocked in I/O

for step in range(1000):
    if rank == 1 and step == 3:
        stuck_reading_a_file()
    comm.allreduce(step)
    watchdog.beat()
    time.sleep(0.05)
"""


def test_a_stuck_rank_fails_the_job_with_every_stack_and_where_it_is_stuck(tmp_path):
    # This machine's own name as the host: mpirun then starts both ranks here, without SSH,
    # as it does in a container named algo-1.
    host = socket.gethostname()
    root = write_tree(tmp_path, script=SCRIPT.replace("algo-1", host), program="hang.py", hosts=(host,), current_host=host,
                      hyperparameters={"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2})
    started = time.monotonic()
    done = subprocess.run([PYTHON, "-m", "entrypoint", "train"], env=entrypoint_env(root), capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    elapsed = time.monotonic() - started
    assert done.returncode != 0, done.stderr[-3000:]
    assert elapsed < 60  # within the timeout and the launcher's teardown, not at a collective's 30 min
    log = done.stdout + done.stderr
    assert f"[hang] no training step finished in 2 s on rank 1 (host {host}); it is stuck in stuck_reading_a_file" in log
    assert "in stuck_reading_a_file" in log and "(most recent call first)" in log  # rank 1's stack
    assert log.count("(most recent call first)") >= 2  # rank 0's stack too: it waits in the allreduce
    report = failure_text(root)
    assert report.startswith("TrainingHang: no training step finished in 2 s on rank ")
    assert "First failure: rank " in report and "Where:" in report


def test_the_hang_message_names_rank_host_and_call():
    import traceback

    frame = traceback.FrameSummary("/opt/ml/code/data.py", 42, "read_shard")
    assert build_hang_message(30, 3, "algo-2", frame) == (
        "no training step finished in 30 s on rank 3 (host algo-2); it is stuck in read_shard "
        "(/opt/ml/code/data.py:42). Every rank's stack is in the log. Raise hang_timeout_s if a step can take this long.")
    assert HANG_EXIT_CODE == 124


def test_the_trainers_hang_timeout_is_an_option_with_a_safe_default():
    assert TrainConfig().hang_timeout_s == 1800.0
    assert TrainConfig(hang_timeout_s=0).hang_timeout_s == 0  # off
    with pytest.raises(ValueError, match="hang_timeout_s must be >= 0"):
        TrainConfig(hang_timeout_s=-1)

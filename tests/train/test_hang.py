"""Hang detection (train/watchdog.py): a rank that stops making progress fails the job within
hang_timeout_s, every rank's Python stack is in the log, and output/failure names the stuck
rank and the call it is stuck in. Real processes: our entrypoint, mpirun, 2 ranks; one rank
stops in a call of its own, the other waits for it in an allreduce. Every rank's watchdog fires at
about the same time, and the job's root cause is the earliest report: the rank that only waits in
a collective reports a moment later, so the stuck one leads output/failure."""

from __future__ import annotations

import socket
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from support.jobtree import PYTHON, entrypoint_env, failure_text, write_tree  # noqa: E402

from train.config import TrainConfig  # noqa: E402
from train.watchdog import (HANG_EXIT_CODE, build_hang_message, decide_caller_frame, decide_collective_wait,  # noqa: E402
                            decide_report_delay)

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
        time.sleep(LATER_BY)  # work of its own after the step (a checkpoint, say): its last beat is later
        watchdog.beat()
        stuck_reading_a_file()
    comm.allreduce(step)
    watchdog.beat()
    time.sleep(0.05)
"""


@pytest.mark.parametrize("later_by", [0.0, 0.5], ids=["same-time", "stuck-rank-beat-last"])
def test_a_stuck_rank_fails_the_job_with_every_stack_and_where_it_is_stuck(tmp_path, later_by):
    """same-time: both ranks' last step ended together (the usual case: the race between their
    watchdogs). stuck-rank-beat-last: the rank waiting in the allreduce reaches its timeout first,
    and must still not be named the root cause."""
    # This machine's own name as the host: mpirun then starts both ranks here, without SSH,
    # as it does in a container named algo-1.
    host = socket.gethostname()
    script = SCRIPT.replace("algo-1", host).replace("LATER_BY", repr(later_by))
    root = write_tree(tmp_path, script=script, program="hang.py", hosts=(host,), current_host=host,
                      hyperparameters={"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2})
    # The guard against a hang (120 s) is far under a collective's 30 min: only the watchdog ends it in time.
    done = subprocess.run([PYTHON, "-m", "entrypoint", "train"], env=entrypoint_env(root), capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode != 0, done.stderr[-3000:]
    log = done.stdout + done.stderr
    assert f"[hang] no training step finished in 2 s on rank 1 (host {host}); it is stuck in stuck_reading_a_file" in log
    assert "in stuck_reading_a_file" in log and "(most recent call first)" in log  # rank 1's stack
    assert log.count("(most recent call first)") >= 2  # rank 0's stack too: it waits in the allreduce
    report = failure_text(root)
    first_line = report.splitlines()[0]
    script_path = root / "code" / "hang.py"
    assert first_line.startswith(f"TrainingHang: no training step finished in 2 s on rank 1 (host {host}); it is stuck "
                                 f"in stuck_reading_a_file ({script_path}:"), report[:2000]
    assert "First failure: rank 1 " in report and "Where:" in report
    if later_by:  # rank 0 reached its timeout first: its stack and what it waits in are in the log
        assert (f"[hang] no training step finished in 2 s on rank 0 (host {host}); it is waiting in a collective "
                f"(allreduce) in <module> ({script_path}:") in log


def test_the_hang_message_names_rank_host_and_call():
    summary = traceback.FrameSummary("/opt/ml/code/data.py", 42, "read_shard")
    assert build_hang_message(30, 3, "algo-2", summary) == (
        "no training step finished in 30 s on rank 3 (host algo-2); it is stuck in read_shard "
        "(/opt/ml/code/data.py:42). Every rank's stack is in the log. Raise hang_timeout_s if a step can take this long.")
    assert HANG_EXIT_CODE == 124


def test_the_trainers_hang_timeout_is_an_option_with_a_safe_default():
    assert TrainConfig().hang_timeout_s == 1800.0
    assert TrainConfig(hang_timeout_s=0).hang_timeout_s == 0  # off
    with pytest.raises(ValueError, match="hang_timeout_s must be >= 0"):
        TrainConfig(hang_timeout_s=-1)


def frame(filename: str, line: str, name: str = "train_step") -> traceback.FrameSummary:
    return traceback.FrameSummary(filename, 7, name, line=line)


SITE = "/usr/local/lib/python3.11/site-packages"


@pytest.mark.parametrize("innermost, in_process_group, waits_in", [
    (frame("/opt/ml/code/hang.py", "comm.allreduce(step)"), False, "allreduce"),  # mpi4py: C code, the caller's line
    (frame("/opt/ml/code/t.py", "self.comm.Allreduce(data, out, op=self._ops[op])"), False, "Allreduce"),
    (frame("/opt/ml/code/t.py", "self._MPI.Request.Waitall(self._requests)"), False, "Waitall"),
    (frame("/opt/ml/code/t.py", "comm.Barrier()"), False, "Barrier"),
    (frame("/opt/ml/code/t.py", "x = comm.bcast(offer, root=0)"), False, "bcast"),
    (frame("/opt/ml/code/t.py", "dist.all_reduce(tensor, op=op)"), False, "all_reduce"),
    (frame("/opt/ml/code/t.py", "dist.barrier()"), False, "barrier"),
    (frame("/opt/ml/code/t.py", "hvd.broadcast_parameters(model.state_dict(), root_rank=0)"), False,
     "broadcast_parameters"),
    (frame("/opt/ml/code/t.py", "optimizer.synchronize()"), False, "synchronize"),
    (frame(f"{SITE}/torch/distributed/distributed_c10d.py", "work.wait()", "all_reduce"), False, "all_reduce"),
    (frame(f"{SITE}/horovod/torch/mpi_ops.py", "return _allreduce_async(...)", "synchronize"), False, "synchronize"),
    (frame(f"{SITE}/torch/autograd/graph.py", "return Variable._execution_engine.run_backward(", "_engine_run_backward"),
     True, "backward (DDP's gradient allreduce)"),
    # stuck in a call of its own
    (frame(f"{SITE}/torch/autograd/graph.py", "return Variable._execution_engine.run_backward(", "_engine_run_backward"),
     False, None),  # no process group: a backward pass waits for no one
    (frame("/opt/ml/code/hang.py", "time.sleep(600)  # as if blocked in I/O"), False, None),
    (frame("/opt/ml/code/t.py", "data = sock.recv(1 << 20)"), False, None),
    (frame("/opt/ml/code/t.py", "ready.wait()"), False, None),
    (frame("/opt/ml/code/t.py", "chunk = stream.read(1 << 20)"), False, None),
    (frame("/opt/ml/code/t.py", "all_reduce_results = []"), False, None),  # a name, not a call
    (frame("/opt/ml/code/t.py", ""), False, None),  # no source line
])  # fmt: skip
def test_what_a_rank_waits_in_is_told_from_its_innermost_frame(innermost, in_process_group, waits_in):
    caller = frame("/opt/ml/code/train.py", "loss = step(batch)", "main")
    assert decide_collective_wait([caller, innermost], in_process_group) == waits_in
    assert decide_collective_wait([], in_process_group) is None


def test_a_rank_waiting_in_a_collective_reports_after_the_ranks_watchdogs_have_all_fired():
    assert decide_report_delay(2.0, 0.2, None) == 0
    assert decide_report_delay(1800.0, 5.0, None) == 0
    # Longer than the spread of the ranks' checks (check_every) and a clock difference between hosts.
    assert decide_report_delay(2.0, 0.2, "allreduce") == 2.0 + 0.4
    assert decide_report_delay(1800.0, 5.0, "allreduce") == 10.0 + 10.0


def test_the_message_of_a_rank_waiting_in_a_collective_says_so_and_where_it_called_it():
    stack = [frame("/opt/ml/code/train.py", "sync(t)", "main"), frame("/opt/ml/code/train.py", "dist.all_reduce(t)", "sync"),
             frame(f"{SITE}/torch/distributed/c10d_logger.py", "return func(*args)", "wrapper"),
             frame(f"{SITE}/torch/distributed/distributed_c10d.py", "work.wait()", "all_reduce")]  # fmt: skip
    assert decide_caller_frame(stack) is stack[1]
    assert decide_caller_frame(stack[2:]) is stack[-1]  # no frame of the job's own: the innermost
    assert build_hang_message(30, 0, "algo-1", stack[1], decide_collective_wait(stack)) == (
        "no training step finished in 30 s on rank 0 (host algo-1); it is waiting in a collective (all_reduce) in "
        "sync (/opt/ml/code/train.py:7), for a rank that has not joined it: look for a rank stuck elsewhere. "
        "Every rank's stack is in the log. Raise hang_timeout_s if a step can take this long.")

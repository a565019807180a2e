"""Hang detection for any program (entrypoint/outcome/hangs.py, BYOC_HANG_TIMEOUT_S): silence on every
rank for that long gets every rank's Python stack into the log and fails the job with 124,
naming where each rank was. Real processes: a single script, and 2 ranks under mpirun."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from support.jobtree import failure_text, run_entrypoint, write_tree  # noqa: E402

from entrypoint.decide.settings import parse_launch_settings  # noqa: E402
from entrypoint.errors import JobDefinitionError  # noqa: E402
from entrypoint.outcome.hangs import HANG_EXIT_CODE, Where, build_hang_reason, parse_stack_dumps  # noqa: E402

TAGGED = """\
[1,1]<stderr>:Thread 0x00007f0000000001 (most recent call first):
[1,1]<stderr>:  File "/usr/lib/python3.11/threading.py", line 320 in wait
[1,0]<stderr>:Current thread 0x00007f0000000002 (most recent call first):
[1,1]<stderr>:Current thread 0x00007f0000000003 (most recent call first):
[1,0]<stderr>:  File "/opt/ml/code/job.py", line 17 in <module>
[1,1]<stderr>:  File "/opt/ml/code/job.py", line 9 in read_shard
[1,1]<stderr>:  File "/opt/ml/code/job.py", line 15 in <module>
[1,2]<stderr>:Current thread 0x[1,2]<stderr>:00007ff0be3e0b80[1,2]<stderr>: (most recent call first):
[1,2]<stderr>:  File [1,2]<stderr>:"[1,2]<stderr>:/opt/ml/code/job.py[1,2]<stderr>:"[1,2]<stderr>:, line [1,2]<stderr>:13[1,2]<stderr>: in [1,2]<stderr>:<module>[1,2]<stderr>:
""".splitlines()

UNTAGGED = """\
Current thread 0x00007f0000000002 (most recent call first):
  File "/opt/ml/code/job.py", line 17 in step
  File "/opt/ml/code/job.py", line 30 in <module>
some other output
Current thread 0x00007f0000000003 (most recent call first):
  File "/opt/ml/code/job.py", line 9 in read_shard
""".splitlines()


def test_where_each_rank_was_is_read_from_faulthandlers_dumps():
    assert parse_stack_dumps(TAGGED) == [Where("0", "<module>", "/opt/ml/code/job.py", 17),
                                         Where("1", "read_shard", "/opt/ml/code/job.py", 9),
                                         # a busy rank's pieces, each tagged by mpirun
                                         Where("2", "<module>", "/opt/ml/code/job.py", 13)]
    assert parse_stack_dumps(UNTAGGED, ["3", "pid 77"]) == [Where("3", "step", "/opt/ml/code/job.py", 17),
                                                            Where("pid 77", "read_shard", "/opt/ml/code/job.py", 9)]
    assert [w.rank for w in parse_stack_dumps(UNTAGGED)] == [None, None]


def test_the_reason_puts_the_odd_rank_first_and_groups_the_rest():
    places = [Where("0", "<module>", "job.py", 17), Where("2", "<module>", "job.py", 17), Where("1", "read_shard", "job.py", 9)]
    reason = build_hang_reason(30, "algo-1", places)
    assert reason.startswith("Hang: no output from any process on algo-1 for 30 s (BYOC_HANG_TIMEOUT_S); the job was "
                             "stopped with exit code 124.")
    assert reason.endswith("Where they were: rank 1 in read_shard (job.py:9); ranks 0, 2 in <module> (job.py:17).")
    assert build_hang_reason(5, "h", []).endswith("No rank printed a Python stack (not Python, or stuck where signals wait).")


def test_the_hang_timeout_is_off_by_default_and_checked():
    assert parse_launch_settings({}).hang_timeout_s == 0
    assert parse_launch_settings({"BYOC_HANG_TIMEOUT_S": "2.5"}).hang_timeout_s == 2.5
    with pytest.raises(JobDefinitionError, match="BYOC_HANG_TIMEOUT_S"):
        parse_launch_settings({"BYOC_HANG_TIMEOUT_S": "-1"})


STUCK = """\
import time
print("loading", flush=True)

def wait_for_data():
    time.sleep(600)  # as if blocked on a mount that went away

wait_for_data()
"""


def test_a_silent_stuck_program_fails_with_124_its_stack_and_where_it_is(tmp_path):
    root = write_tree(tmp_path, script=STUCK)
    done = run_entrypoint(root, BYOC_HANG_TIMEOUT_S="2", timeout=60)  # a guard against a hang: the script sleeps 10 min
    assert done.returncode == HANG_EXIT_CODE, done.stderr[-3000:]
    asked = done.stderr.index("no output from any process for 2 s (BYOC_HANG_TIMEOUT_S): asking every rank")
    assert done.stderr.index("(most recent call first)", asked) > asked  # the hang check, then the stacks it asked for
    assert "(most recent call first)" in done.stderr and "in wait_for_data" in done.stderr
    report = failure_text(root)
    assert report.startswith("Hang: no output from any process on algo-1 for 2 s (BYOC_HANG_TIMEOUT_S)")
    assert "Where they were: pid " in report and " in wait_for_data (" in report.split("\n")[0]


def test_a_program_that_keeps_printing_is_not_hung(tmp_path):
    root = write_tree(tmp_path, script="import time\nfor i in range(8):\n    print(i, flush=True)\n    time.sleep(0.5)\n")
    done = run_entrypoint(root, BYOC_HANG_TIMEOUT_S="2", timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]


MPI_STUCK = """\
import time
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()

def stuck_reading_a_file():
    time.sleep(600)

for step in range(1000):
    if rank == 1 and step == 3:
        stuck_reading_a_file()
    comm.allreduce(step)
    print("step", step, flush=True)
"""


def test_under_mpirun_the_reason_names_the_stuck_rank_and_the_waiting_one(tmp_path):
    pytest.importorskip("mpi4py", reason="mpi4py is part of the test environment (pyproject's test extra)")
    host = socket.gethostname()  # mpirun then starts both ranks here, without SSH
    root = write_tree(tmp_path, script=MPI_STUCK, program="job.py", hosts=(host,), current_host=host,
                      hyperparameters={"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2})
    done = run_entrypoint(root, BYOC_HANG_TIMEOUT_S="3", timeout=90)
    assert done.returncode == HANG_EXIT_CODE, done.stderr[-3000:]
    head = failure_text(root).split("\n")[0]
    assert "rank 1 in stuck_reading_a_file (" in head and "rank 0 in <module> (" in head, head

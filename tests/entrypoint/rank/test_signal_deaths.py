"""A rank killed by a signal writes no record of its own: whoever saw it die names it — rank,
host, signal and what the signal means — as the job's root cause (issue: the leader's abort was
reported as the healthy worker's SIGTERM). End to end on emulated hosts:
tests/multihost/test_faults.py and test_jobs.py."""

import json
import os
import time
from types import SimpleNamespace

import pytest

from entrypoint.hosts.job_port import parse_root_cause_line
from entrypoint.outcome.failure import describe_failure, describe_exit_code, guess_signal_death
from entrypoint.outcome.records import StepEnding
from entrypoint.rank.launch_torchrun import report_signal_death
from entrypoint.rank.record_errors import MARKER, build_signal_root_cause, describe_signal


CLOCK_REALTIME_COARSE = getattr(time, "CLOCK_REALTIME_COARSE", 5)  # Linux's number; Python names it not


def failure(pid, exitcode, timestamp, local_rank=0):
    return SimpleNamespace(pid=pid, exitcode=exitcode, timestamp=timestamp, local_rank=local_rank)


def test_torchruns_first_signal_death_becomes_the_root_cause_at_the_time_it_was_seen(capsys):
    failures = {3: failure(30, -11, 100, local_rank=1), 2: failure(20, -6, 100), 1: failure(10, 1, 99)}
    record = report_signal_death(failures, {"SM_CURRENT_HOST": "algo-2"}, {20: 100.25, 30: 100.75})
    assert record == {"host": "algo-2", "rank": "2", "type": "SIGABRT", "time": 100.25, "where": "",
                      "message": "rank 2 (local rank 0) on algo-2 was killed by SIGABRT (signal 6): the process "
                                 "aborted, often a C++ assertion or `terminate` in a library"}
    cause = parse_root_cause_line(capsys.readouterr().err.strip())  # what this host's entrypoint reads
    assert cause is not None and cause.rank == "2" and cause.time == 100.25


def test_a_death_the_watcher_missed_keeps_torchs_whole_second():
    assert report_signal_death({0: failure(5, -9, 100)}, {"SM_CURRENT_HOST": "algo-1"}, {})["time"] == 100.0


def test_exceptions_only_leave_nothing_to_report(capsys):
    assert report_signal_death({0: failure(5, 1, 100)}, {}, {}) is None
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("signum, name, words", [
    (6, "SIGABRT", "C++ assertion"), (11, "SIGSEGV", "invalid memory access"), (7, "SIGBUS", "/dev/shm too small"),
    (9, "SIGKILL", "out-of-memory killer"), (15, "SIGTERM", "asked to stop"), (4, "SIGILL", "another CPU"),
    (8, "SIGFPE", "division by zero"), (13, "SIGPIPE", "reader was gone"), (1, "SIGHUP", "session"), (2, "SIGINT", "Ctrl-C"),
])  # fmt: skip
def test_each_signal_says_what_it_usually_means(signum, name, words):
    got_name, text = describe_signal(signum)
    assert got_name == name and text.startswith(f"{name} (signal {signum}): ") and words in text
    import signal

    assert signal.Signals(signum).name == name  # the table's numbers are this machine's


def test_an_unknown_signal_is_named_by_its_number():
    assert describe_signal(40) == ("signal 40", "signal 40")


def test_the_report_leads_with_the_signal_death_rank_and_host():
    line = MARKER + json.dumps(build_signal_root_cause("0", "0", "algo-1", 6, 100.0))
    report = describe_failure("torchrun on 2 host(s)", StepEnding(1, stopped_by="SIGTERM", stopped_at=101.0),
                              parse_root_cause_line(line), ["rank aborting"], "algo-2")
    head = report[:1024]
    assert head.startswith("SIGABRT: rank 0 (local rank 0) on algo-1 was killed by SIGABRT (signal 6): ")
    assert "First failure: rank 0 on host algo-1" in head and "Then this host (algo-2) was stopped by SIGTERM." in head


MPIRUN_NOTICE = [
    "--------------------------------------------------------------------------",
    "mpirun noticed that process rank 1 with PID 0 on node algo-2 exited on signal 6 (Aborted).",
    "--------------------------------------------------------------------------",
]


def test_mpiruns_notice_of_a_signal_death_leads_the_report():
    assert guess_signal_death(MPIRUN_NOTICE) == ("rank 1 on algo-2 was killed by SIGABRT (signal 6): the process "
                                                 "aborted, often a C++ assertion or `terminate` in a library")
    report = describe_failure("mpirun on 2 host(s)", StepEnding(134), None, MPIRUN_NOTICE, "algo-1")
    assert report.startswith("rank 1 on algo-2 was killed by SIGABRT (signal 6): ")
    assert "mpirun on 2 host(s) failed on host algo-1 with exit code 134: killed by SIGABRT (signal 6)" in report


def test_one_process_killed_by_a_signal_is_described_by_its_exit_code():
    assert describe_exit_code(139) == ("exit code 139: killed by SIGSEGV (signal 11): a segmentation fault: an invalid "
                                       "memory access in native code")


ABORTING_RANK = """
import os, time, torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
time.sleep((0.6 - time.time() % 1) % 1)  # abort at x.6 s: torch's whole second would be 0.6 s early
with open(os.path.join(os.environ["SM_MODEL_DIR"], "aborted-at"), "w") as f:
    f.write(repr(time.time()))
os.abort()
"""


def test_a_torchrun_rank_killed_by_a_signal_leads_output_failure_at_the_time_it_died(tmp_path):
    import socket

    from support.jobtree import failure_text, run_entrypoint, write_tree

    host = socket.gethostname()
    root = write_tree(tmp_path, script=ABORTING_RANK, hosts=(host,), current_host=host,
                      hyperparameters={"sagemaker_torch_distributed_enabled": True})
    done = run_entrypoint(root)
    assert done.returncode == 1, done.stderr[-2000:]
    first = failure_text(root).splitlines()[0]
    assert first == (f"SIGABRT: rank 0 (local rank 0) on {host} was killed by SIGABRT (signal 6): the process aborted, "
                     "often a C++ assertion or `terminate` in a library")
    record = next(parse_root_cause_line(line) for line in done.stderr.splitlines() if line.startswith(MARKER))
    aborted_at = float((root / "model" / "aborted-at").read_text())
    # The crash file's time when the rank wrote one (its stacks are then in `where`), else when
    # the launcher's watcher saw the death: which one, in the message, should this ever fail.
    # The file's time comes from the kernel's coarse clock, so it may read up to one tick
    # earlier than the rank's time.time() just before it aborted (CI saw 3 ms on a 4 ms tick).
    tick = time.clock_getres(CLOCK_REALTIME_COARSE)
    assert -tick <= record.time - aborted_at < 0.3, (record.time, aborted_at, tick, record.where[:300],
                                                     done.stderr[-2000:])
    # Where it happened: the rank's own stacks, written by faulthandler as the signal arrived.
    assert "Fatal Python error: Aborted" in record.where and 'train.py", line 8 in <module>' in record.where
    assert "Where:\nFatal Python error: Aborted" in failure_text(root)


def test_the_crash_file_gives_the_time_and_the_stacks_and_is_bounded(tmp_path, capsys):
    from entrypoint.rank.launch_torchrun import CRASH_TEXT_CHARS, load_crash_file

    assert load_crash_file(str(tmp_path), 42) is None and load_crash_file("", 42) is None
    path = tmp_path / "crash-42.txt"
    path.write_text("")
    assert load_crash_file(str(tmp_path), 42) is None  # opened at start, never written: no crash seen
    path.write_text("Fatal Python error: Segmentation fault\n" + "x" * (2 * CRASH_TEXT_CHARS))
    os.utime(path, ns=(1_000_000_000_123_456_789, 1_000_000_000_123_456_789))
    when, text = load_crash_file(str(tmp_path), 42)
    assert abs(when - 1_000_000_000.123456789) < 1e-6 and text.startswith("Fatal Python error: Segmentation fault")
    assert len(text) == CRASH_TEXT_CHARS + 4 and text.endswith("\n...")
    record = report_signal_death({1: failure(42, -11, 999_999_999)}, {"SM_CURRENT_HOST": "algo-2", "BYOC_CRASH_DIR": str(tmp_path)}, {})
    assert record["time"] == when and record["where"] == text and record["type"] == "SIGSEGV"
    assert "[launch_torchrun] rank 1's Python stacks when SIGSEGV arrived:" in capsys.readouterr().err


def test_the_crashing_threads_stack_comes_first_and_the_wrappers_own_thread_is_left_out():
    from entrypoint.rank.launch_torchrun import build_crash_text

    dump = ("Fatal Python error: Aborted\n\nThread 0x1 (most recent call first):\n  File \"record_errors.py\", line 397 "
            "in flush_partial_lines\n\nThread 0x2 (most recent call first):\n  File \"loader.py\", line 3 in fetch\n\n"
            "Current thread 0x3 (most recent call first):\n  File \"train.py\", line 7 in <module>\n")
    assert build_crash_text(dump) == ("Fatal Python error: Aborted\n\nCurrent thread 0x3 (most recent call first):\n"
                                      "  File \"train.py\", line 7 in <module>\n\nThread 0x2 (most recent call first):\n"
                                      "  File \"loader.py\", line 3 in fetch\n")


def test_of_two_signal_deaths_the_one_that_crashed_first_by_its_own_word_is_reported(tmp_path, capsys):
    (tmp_path / "crash-20.txt").write_text("Fatal Python error: Segmentation fault\n")
    os.utime(tmp_path / "crash-20.txt", (100.1, 100.1))
    failures = {0: failure(10, -9, 100), 1: failure(20, -11, 100)}  # rank 0: SIGKILL, seen at 100.5
    record = report_signal_death(failures, {"SM_CURRENT_HOST": "algo-1", "BYOC_CRASH_DIR": str(tmp_path)}, {10: 100.5, 20: 100.6})
    assert (record["rank"], record["type"]) == ("1", "SIGSEGV") and abs(record["time"] - 100.1) < 1e-6


# --- an exit status is not a signal; mpirun's ranks' stacks (issue 33, case 5) ---------------------

EXIT_137 = "import os\nprint('going', flush=True)\nos._exit(137)\n"
MPI_2 = {"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2}


def this_host() -> dict:
    """mpirun on one host: the job's host name must be this machine's (it resolves)."""
    import socket

    return {"hosts": (socket.gethostname(),), "current_host": socket.gethostname()}


@pytest.mark.parametrize("hps", [{}, MPI_2], ids=["one-process", "mpirun"])
def test_a_process_that_exits_137_itself_is_not_called_killed_by_sigkill(tmp_path, hps):
    from support.jobtree import failure_text, run_entrypoint, write_tree

    root = write_tree(tmp_path / "ml", script=EXIT_137, hyperparameters=hps, **this_host())
    done = run_entrypoint(root)
    assert done.returncode == 137, done.stderr[-2000:]
    text = failure_text(root)
    assert "exit code 137, which the process returned itself: no signal ended it" in text, text[:1000]
    assert "137: killed by SIGKILL" not in text and "something outside the job" not in text


def test_a_process_killed_by_sigkill_is_still_called_so(tmp_path):
    from support.jobtree import failure_text, run_entrypoint, write_tree

    root = write_tree(tmp_path / "ml", script="import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    done = run_entrypoint(root)
    assert done.returncode == 137, done.stderr[-2000:]
    assert "exit code 137: killed by SIGKILL" in failure_text(root)


SEGFAULTING_RANK = """import ctypes, os
def crash_in_this_function():
    if os.environ.get('OMPI_COMM_WORLD_RANK', '0') == '1':
        ctypes.string_at(0)
crash_in_this_function()
"""


@pytest.mark.parametrize("hps", [{}, MPI_2], ids=["one-process", "mpirun"])
def test_a_rank_killed_by_sigsegv_leaves_its_python_stack_in_the_log_and_the_failure(tmp_path, hps):
    from support.jobtree import failure_text, run_entrypoint, write_tree

    root = write_tree(tmp_path / "ml", script=SEGFAULTING_RANK.replace("'0') == '1'", "'1') == '1'") if not hps
                      else SEGFAULTING_RANK, hyperparameters=hps, **this_host())
    done = run_entrypoint(root)
    assert done.returncode == 139, done.stderr[-2000:]
    assert "Fatal Python error: Segmentation fault" in done.stderr
    assert 'in crash_in_this_function' in done.stderr and 'in crash_in_this_function' in failure_text(root)
    assert "SIGSEGV" in failure_text(root)

"""How a rank ends under the rank wrapper (entrypoint/rank/record_errors.py) once torch is loaded:
as Python would end it (threads joined, atexit handlers run, open files flushed, the exit
code kept) but without the module teardown, where torch's C++ threads can abort a rank that
finished its work (pytorch/pytorch#179291). A crash while the program runs still fails it.

The teardown abort itself depends on timing inside torch; here a stand-in makes it certain: an
object freed at teardown whose destructor aborts, as gloo's leftover work objects do."""

import os
import signal
import subprocess

import pytest

from entrypoint.rank import record_errors
from entrypoint.rank.record_errors import decide_exit_code
from support.jobtree import PYTHON

RECORD_ERRORS = record_errors.__file__  # this checkout's, or the image's installed one

ABORTS_AT_TEARDOWN = """
import builtins, os
class AbortsWhenFreed:  # gloo's leftover work object, freed while the interpreter is torn down
    def __del__(self):
        os.abort()
builtins._freed_at_teardown = AbortsWhenFreed()
"""


def run_rank(tmp_path, body: str, *, torch: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(("import torch.distributed\n" if torch else "") + body)
    return subprocess.run([PYTHON, RECORD_ERRORS, str(script)], capture_output=True, text=True, timeout=timeout,
                          cwd=str(tmp_path), env={**os.environ, "PYTHONUNBUFFERED": "1"})


@pytest.mark.parametrize("ending, code", [("", 0), ("import sys\nsys.exit(0)\n", 0), ("import sys\nsys.exit(3)\n", 3),
                                          ("raise ValueError('bad shard')\n", 1)])
def test_a_rank_that_finished_is_not_failed_by_a_destructor_aborting_at_teardown(tmp_path, ending, code):
    done = run_rank(tmp_path, ABORTS_AT_TEARDOWN + "print('trained')\n" + ending)
    assert done.returncode == code, done.stderr[-2000:]
    assert "trained" in done.stdout


def test_without_torch_a_program_ends_as_python_ends_it(tmp_path):
    """The workaround is torch's: any other program keeps the interpreter's own ending."""
    done = run_rank(tmp_path, ABORTS_AT_TEARDOWN + "print('trained')\n", torch=False)
    assert done.returncode == -signal.SIGABRT


def test_everything_python_does_at_exit_still_happens(tmp_path):
    body = """
import atexit, logging, sys, threading, time
logging.basicConfig(filename="log.txt", level=logging.INFO)
logging.info("logged before exit")
left_open = open("left-open.txt", "w")
left_open.write("written, never closed")  # flushed by the interpreter when freed, by us before _exit
atexit.register(lambda: print("atexit handler ran"))
def slow_worker():
    time.sleep(1)
    with open("thread.txt", "w") as f:
        f.write("the non-daemon thread finished")
threading.Thread(target=slow_worker).start()
print("partial line without a newline", end="")
sys.stderr.write("stderr too")
"""
    done = run_rank(tmp_path, body)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == "partial line without a newlineatexit handler ran\n"
    assert done.stderr.endswith("stderr too")
    assert (tmp_path / "left-open.txt").read_text() == "written, never closed"
    assert (tmp_path / "thread.txt").read_text() == "the non-daemon thread finished"
    assert "logged before exit" in (tmp_path / "log.txt").read_text()


def test_a_crash_while_the_script_runs_still_fails_the_rank(tmp_path):
    done = run_rank(tmp_path, "print('before', flush=True)\nimport os\nos.abort()\nprint('never')\n")
    assert done.returncode == -signal.SIGABRT
    assert "before" in done.stdout and "never" not in done.stdout


def test_an_exception_is_still_recorded_as_the_root_cause(tmp_path):
    done = run_rank(tmp_path, "raise RuntimeError('NCCL error: unhandled system error')\n")
    assert done.returncode == 1
    assert 'BYOC-ROOT-CAUSE {' in done.stderr and "NCCL error: unhandled system error" in done.stderr
    assert "Traceback (most recent call last)" in done.stderr


def test_sys_exit_with_a_message_prints_it_and_ends_with_1(tmp_path):
    done = run_rank(tmp_path, "import sys\nsys.exit('no data in the train channel')\n")
    assert done.returncode == 1
    assert done.stderr.strip().endswith("no data in the train channel")


@pytest.mark.parametrize("arg, code", [(None, 0), (0, 0), (3, 3), (True, 1), (256, 0), (-1, 255), ("text", 1)])
def test_decide_exit_code_gives_what_python_gives(arg, code):
    assert decide_exit_code(arg) == code
    assert subprocess.run([PYTHON, "-c", f"import sys; sys.exit({arg!r})"], capture_output=True).returncode == code


# torchrun itself (rank/launch_torchrun.py) ends the same way: its teardown with torch and
# torch._dynamo loaded (0.7 s on a 2-core host) lies on a restart's path. A stand-in for torchrun's
# run ends in each way Python knows; the stand-in's object that aborts when freed at teardown says
# whether the teardown ran.
TORCHRUN_ENDS = """
import atexit, sys
sys.path.insert(0, {folder!r})
import launch_torchrun
def stand_in(argv):
    import builtins, os
    {aborts}
    atexit.register(lambda: print("atexit handler ran"))
    print("partial line without a newline", end="")
    {ending}
launch_torchrun.run_and_end([], run=stand_in)
print("never reached")
"""


@pytest.mark.parametrize("ending, code, tail", [
    ("return", 0, ""),
    ("sys.exit(3)", 3, ""),
    ("sys.exit('torchrun: bad arguments')", 1, "torchrun: bad arguments\n"),
    ("raise ValueError('ChildFailedError stand-in')", 1, "ValueError: ChildFailedError stand-in\n"),
])
def test_torchrun_ends_as_python_would_but_for_the_teardown(tmp_path, ending, code, tail):
    aborts = "class AbortsWhenFreed:\n        def __del__(self): os.abort()\n    builtins._freed_at_teardown = AbortsWhenFreed()"
    script = TORCHRUN_ENDS.format(folder=os.path.dirname(RECORD_ERRORS), aborts=aborts, ending=ending)
    done = subprocess.run([PYTHON, "-c", script], capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    assert done.returncode == code, done.stderr[-2000:]  # SIGABRT (-6) had the teardown run
    assert done.stdout == "partial line without a newlineatexit handler ran\n"
    assert done.stderr.endswith(tail)
    if code == 1 and "raise" in ending:
        assert done.stderr.startswith("Traceback (most recent call last):")


@pytest.mark.parametrize("exit_arg, words", [
    (None, None), (0, None), (False, None), (256, None),  # exit code 0: no failure
    (True, "sys.exit(True): exit code 1"), (1, "sys.exit(1): exit code 1"), (3, "sys.exit(3): exit code 3"),
    (127, "sys.exit(127): exit code 127"), (128, "sys.exit(128): exit code 128"),
    (129, None), (143, None), (192, None),  # 128 + a signal's number: the answer to a stop
    (193, "sys.exit(193): exit code 193"), (-1, "sys.exit(-1): exit code 255"),
    ("no data", "with a message, exit code 1: no data"),
])
def test_a_failing_sys_exit_is_a_root_cause_but_the_answer_to_a_stop_is_not(exit_arg, words):
    from entrypoint.rank.record_errors import describe_failing_exit

    said = describe_failing_exit(exit_arg)
    assert said == words if words is None else words in said

"""The next attempt's launchers started ahead and held (run/held.py), with real processes: a
stand-in launcher that, like rank/launch_torchrun.py --held, waits for its line before it
runs; the run (run/supervise.run_processes) takes the one that is exactly its start; and the
real launch_torchrun.py let go unused."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from entrypoint.decide.specs import ProcessSpec
from entrypoint.rank.launch_torchrun import HOLD_FLAG
from entrypoint.run.held import HeldProcesses, Next, build_held_argv
from entrypoint.run.stop import Stop
from entrypoint.run.supervise import OutputCollector, RunHooks, run_processes
from entrypoint.settings import DEFAULTS

LAUNCH_TORCHRUN = os.path.join(os.path.dirname(os.path.abspath(__import__("entrypoint").__file__)), "rank",
                               "launch_torchrun.py")


def write_launcher(tmp_path) -> str:
    """Prints whether it was held and its attempt, then exits with its argv's code. With
    WAIT_FOR_HELD it first waits until its run has looked at starting the next attempt ahead
    (Held): a run starts that only while its attempt runs on (seen in CI: under load, attempt 1
    had ended before its run's first look, and nothing was held)."""
    path = tmp_path / "launcher.py"
    path.write_text(textwrap.dedent(f"""\
        import os, sys, time
        args = sys.argv[1:]
        held = args[:1] == [{HOLD_FLAG!r}]
        marker = os.environ["PID_FILE"] + ".held"
        if held:
            args = args[1:]
            if not sys.stdin.readline():
                sys.exit(0)
        elif os.environ.get("WAIT_FOR_HELD"):
            while not os.path.exists(marker):
                time.sleep(0.01)
        with open(os.environ["PID_FILE"], "a") as f:
            f.write(f"{{os.getpid()}}\\n")
        print(f"attempt {{os.environ['BYOC_ATTEMPT']}} held={{held}} args={{args}}", flush=True)
        sys.exit(int(args[0]))
        """))
    return str(path)


class Held(HeldProcesses):
    """HeldProcesses that leaves a mark for a WAIT_FOR_HELD launcher once it has started (or
    passed over) the next attempt's processes."""

    def __init__(self, tmp_path) -> None:
        super().__init__()
        self.marker = tmp_path / "pids.held"

    def start_next(self) -> None:
        super().start_next()
        self.marker.touch()


def spec(launcher: str, code: int, attempt: int, hold_at: int = 2, wait_for_held: bool = False) -> ProcessSpec:
    env = (("BYOC_ATTEMPT", str(attempt)),) + ((("WAIT_FOR_HELD", "1"),) if wait_for_held else ())
    return ProcessSpec("launcher", (sys.executable, launcher, str(code)), env, hold_at=hold_at)


def run(tmp_path, processes, held, after_s: float = 0.0):
    collector = OutputCollector()
    settings = DEFAULTS._replace(held_start_after_s=after_s)
    hooks = RunHooks(settings=settings, held=held)
    result = run_processes(tuple(processes), dict(os.environ, PID_FILE=str(tmp_path / "pids")), str(tmp_path),
                           collector, Stop(), hooks)
    return result, collector


def test_build_held_argv_puts_the_flag_where_the_plan_says():
    assert build_held_argv(ProcessSpec("torchrun", ("python", "launch.py", "--nnodes", "2"), hold_at=2)) == \
        ["python", "launch.py", HOLD_FLAG, "--nnodes", "2"]


def test_the_next_attempt_takes_the_process_started_ahead_and_it_runs_as_a_fresh_one(tmp_path, capfd):
    launcher = write_launcher(tmp_path)
    env = dict(os.environ, PID_FILE=str(tmp_path / "pids"))
    held = Held(tmp_path)
    held.expect(Next((spec(launcher, 0, 2),), env, str(tmp_path)))
    first, _ = run(tmp_path, [spec(launcher, 3, 1, wait_for_held=True)], held)  # attempt 1 fails; attempt 2's held meanwhile
    assert first.exit_code == 3
    assert len(held.held) == 1 and held.next is None
    waiting = next(iter(held.held.values()))
    assert waiting.poll() is None  # held: it waits for its line

    held.expect(None)  # no attempt after 2: nothing more is started ahead
    second, _ = run(tmp_path, [spec(launcher, 0, 2)], held)
    out = capfd.readouterr().out
    assert second.exit_code == 0 and held.taken == 1 and held.held == {}
    assert "attempt 1 held=False args=['3']" in out
    assert "attempt 2 held=True args=['0']" in out  # its own argv, after the flag
    pids = (tmp_path / "pids").read_text().split()
    assert pids[-1] == str(waiting.pid)  # the held process is the one that ran


def test_a_held_process_that_is_not_exactly_the_start_is_not_taken_and_stop_ends_it(tmp_path, capfd):
    launcher = write_launcher(tmp_path)
    env = dict(os.environ, PID_FILE=str(tmp_path / "pids"))
    held = Held(tmp_path)
    held.expect(Next((spec(launcher, 0, 2),), {**env, "OTHER": "1"}, str(tmp_path)))  # another environment
    run(tmp_path, [spec(launcher, 1, 1, wait_for_held=True)], held)
    (waiting,) = held.held.values()
    second, _ = run(tmp_path, [spec(launcher, 0, 2)], held)
    assert second.exit_code == 0 and held.taken == 0
    assert "attempt 2 held=False" in capfd.readouterr().out  # started fresh
    assert waiting.poll() is None
    held.stop()
    assert waiting.returncode is not None and held.held == {}


def test_a_held_process_that_died_while_held_is_replaced_by_a_fresh_start(tmp_path, capfd):
    launcher = write_launcher(tmp_path)
    env = dict(os.environ, PID_FILE=str(tmp_path / "pids"))
    held = Held(tmp_path)
    held.expect(Next((spec(launcher, 0, 2),), env, str(tmp_path)))
    run(tmp_path, [spec(launcher, 1, 1, wait_for_held=True)], held)
    (waiting,) = held.held.values()
    waiting.kill()
    waiting.wait()
    second, _ = run(tmp_path, [spec(launcher, 0, 2)], held)
    assert second.exit_code == 0 and held.taken == 0 and held.held == {}
    assert "attempt 2 held=False" in capfd.readouterr().out


def test_only_a_process_its_plan_marks_is_started_ahead_and_only_once_the_attempt_is_under_way(tmp_path):
    launcher = write_launcher(tmp_path)
    env = dict(os.environ, PID_FILE=str(tmp_path / "pids"))
    held = Held(tmp_path)
    held.expect(Next((spec(launcher, 0, 2, hold_at=0),), env, str(tmp_path)))
    run(tmp_path, [spec(launcher, 1, 1, wait_for_held=True)], held)
    assert held.held == {} and held.next is None  # looked at, not marked: never started ahead
    held.expect(Next((spec(launcher, 0, 2),), env, str(tmp_path)))
    run(tmp_path, [spec(launcher, 1, 1)], held, after_s=3600.0)  # ended before its start-up was past
    assert held.held == {} and held.next is not None
    held.stop()
    assert held.next is None


def test_the_real_launcher_held_and_let_go_unused_exits_0_having_started_nothing(tmp_path):
    proc = subprocess.run([sys.executable, LAUNCH_TORCHRUN, HOLD_FLAG, "--nnodes", "1", "--no-python", "false"],
                          input=b"", capture_output=True, timeout=600)
    assert (proc.returncode, proc.stdout) == (0, b""), proc.stderr[-2000:]

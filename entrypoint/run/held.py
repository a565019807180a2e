"""The next attempt's launchers, started ahead and held until that attempt starts (issue 52).

A restart's critical path is fresh processes importing torch: under torchrun on several hosts,
torchrun itself (about 1.9 s of a 4.6 s crash, benchmarks-training.md) before its rendezvous.
So during attempt N, once its own processes have had their start (settings.held_start_after_s),
this host starts attempt N+1's copy of each process the plan marks (ProcessSpec.hold_at:
rank/launch_torchrun.py's --held, which imports torch and then waits for one line on its
stdin). When attempt N+1 starts, the Supervisor takes the held process whose argv, environment
and folder are exactly the attempt's, gives it its line, and it runs as a fresh one would: it
reads nothing else, so its output, exit code and root causes are a fresh start's.

A held process that is not taken (the job ended, it was stopped, its attempt never came, the
plan changed) is stopped by `stop`, which run_host's one `finally` calls (orchestrate.py).
Main thread only.
"""

from __future__ import annotations

import signal
import subprocess
from typing import NamedTuple

from entrypoint.decide.restarts import ATTEMPT_ENV
from entrypoint.decide.specs import ProcessSpec
from entrypoint.log import log
from entrypoint.run import processes
from entrypoint.rank.launch_torchrun import HOLD_FLAG  # import torch, then wait for the line to run


class Next(NamedTuple):
    """What the next attempt starts, as the current one's run hands it on."""

    processes: tuple[ProcessSpec, ...]
    env: dict[str, str]
    cwd: str


def build_held_argv(spec: ProcessSpec) -> list[str]:
    """The spec's argv with the hold flag where its plan says (at hold_at)."""
    argv = list(spec.argv)
    return [*argv[:spec.hold_at], HOLD_FLAG, *argv[spec.hold_at:]]


def describe_held(spec: ProcessSpec) -> str:
    attempt = dict(spec.env).get(ATTEMPT_ENV)
    return f"{spec.name} of attempt {attempt}" if attempt else spec.name


def build_held_key(argv, env: dict[str, str], cwd: str) -> tuple:
    return tuple(argv), tuple(sorted(env.items())), cwd


class HeldProcesses:
    """This host's held processes, across attempts: none, or the next attempt's."""

    def __init__(self) -> None:
        self.next: Next | None = None  # the next attempt's processes, while one may follow
        self.held: dict[tuple, subprocess.Popen] = {}  # (argv, env, cwd) -> its held process
        self.taken = 0  # held processes that ran as an attempt's (for the tests and the log)

    def expect(self, following: Next | None) -> None:
        """What the attempt after the one starting now would start; None when no attempt
        follows (no restart left): nothing is held then."""
        self.next = following

    def start_next(self) -> None:
        """Start the next attempt's marked processes, held (once an attempt: a second call
        starts nothing more)."""
        following, self.next = self.next, None
        for spec in following.processes if following is not None else ():
            if spec.hold_at <= 0:
                continue
            env = {**following.env, **dict(spec.env)}
            cwd = spec.cwd or following.cwd
            try:
                proc = subprocess.Popen(build_held_argv(spec), env=env, cwd=cwd, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
            except (OSError, ValueError):
                continue  # the attempt starts it fresh, and says why if it cannot
            self.held[build_held_key(spec.argv, env, cwd)] = proc
            log(f"{describe_held(spec)} started ahead, held until that attempt starts")

    def take(self, spec: ProcessSpec, env: dict[str, str], cwd: str) -> subprocess.Popen | None:
        """The held process that is exactly this start, told to run; None when there is none
        (or it died while held: then it is collected and the start is a fresh one)."""
        proc = self.held.pop(build_held_key(spec.argv, env, cwd), None)
        if proc is None:
            return None
        try:
            proc.stdin.write(b"run\n")
            proc.stdin.close()
        except OSError:  # it died while held (BrokenPipeError): a fresh start
            self.end(proc)
            return None
        self.taken += 1
        log(f"{describe_held(spec)}: the one started ahead runs now (its imports done)")
        return proc

    def stop(self) -> None:
        """Every held process ends: the job needs none of them."""
        self.next = None
        held, self.held = list(self.held.values()), {}
        for proc in held:
            self.end(proc)

    @staticmethod
    def end(proc: subprocess.Popen) -> None:
        """A held process has started nothing (it waits for its line): SIGKILL its session's
        group, then collect it and close its pipes."""
        processes.signal_groups([proc.pid], signal.SIGKILL)
        proc.wait()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            try:
                if pipe is not None:
                    pipe.close()
            except OSError:
                pass


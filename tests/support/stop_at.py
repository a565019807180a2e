"""`python tests/support/stop_at.py`: the real entrypoint (`python -m entrypoint train`), with a
SIGTERM sent to itself at a chosen step of a window of its launch: a stop taken at that very
moment, made deterministic.

A step is a line the main thread runs, in the entrypoint's own files or in subprocess.py (Popen:
a child forked and exec'd, not yet returned to the supervisor), from the moment the window's
first function is called until its last one is (or the first returns); a line run again in
the same call (a loop's) is the step of its first time. Nothing of the entrypoint is changed but the two functions wrapped to open and close the window; the signal
comes from the kernel like the platform's, and the token's handler takes it as it would.

Environment:
  STOP_AT_FROM  module:qualname that opens the window when called (entrypoint.orchestrate:run_plan);
                unset: no window, no stop (only STOP_AT_CHILDREN)
  STOP_AT_TO    module:qualname that closes it when called; "" closes it when FROM returns
  STOP_AT_STEP  the step to send SIGTERM at (1 = the first line in the window); 0 sends none
  STOP_AT_SIGNAL  the signal sent instead of SIGTERM (SIGUSR1: a stack request at that moment)
  STOP_AT_NOTE  a file: `steps N` (how many steps the window had, when none was sent), or
                `sent at FILE:LINE (FUNCTION)` (where the stop was sent)
  STOP_AT_LIST  optional, a file: every step of the window, one a line (FILE:LINE FUNCTION)
  STOP_AT_CHILDREN  optional, a file: each process Popen started (exec'd), one a line: its
                pid and argv, as JSON; what tells a script that ran from one that never did
"""

from __future__ import annotations

import functools
import importlib
import os
import signal
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
TRACED = (os.path.join(REPO, "entrypoint") + os.sep, subprocess.__file__)


class Window:
    def __init__(self, step: int, note: str, listing: str = "") -> None:
        self.step, self.note = step, note
        self.steps: list[str] | None = [] if listing else None
        self.listing = listing
        self.open = False
        self.closed = False
        self.count = 0
        self.sent = False

    def on_line(self, frame, event, _arg, seen: set[int]):
        if event == "line" and self.open and not self.sent:
            if frame.f_lineno in seen:
                return None if self.closed else functools.partial(self.on_line, seen=seen)
            seen.add(frame.f_lineno)
            self.count += 1
            if self.steps is not None:
                code = frame.f_code
                self.steps.append(f"{os.path.relpath(code.co_filename, REPO)}:{frame.f_lineno} {code.co_name}")
            if self.count == self.step:
                self.sent = True
                code = frame.f_code
                write(self.note, f"sent at {os.path.relpath(code.co_filename, REPO)}:{frame.f_lineno} ({code.co_name})")
                # Its handler runs here, before the next line.
                os.kill(os.getpid(), signal.Signals[os.environ.get("STOP_AT_SIGNAL") or "SIGTERM"])
        return None if self.sent or self.closed else functools.partial(self.on_line, seen=seen)

    def on_call(self, frame, _event, _arg):
        """Each call its own lines seen: a loop's line is one step, a function called twice
        (the second job folder's) has its steps twice."""
        if self.sent or self.closed or not frame.f_code.co_filename.startswith(TRACED):
            return None
        return functools.partial(self.on_line, seen=set())

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            sys.settrace(None)
            if not self.sent:
                write(self.note, f"steps {self.count}")
            if self.steps is not None:
                write(self.listing, "\n".join(self.steps))


def write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text + "\n")


def wrap(target: str, before, after=None) -> None:
    """Replace module:qualname with a function that calls before(), the original, then after()."""
    module_name, qualname = target.split(":")
    owner = importlib.import_module(module_name)
    *path, name = qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapped(*args, **kwargs):
        before()
        try:
            return original(*args, **kwargs)
        finally:
            if after is not None:
                after()

    setattr(owner, name, wrapped)


def note_children(path: str) -> None:
    """Each process Popen starts, once it is exec'd (Popen returns from _execute_child only then)."""
    import json

    original = subprocess.Popen._execute_child

    def execute_child(self, args, *rest, **kwargs):
        original(self, args, *rest, **kwargs)
        with open(path, "a") as f:
            f.write(json.dumps([self.pid, [os.fsdecode(a) for a in args]]) + "\n")

    subprocess.Popen._execute_child = execute_child


def main() -> int:
    if os.environ.get("STOP_AT_CHILDREN"):
        note_children(os.environ["STOP_AT_CHILDREN"])
    if not os.environ.get("STOP_AT_FROM"):  # only the children noted
        from entrypoint import cli

        return cli.main(["train"])
    window = Window(int(os.environ.get("STOP_AT_STEP", "0")), os.environ["STOP_AT_NOTE"],
                    os.environ.get("STOP_AT_LIST", ""))
    to = os.environ.get("STOP_AT_TO", "")
    wrap(os.environ["STOP_AT_FROM"], lambda: setattr(window, "open", True), None if to else window.close)
    if to:
        wrap(to, window.close)
    from entrypoint import cli

    sys.settrace(window.on_call)
    try:
        return cli.main(["train"])
    finally:
        window.close()


if __name__ == "__main__":
    sys.exit(main())

"""Reading a running process's output in tests."""

from __future__ import annotations

import select
import subprocess
import time


def read_lines_until(proc: subprocess.Popen, needle: str, timeout_s: float = 60) -> list[str]:
    """The lines proc printed (text mode, stdout) up to the first holding needle; an
    AssertionError with the last 40 lines when it never comes or the output ends first."""
    seen, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            if needle in line:
                return seen
    raise AssertionError(f"never saw {needle!r}:\n{''.join(seen[-40:])}")

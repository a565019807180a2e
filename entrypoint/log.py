"""The entrypoint's own lines in the job's log: stderr, prefixed, flushed at once."""

import sys


def log(message: str) -> None:
    sys.stderr.write(f"[entrypoint] {message}\n")
    sys.stderr.flush()

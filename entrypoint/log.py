"""The entrypoint's own lines in the job's log: stderr, prefixed, flushed at once."""

import sys

from entrypoint.rank.record_errors import build_readable_text


def log(message: str) -> None:
    """Control characters a message carries (a rank's exception, a file name) are escaped but
    newline and tab, so they cannot drive the reader's terminal or hide part of the line."""
    sys.stderr.write(f"[entrypoint] {build_readable_text(message)}\n")
    sys.stderr.flush()

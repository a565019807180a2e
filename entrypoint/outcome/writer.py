"""Turn how the job ended into SageMaker's outcome: output/success or output/failure (with
the reason a person reads first) and the exit code. The reasons are composed by failure.py,
raw; this module renders and redacts them, once (render_reason: for output/failure, the log,
a word to another host), writes them, and reads back what the script wrote itself."""

from __future__ import annotations

import os
from typing import Sequence

from entrypoint.job.paths import MlPaths, open_regular
from entrypoint.log import log
from entrypoint.outcome.failure import redact
from entrypoint.outcome.records import Outcome
from entrypoint.rank.record_errors import build_readable_text


def clear_previous_outcome(paths: MlPaths) -> None:
    """A tree reused for a second local run still holds the first run's outcome; SageMaker
    never hands us one. Remove it so "the script wrote its own failure file" means this run."""
    for path in (paths.failure_file, paths.success_file):
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        except OSError as exc:  # a read-only output folder: nothing of ours to clear there
            if os.path.exists(path):
                log(f"cannot remove the previous run's {path}: {exc.strerror or exc}")


def render_reason(reason: str | None, secrets: Sequence[str]) -> str | None:
    """The one rendering of a reason for anything outside this process: the job's secrets
    masked (failure.redact: every form, also broken over lines), then made readable
    (record_errors.build_readable_text: any text a rank raised, a file name that is not UTF-8
    or a terminal escape included, arrives, never an encoding error instead)."""
    if not reason:
        return reason
    return build_readable_text(redact(reason, list(secrets)))


def write_outcome(paths: MlPaths, outcome: Outcome, secrets: Sequence[str]) -> None:
    """output/success or output/failure, and one FAILED line in the log. A read-only or full
    /opt/ml/output does not change the job's exit code: the reason goes to stderr (the job's
    log) instead. A failure file the script wrote itself stays as it is. The reason is written
    as render_reason makes it: secrets (the values cli.main gives: the job's environment and
    what the plan added) masked, readable."""
    exit_code = outcome.exit_code
    reason = render_reason(outcome.reason, secrets)
    if exit_code != 0 and reason and not outcome.logged:
        log(f"FAILED: {reason.splitlines()[0]}")
    try:
        os.makedirs(paths.output_dir, exist_ok=True)
        if exit_code == 0:
            with open_regular(paths.success_file, write=True):  # output/ is the script's too: no FIFO
                pass
            return
        if os.path.exists(paths.failure_file):
            log("the script wrote its own output/failure; leaving it as it is")
            return
        with open_regular(paths.failure_file, write=True) as f:
            f.write(reason or "")
    except OSError as exc:
        what = paths.success_file if exit_code == 0 else paths.failure_file
        log(f"cannot write {what}: {exc.strerror or exc}; the job's exit code is {exit_code}"
            + (f"; its reason: {reason.strip()}" if reason else ""))


def load_failure_file(paths: MlPaths) -> str | None:
    try:
        with open_regular(paths.failure_file) as f:  # the script's own may be anything: a FIFO, a device
            return f.read()
    except OSError:
        return None

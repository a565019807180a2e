"""The words of a stop (pure): the platform's (SIGTERM, SIGINT) before the training started,
and the one this host makes itself when a training plan's capacity is ending (decide/capacity.py
decides when)."""

from __future__ import annotations

import signal

from entrypoint.decide.capacity import CAPACITY_END_ENV, describe_utc

SIGNAL_EXIT_BASE = 128  # a process ended by signal N exits 128 + N (the shell's rule, and SageMaker's reading)


def decide_stop_exit_code(stopped_by: int | str) -> int:
    """The exit code of a host stopped by a signal (its number, or its name: SIGTERM): the one
    place the rule is written."""
    number = signal.Signals[stopped_by] if isinstance(stopped_by, str) else signal.Signals(stopped_by)
    return SIGNAL_EXIT_BASE + int(number)


def describe_startup_stop(signal_name: str, code: int) -> str:
    """A stop before the training processes started (reading, fetching, installing, or the
    role's start: waiting for the other hosts)."""
    return (f"Stopped by {signal_name} during start-up, before the training processes started; nothing was "
            f"trained. Exit code {code}.\n")


def describe_stop_before_restart(signal_name: str, code: int, earlier: list[str]) -> str:
    """A stop after failed attempts, before the next attempt's processes started (restarts.py):
    that attempt never ran; the earlier ones' failures follow."""
    lines = "\n".join(f"  attempt {i}: {text}" for i, text in enumerate(earlier, 1))
    return (f"Stopped by {signal_name} before attempt {len(earlier) + 1} started (the job was being restarted after a "
            f"failure, BYOC_MAX_RESTARTS); no process of that attempt ran. Exit code {code}.\n\n"
            f"The earlier attempts failed:\n{lines}\n")


def describe_capacity_over(capacity_ends_at: float, stop_at: float, now: float) -> str:
    """Why the job never started: its stop time had passed."""
    return (f"The training never started: the training plan's reserved capacity ends at {describe_utc(capacity_ends_at)} "
            f"({CAPACITY_END_ENV}), SageMaker begins terminating its instances 30 minutes before that, and the job's "
            f"stop time, {describe_utc(stop_at)}, had passed when it began ({describe_utc(now)}). Start it on the "
            f"plan's next capacity.")


def describe_capacity_stop(capacity_ends_at: float, stop_at: float, grace_period_s: float) -> str:
    """Why the job stopped, for output/failure: its first line says it."""
    return (f"Stopped at {describe_utc(stop_at)} because the training plan's reserved capacity ends at "
            f"{describe_utc(capacity_ends_at)} ({CAPACITY_END_ENV}), and SageMaker begins terminating its "
            f"instances 30 minutes before that: every host sent its processes SIGTERM and gave them "
            f"{grace_period_s:g} s (BYOC_GRACE_PERIOD_S) to checkpoint. Resume from the checkpoint in a job on "
            f"the plan's next capacity.")

"""When a SageMaker training plan's reserved capacity ends, and when the job stops before it (pure).

Training plans begin terminating a capacity's instances 30 minutes before it ends ("Training
plans utilization for SageMaker training jobs", Amazon SageMaker AI developer guide:
https://docs.aws.amazon.com/sagemaker/latest/dg/training-plan-utilization-for-training-jobs.html).
The job is given the end in SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP, and the guide
leaves each script to poll it. The entrypoint does it: every host stops its ranks the way a
StopTrainingJob does (SIGTERM, so they checkpoint, then the grace period, then SIGKILL) at

    stop = end - 30 minutes - lead,   lead = BYOC_CAPACITY_STOP_LEAD_S, default the grace period

so that the ranks' grace period is over when the termination begins. A stop time already past
when the job begins means stop now: the processes are not started at all.

The value is read in any of the forms the guide and its example use, unambiguously:
- epoch seconds or epoch milliseconds, whole or with a fraction: a number from 10^11 on is
  milliseconds (10^11 seconds is the year 5138; 10^11 milliseconds is 1973-03-03);
- ISO 8601 (`2026-12-01T10:00:00Z`, `+00:00` offsets, a space for the T); without an offset,
  UTC.
"0" or nothing (the guide's example default) is no capacity end. Anything else, a time a
calendar cannot hold included (decide/numbers.py: the years 1 to 9999), is kept as unreadable: the plan says so, and the job runs without the stop rather than failing on a
platform value.
"""

from __future__ import annotations

import re

from entrypoint.settings import SETTINGS_BY_FIELD

CAPACITY_END_ENV = SETTINGS_BY_FIELD["capacity_ends_at"].env  # SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP
MILLISECONDS_FROM = 1e11
_NUMBER = re.compile(r"^[0-9]+(\.[0-9]+)?$")


def parse_capacity_end(raw: str | None) -> tuple[float | None, bool]:
    """(the capacity's end in epoch seconds or None, whether the value was readable)."""
    from entrypoint.decide.numbers import parse_epoch_s, parse_number

    text = (raw or "").strip()
    if text in ("", "0"):
        return None, True
    if _NUMBER.match(text):
        value = parse_number(text, float)
        if value is None:  # too long a number for a float: no time at all
            return None, False
        ends_at = parse_epoch_s(value / 1000.0 if value >= MILLISECONDS_FROM else value)
        return ends_at, ends_at is not None
    from datetime import datetime, timezone  # only for a value in ISO form

    try:
        when = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        ends_at = parse_epoch_s(when.timestamp())  # year 1 with a positive offset is before the year 1
    except (ValueError, OverflowError):
        return None, False
    return ends_at, ends_at is not None


def decide_capacity_stop(capacity_ends_at: float | None, termination_lead_s: float, stop_lead_s: float) -> float | None:
    """When every host stops its ranks (epoch seconds), or None without a capacity end."""
    if capacity_ends_at is None:
        return None
    return capacity_ends_at - termination_lead_s - stop_lead_s


def describe_utc(epoch_s: float) -> str:
    """epoch_s as a UTC time; one a calendar cannot hold (a stop time before the year 1) says so."""
    import time

    from entrypoint.decide.numbers import parse_epoch_s

    if parse_epoch_s(epoch_s) is None:
        return f"{epoch_s:.0f} s from 1970 (no calendar date)"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch_s))



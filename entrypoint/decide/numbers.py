"""One rule for every number and date a user or the platform sets (pure).

Every BYOC_* number, the hyperparameters and SDK v3 settings that count processes and the
capacity's end are read here, so that one rule holds for all of them: plain ASCII digits (an optional sign, a
fraction and an exponent for a decimal), a finite value. Python's own `float()` and `int()`
also take "nan", "inf", "1_000" and other scripts' digits ("٣"), and a range check is false
for NaN, so each of those passed once as a valid timeout. A decimal that overflows ("1e999")
is infinite, so it is refused too. A date must be one a calendar can hold (the years 1 to
9999): `time.gmtime` raises OverflowError or OSError past that. A count of processes on one host
must be one a host can run (MAX_PROCESSES_PER_HOST): 10**29 passed once and reached the plan.
"""

from __future__ import annotations

import math
import re

from typing import Any

from entrypoint.errors import JobDefinitionError

_INTEGER = re.compile(r"[+-]?[0-9]{1,30}")
_DECIMAL = re.compile(r"[+-]?([0-9]{1,400}(\.[0-9]{0,400})?|\.[0-9]{1,400})([eE][+-]?[0-9]{1,6})?")
# What datetime holds, in epoch seconds: 0001-01-01 00:00:00 UTC and 9999-12-31 23:59:59 UTC (dates,
# not durations: no _S).
CALENDAR_FIRST = -62135596800.0
CALENDAR_LAST = 253402300799.0
# Processes one host may be asked to run: the largest EC2 instances have 896 vCPUs and 128
# NeuronCores, and a process per vCPU is the most any launch here makes sense of.
MAX_PROCESSES_PER_HOST = 4096


def parse_number(text: str, kind: type) -> int | float | None:
    """text as an int or a finite float (kind), or None when it is not one."""
    text = text.strip()
    if kind is int:
        return int(text) if _INTEGER.fullmatch(text) else None
    if not _DECIMAL.fullmatch(text):
        return None
    value = float(text)
    return value if math.isfinite(value) else None


def parse_count(value: Any, high: int | None = None) -> int | None:
    """A count a job sets (processes): an int (not a bool) or its text by the one rule, from 1
    to high (no bound when None); None when it is not one."""
    if isinstance(value, bool):
        return None
    number = value if isinstance(value, int) else parse_number(value, int) if isinstance(value, str) else None
    if number is None or number < 1 or (high is not None and number > high):
        return None
    return number


def parse_setting(name: str, raw: str, kind: type, low: float, high: float | None = None) -> int | float:
    """A number setting's value, or a JobDefinitionError naming it (a bad job definition)."""
    value = parse_number(raw, kind)
    if value is None or value < low or (high is not None and value > high):
        what = "a whole number" if kind is int else "a finite decimal number"
        bound = f"between {low:.12g} and {high:.12g}" if high is not None else f"at least {low:.12g}"
        raise JobDefinitionError(f"The environment variable {name}={raw!r} must be {what} {bound}"
                                 f"{' (not NaN or infinite)' if kind is float else ''}.")
    return value


def parse_epoch_s(value: float) -> float | None:
    """value (epoch seconds) when a calendar can hold it, else None."""
    return value if math.isfinite(value) and CALENDAR_FIRST <= value <= CALENDAR_LAST else None

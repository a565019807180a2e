"""The launch's settings (entrypoint/settings.py: the LaunchSettings record, every timeout,
interval and port) read from the job's environment (pure), by walking the one table of them
(entrypoint/settings.py: SETTINGS): BYOC_* variables, checked here; a bad value is a bad job
definition.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from entrypoint.errors import JobDefinitionError
from entrypoint.settings import SETTINGS, SETTINGS_BY_FIELD, LaunchSettings, Setting


def decide_capacity_stop_at(settings: LaunchSettings) -> float | None:
    """When the ranks get SIGTERM before the training plan's capacity ends (epoch s), or None."""
    from entrypoint.decide.capacity import decide_capacity_stop

    lead = settings.capacity_stop_lead if settings.capacity_stop_lead is not None else settings.grace_period_s
    return decide_capacity_stop(settings.capacity_ends_at, settings.capacity_termination_lead_s, lead)


def parse_launch_settings(environ: Mapping[str, str]) -> LaunchSettings:
    """Every row of the table (entrypoint/settings.py: SETTINGS), in its order: a port that
    follows another setting comes after it."""
    values: dict[str, Any] = {}
    for row in SETTINGS:
        values[row.field] = parse_setting_row(row, environ, values)
    return LaunchSettings(**values)


def parse_setting_row(row: Setting, environ: Mapping[str, str], parsed: Mapping[str, Any]) -> Any:
    """One setting's value: its default when unset or empty (its old name read then, where it
    has one), else the value checked against its kind and bounds."""
    if row.parser:
        return PARSERS[row.parser](row, environ)
    name = row.env if environ.get(row.env) or not row.old_env else row.old_env
    if row.kind is bool:
        return parse_switch(environ, name, row.default)
    return _parse_number(environ, name, decide_default(row, parsed), row.kind, row.low, row.high, row.zero_is_off)


def decide_default(row: Setting, parsed: Mapping[str, Any]) -> Any:
    """The row's default; for one that follows another setting (a port beside the master port),
    that setting's value + offset, when within the row's bounds."""
    if not row.follows:
        return row.default
    value = parsed[row.follows] + row.offset
    return value if row.high is None or value <= row.high else row.default


def describe_default(row: Setting) -> str:
    """The default as the docs' settings tables write it (tests/docs/test_settings_table.py)."""
    if row.follows:
        return f"{row.follows.replace('_', ' ')} + {row.offset}"
    if row.default is None:
        return row.none_means
    if row.kind is bool:
        return "1" if row.default else "0"
    if row.kind is str:
        return row.default or "off"
    return f"{row.default:g}"


def _parse_number(environ: Mapping[str, str], name: str, default: float | None, kind: type, low: float,
                  high: float | None = None, zero_is_off: bool = False):
    """A BYOC_* number, by the one rule of decide/numbers.py; default when unset or empty."""
    from entrypoint.decide.numbers import parse_number, parse_setting

    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    if zero_is_off and parse_number(raw, kind) == 0:
        return kind(0)
    return parse_setting(name, raw, kind, low, high)


def parse_switch(environ: Mapping[str, str], name: str, default: bool | None) -> bool | None:
    raw = environ.get(name, "").strip().lower()
    if raw == "":
        return default
    if raw in ("1", "on", "true", "yes"):
        return True
    if raw in ("0", "off", "false", "no"):
        return False
    raise JobDefinitionError(f"The environment variable {name}={environ[name]!r} must be 1 (on) or 0 (off).")


def parse_health_check(raw: str) -> str:
    """BYOC_HEALTH_CHECK: "deep" runs the all-reduce check before the training
    (docs/reliability.md); empty, "off" or "0" runs none."""
    value = raw.strip().lower()
    if value in ("", "off", "0", "none", "false"):
        return ""
    if value == "deep":
        return "deep"
    raise JobDefinitionError(f"The environment variable BYOC_HEALTH_CHECK={raw!r} must be \"deep\" (an all-reduce "
                             f"across the GPUs before the training) or \"off\".")


def parse_capacity_ends_at(row: Setting, environ: Mapping[str, str]) -> float | None:
    """The training plan's capacity end (epoch s, decide/capacity.py), None without one."""
    from entrypoint.decide.capacity import parse_capacity_end

    return parse_capacity_end(environ.get(row.env))[0]


def parse_capacity_end_unreadable(row: Setting, environ: Mapping[str, str]) -> str | None:
    """The capacity's end as given when it is no time this image reads (the plan says so)."""
    from entrypoint.decide.capacity import parse_capacity_end

    return None if parse_capacity_end(environ.get(row.env))[1] else environ.get(row.env)


def parse_folder(row: Setting, environ: Mapping[str, str]) -> str | None:
    """A folder setting: a path (relative to the job's working folder, as before the table had
    it), or None when unset or empty (the module's default); one no file system takes (a NUL,
    a line break) is refused."""
    raw = environ.get(row.env) or ""
    if raw == "":
        return None
    if "\0" in raw or "\n" in raw or "\r" in raw:
        raise JobDefinitionError(f"The environment variable {row.env}={raw!r} must be a folder's path, without NUL "
                                 f"or line breaks.")
    return raw


def parse_collective_timeout_s(environ: Mapping[str, str]) -> float | None:
    """train/ddp_train.py's collective timeout, seconds: BYOC_COLLECTIVE_TIMEOUT_S, else
    BYOC_COLLECTIVE_TIMEOUT_MIN, else None (its default). The rows' own rule, the entrypoint's:
    a bad value is a JobDefinitionError naming it (refused there before the launch)."""
    seconds = parse_setting_row(SETTINGS_BY_FIELD["collective_timeout_s"], environ, {})
    if seconds is not None:
        return seconds
    minutes = parse_setting_row(SETTINGS_BY_FIELD["collective_timeout_min"], environ, {})
    return None if minutes is None else minutes * 60.0


def parse_v3_drivers(raw: str | None) -> str | None:
    """BYOC_SDK_V3_DRIVERS, by job/v3_definition.py's reading (imported only when it is set)."""
    if not raw:
        return None
    from entrypoint.job.v3_definition import parse_drivers_choice

    return parse_drivers_choice(raw)


# The rows read by a reader of their own (Setting.parser): words, not a number or a switch.
PARSERS: dict[str, Callable[[Setting, Mapping[str, str]], Any]] = {
    # Neuron's own variable: only "1" is on, anything else off (never a bad job definition).
    "exactly_one": lambda row, environ: environ.get(row.env) == "1",
    "health_check": lambda row, environ: parse_health_check(environ.get(row.env, "")),
    "capacity_end": parse_capacity_ends_at,
    "capacity_end_unreadable": parse_capacity_end_unreadable,
    "folder": parse_folder,
    # Read as before the table had it: "sdk" in any case and spacing; anything else is ours.
    "v3_drivers": lambda row, environ: parse_v3_drivers(environ.get(row.env)),
    "text": lambda row, environ: environ.get(row.env) or None,
}

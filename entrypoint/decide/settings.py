"""The launch's settings (entrypoint/settings.py: the LaunchSettings record, every timeout,
interval and port) read from the job's environment (pure): BYOC_* variables, checked here; a
bad value is a bad job definition.
"""

from __future__ import annotations

from typing import Mapping

from entrypoint.errors import JobDefinitionError
from entrypoint.settings import LaunchSettings

# Restarts in place are for transient crashes; a job failing the same way a hundred times is
# not transient.
MAX_RESTARTS_LIMIT = 100


def decide_capacity_stop_at(settings: LaunchSettings) -> float | None:
    """When the ranks get SIGTERM before the training plan's capacity ends (epoch s), or None."""
    from entrypoint.decide.capacity import decide_capacity_stop

    lead = settings.capacity_stop_lead if settings.capacity_stop_lead is not None else settings.grace_period_s
    return decide_capacity_stop(settings.capacity_ends_at, settings.capacity_termination_lead_s, lead)


def _parse_number(environ: Mapping[str, str], name: str, default: float, kind: type, low: float,
                  high: float | None = None):
    """A BYOC_* number, by the one rule of decide/numbers.py; default when unset or empty."""
    from entrypoint.decide.numbers import parse_setting

    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    return parse_setting(name, raw, kind, low, high)


def parse_launch_settings(environ: Mapping[str, str]) -> LaunchSettings:
    def number(name: str, default: float, kind: type, low: float, high: float | None = None):
        return _parse_number(environ, name, default, kind, low, high)

    master_port = number("BYOC_MASTER_PORT", 7777, int, 1, 65535)
    # BYOC_TORCHRUN_MAX_RESTARTS: the name from before restarts covered every launcher.
    restarts_name = "BYOC_MAX_RESTARTS" if environ.get("BYOC_MAX_RESTARTS") else "BYOC_TORCHRUN_MAX_RESTARTS"
    return LaunchSettings(
        master_port=master_port,
        max_restarts=number(restarts_name, 0, int, 0, MAX_RESTARTS_LIMIT),
        grace_period_s=number("BYOC_GRACE_PERIOD_S", 90.0, float, 0.0),
        host_resolution_timeout_s=number("BYOC_HOST_RESOLUTION_TIMEOUT_S", 300.0, float, 0.0),
        neuron_parallel_compile=environ.get("RUN_NEURON_PARALLEL_COMPILE") == "1",
        ssh_port=number("BYOC_SSH_PORT", 22, int, 1, 65535),
        peer_wait_timeout_s=number("BYOC_PEER_WAIT_TIMEOUT_S", 300.0, float, 0.0),
        host_lost_timeout_s=number("BYOC_HOST_LOST_TIMEOUT_S", 30.0, float, 1.0, 60.0),
        job_port=number("BYOC_JOB_PORT", master_port + 1 if master_port < 65535 else 7778, int, 1, 65535),
        hang_timeout_s=number("BYOC_HANG_TIMEOUT_S", 0.0, float, 0.0),
        health_check=parse_health_check(environ.get("BYOC_HEALTH_CHECK", "")),
        health_check_min_fraction=number("BYOC_HEALTH_CHECK_MIN_FRACTION", 0.5, float, 0.0, 1.0),
        health_check_host_gbps=number("BYOC_HEALTH_CHECK_HOST_GBPS", 0.0, float, 0.0),
        health_check_job_gbps=number("BYOC_HEALTH_CHECK_JOB_GBPS", 0.0, float, 0.0),
        health_check_mib=number("BYOC_HEALTH_CHECK_MIB", 1024, int, 1, 65536),
        health_check_port=number("BYOC_HEALTH_CHECK_PORT", master_port + 2 if master_port < 65534 else 7779, int, 1,
                                 65535),
        health_check_timeout_s=number("BYOC_HEALTH_CHECK_TIMEOUT_S", 600.0, float, 1.0),
        report=parse_switch(environ, "BYOC_REPORT", True),
        report_interval_s=number("BYOC_REPORT_INTERVAL_S", 1.0, float, 0.1, 60.0),
        tensorboard=parse_switch(environ, "BYOC_TENSORBOARD", None),
        live_interval_s=number("BYOC_LIVE_INTERVAL_S", 10.0, float, 0.5, 3600.0),
        status_interval_s=parse_status_interval(environ),
        compile_cache=parse_switch(environ, "BYOC_COMPILE_CACHE", True),
        compile_cache_max_mb=number("BYOC_COMPILE_CACHE_MAX_MB", 1024, int, 1, 1 << 20),
        compile_cache_save_every_s=number("BYOC_COMPILE_CACHE_SAVE_EVERY_S", 600.0, float, 0.0),
        **parse_capacity_settings(environ),
    )


def parse_status_interval(environ: Mapping[str, str]) -> float:
    """BYOC_STATUS_INTERVAL_S: 0 turns the status line off; else 1 s to a day."""
    if environ.get("BYOC_STATUS_INTERVAL_S", "").strip() in ("0", "0.0"):
        return 0.0
    return _parse_number(environ, "BYOC_STATUS_INTERVAL_S", 300.0, float, 1.0, 86400.0)


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


def parse_capacity_settings(environ: Mapping[str, str]) -> dict:
    from entrypoint.decide.capacity import CAPACITY_END_ENV, parse_capacity_end

    ends_at, readable = parse_capacity_end(environ.get(CAPACITY_END_ENV))
    return {"capacity_ends_at": ends_at, "capacity_end_unreadable": None if readable else environ.get(CAPACITY_END_ENV),
            "capacity_stop_lead": _parse_number(environ, "BYOC_CAPACITY_STOP_LEAD_S", None, float, 0.0)}

"""The one table of settings (entrypoint/settings.py: SETTINGS): LaunchSettings' fields and
defaults are the table's, and parse_launch_settings (decide/settings.py) reads every row by its
kind, at and beyond its bounds, with the messages a job definition gets."""

from __future__ import annotations

import typing

import pytest

from entrypoint.decide.settings import PARSERS, describe_default, parse_launch_settings
from entrypoint.errors import JobDefinitionError
from entrypoint.settings import DEFAULTS, SETTINGS, SETTINGS_BY_FIELD, LaunchSettings

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

NUMBERS = [row for row in SETTINGS if row.kind in (int, float) and not row.parser]
SWITCHES = [row for row in SETTINGS if row.kind is bool and not row.parser]


def bad_number(name: str, raw: str, kind: type, low: float, high: float | None) -> str:
    what = "a whole number" if kind is int else "a finite decimal number"
    bound = f"between {low:.12g} and {high:.12g}" if high is not None else f"at least {low:.12g}"
    return (f"The environment variable {name}={raw!r} must be {what} {bound}"
            f"{' (not NaN or infinite)' if kind is float else ''}.")


# --- the table and the record -------------------------------------------------------------------


def test_the_records_first_fields_are_the_tables_rows_with_their_defaults_and_types():
    fields = LaunchSettings._fields[:len(SETTINGS)]
    hints = typing.get_type_hints(LaunchSettings)
    assert fields == tuple(row.field for row in SETTINGS)
    assert "grace_period_s" in fields and "process_poll_s" not in fields  # the fixed group follows
    for row in SETTINGS:
        assert getattr(DEFAULTS, row.field) == row.default and type(getattr(DEFAULTS, row.field)) is type(row.default)
        assert hints[row.field] == (row.kind | None if row.default is None else row.kind), row.field


def test_every_row_is_whole():
    envs = [row.env for row in SETTINGS if not row.field.startswith("capacity_end")]
    assert len(envs) == len(set(envs)), "an environment variable read twice"
    for i, row in enumerate(SETTINGS):
        assert row.help and "\n" not in row.help and len(row.help) < 100, row.field
        assert row.kind in (int, float, bool, str) and (row.parser in PARSERS or not row.parser)
        assert row.kind is not str or row.parser, f"{row.field}: words need a reader of their own"
        if row.kind in (int, float) and row.default is not None:
            assert row.low is not None and row.low <= row.default or row.zero_is_off, row.field
            assert row.high is None or row.default <= row.high, row.field
        if row.follows:  # read after what it follows, and its own default is that default + offset
            assert row.follows in [r.field for r in SETTINGS[:i]]
            assert row.default == SETTINGS_BY_FIELD[row.follows].default + row.offset
        assert (row.default is None) == bool(row.none_means), row.field


def test_unset_or_empty_is_every_default():
    assert parse_launch_settings({}) == DEFAULTS
    assert parse_launch_settings({row.env: "" for row in SETTINGS}) == DEFAULTS


# --- numbers ------------------------------------------------------------------------------------


def just_beyond(value: float, kind: type, step: int) -> str:
    return str(int(value) + step) if kind is int else repr(value + step * max(abs(value), 1.0) * 1e-3)


@pytest.mark.parametrize("row", NUMBERS, ids=lambda r: r.env)
def test_each_number_at_and_beyond_its_bounds(row):
    at_low = str(int(row.low)) if row.kind is int else repr(row.low)
    assert getattr(parse_launch_settings({row.env: at_low}), row.field) == row.kind(row.low)
    under = just_beyond(row.low, row.kind, -1)
    if not (row.zero_is_off and float(under) == 0):
        with pytest.raises(JobDefinitionError) as caught:
            parse_launch_settings({row.env: under})
        assert str(caught.value) == bad_number(row.env, under, row.kind, row.low, row.high)
    if row.high is not None:
        at_high = str(int(row.high)) if row.kind is int else repr(row.high)
        assert getattr(parse_launch_settings({row.env: at_high}), row.field) == row.kind(row.high)
        over = just_beyond(row.high, row.kind, 1)
        with pytest.raises(JobDefinitionError) as caught:
            parse_launch_settings({row.env: over})
        assert str(caught.value) == bad_number(row.env, over, row.kind, row.low, row.high)
    for raw in ("nan", "inf", "1e999", "\u0663", "x", " "):
        with pytest.raises(JobDefinitionError, match=row.env):
            parse_launch_settings({row.env: raw})
    assert type(getattr(parse_launch_settings({row.env: at_low}), row.field)) is row.kind


def test_the_messages_a_job_definition_gets():
    for environ, said in [
        ({"BYOC_GRACE_PERIOD_S": "-1"}, "The environment variable BYOC_GRACE_PERIOD_S='-1' must be a finite decimal "
                                        "number between 0 and 2419200 (not NaN or infinite)."),
        ({"BYOC_PEER_WAIT_TIMEOUT_S": "1e10"}, "The environment variable BYOC_PEER_WAIT_TIMEOUT_S='1e10' must be a "
                                               "finite decimal number between 0 and 2419200 (not NaN or infinite)."),
        ({"BYOC_RUNTIME_DIR": "run\nhere"}, "The environment variable BYOC_RUNTIME_DIR='run\\nhere' must be a folder's "
                                            "path, without NUL or line breaks."),
        ({"BYOC_HOST_LOST_TIMEOUT_S": "61"}, "The environment variable BYOC_HOST_LOST_TIMEOUT_S='61' must be a finite "
                                             "decimal number between 1 and 60 (not NaN or infinite)."),
        ({"BYOC_MASTER_PORT": "0"}, "The environment variable BYOC_MASTER_PORT='0' must be a whole number between 1 "
                                    "and 65535."),
        ({"BYOC_REPORT": "maybe"}, "The environment variable BYOC_REPORT='maybe' must be 1 (on) or 0 (off)."),
        ({"BYOC_HEALTH_CHECK": "quick"}, "The environment variable BYOC_HEALTH_CHECK='quick' must be \"deep\" (an "
                                         "all-reduce across the GPUs before the training) or \"off\"."),
        ({"BYOC_TORCHRUN_MAX_RESTARTS": "101"}, "The environment variable BYOC_TORCHRUN_MAX_RESTARTS='101' must be a "
                                                "whole number between 0 and 100."),
    ]:
        with pytest.raises(JobDefinitionError) as caught:
            parse_launch_settings(environ)
        assert str(caught.value) == said


def test_the_old_name_is_read_only_when_the_new_one_is_unset_or_empty():
    assert parse_launch_settings({"BYOC_TORCHRUN_MAX_RESTARTS": "2"}).max_restarts == 2
    assert parse_launch_settings({"BYOC_MAX_RESTARTS": "", "BYOC_TORCHRUN_MAX_RESTARTS": "2"}).max_restarts == 2
    assert parse_launch_settings({"BYOC_MAX_RESTARTS": "1", "BYOC_TORCHRUN_MAX_RESTARTS": "bad"}).max_restarts == 1


@pytest.mark.parametrize("master, job_port, health_port", [
    (None, 7778, 7779), ("29400", 29401, 29402), ("65533", 65534, 65535),
    ("65534", 65535, 7779),  # + 2 is past the last port: the table's own default
    ("65535", 7778, 7779),
])
def test_the_ports_beside_the_master_port(master, job_port, health_port):
    settings = parse_launch_settings({"BYOC_MASTER_PORT": master} if master else {})
    assert (settings.job_port, settings.health_check_port) == (job_port, health_port)
    chosen = parse_launch_settings({"BYOC_MASTER_PORT": master or "7777", "BYOC_JOB_PORT": "9000",
                                    "BYOC_HEALTH_CHECK_PORT": "9001"})
    assert (chosen.job_port, chosen.health_check_port) == (9000, 9001)


@pytest.mark.parametrize("raw", ["0", "0.0", "0.00", " 0 ", "-0", "0e3"])
def test_zero_turns_the_status_line_off_however_it_is_written(raw):
    assert parse_launch_settings({"BYOC_STATUS_INTERVAL_S": raw}).status_interval_s == 0.0


# --- switches and words -------------------------------------------------------------------------


@pytest.mark.parametrize("row", SWITCHES, ids=lambda r: r.env)
def test_each_switch_reads_its_words(row):
    for raw, on in [("1", True), ("on", True), (" TRUE ", True), ("yes", True), ("0", False), ("Off", False),
                    ("false", False), ("no", False)]:
        assert getattr(parse_launch_settings({row.env: raw}), row.field) is on
    for raw in ("maybe", "2", "y", "\u0663"):
        with pytest.raises(JobDefinitionError) as caught:
            parse_launch_settings({row.env: raw})
        assert str(caught.value) == f"The environment variable {row.env}={raw!r} must be 1 (on) or 0 (off)."


def test_neurons_own_variable_is_on_only_at_1_and_never_refused():
    for raw, on in [("1", True), ("0", False), ("true", False), (" 1", False), ("x", False)]:
        assert parse_launch_settings({"RUN_NEURON_PARALLEL_COMPILE": raw}).neuron_parallel_compile is on


def test_the_health_checks_words():
    for raw, value in [("deep", "deep"), (" Deep ", "deep"), ("off", ""), ("0", ""), ("none", ""), ("false", "")]:
        assert parse_launch_settings({"BYOC_HEALTH_CHECK": raw}).health_check == value


def test_the_capacity_end_and_its_lead():
    read = parse_launch_settings({"SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP": "1700000000"})
    assert (read.capacity_ends_at, read.capacity_end_unreadable) == (1700000000.0, None)
    unread = parse_launch_settings({"SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP": "soon"})
    assert (unread.capacity_ends_at, unread.capacity_end_unreadable) == (None, "soon")
    assert parse_launch_settings({"BYOC_CAPACITY_STOP_LEAD_S": "0"}).capacity_stop_lead == 0.0


def test_defaults_as_the_docs_write_them():
    said = {row.env: describe_default(row) for row in SETTINGS}
    assert (said["BYOC_GRACE_PERIOD_S"], said["BYOC_HEALTH_CHECK_MIN_FRACTION"], said["BYOC_REPORT"]) == ("90", "0.5", "1")
    assert (said["BYOC_JOB_PORT"], said["BYOC_HEALTH_CHECK_PORT"]) == ("master port + 1", "master port + 2")
    assert (said["BYOC_TENSORBOARD"], said["BYOC_CAPACITY_STOP_LEAD_S"]) == ("the config", "the grace period")
    assert said["BYOC_HEALTH_CHECK"] == "off"

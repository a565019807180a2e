"""One rule for every number and date (decide/numbers.py): NaN, infinities, overflow and dates
past any calendar are refused by name (a setting) or kept as a note (the capacity's end), never
a traceback; through the real entrypoint and with hypothesis over floats and text."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from support.jobtree import failure_text, run_entrypoint, write_tree  # noqa: E402

from entrypoint.decide.capacity import describe_utc, parse_capacity_end  # noqa: E402
from entrypoint.decide.distribution import parse_distribution  # noqa: E402
from entrypoint.decide.numbers import (  # noqa: E402
    CALENDAR_LAST, MAX_PROCESSES_PER_HOST, parse_count, parse_epoch_s, parse_number, parse_setting)
from entrypoint.decide.settings import parse_launch_settings  # noqa: E402
from entrypoint.errors import JobDefinitionError  # noqa: E402
from entrypoint.settings import MAX_DURATION  # noqa: E402
from entrypoint.sdk_v3.peer_trust import parse_peer_wait_timeout  # noqa: E402

END = "SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"
DECIMAL_SETTINGS = ["BYOC_GRACE_PERIOD_S", "BYOC_HOST_RESOLUTION_TIMEOUT_S", "BYOC_PEER_WAIT_TIMEOUT_S",
                    "BYOC_HOST_LOST_TIMEOUT_S", "BYOC_HANG_TIMEOUT_S", "BYOC_HEALTH_CHECK_MIN_FRACTION",
                    "BYOC_HEALTH_CHECK_HOST_GBPS", "BYOC_HEALTH_CHECK_JOB_GBPS", "BYOC_HEALTH_CHECK_TIMEOUT_S",
                    "BYOC_REPORT_INTERVAL_S", "BYOC_CAPACITY_STOP_LEAD_S"]
WHOLE_SETTINGS = ["BYOC_MASTER_PORT", "BYOC_MAX_RESTARTS", "BYOC_SSH_PORT", "BYOC_JOB_PORT", "BYOC_HEALTH_CHECK_MIB",
                  "BYOC_HEALTH_CHECK_PORT"]
NOT_NUMBERS = ["nan", "NaN", "-nan", "inf", "+inf", "-Infinity", "1e999", "-1e999", "1_0", "\u0663", "0x10", "",
               " ", "1.5.", "\ud800", "1\x00"]


@pytest.mark.parametrize("name", DECIMAL_SETTINGS + WHOLE_SETTINGS)
@pytest.mark.parametrize("raw", [r for r in NOT_NUMBERS if r.strip()])
def test_every_number_setting_refuses_what_is_not_a_finite_number_naming_it(name, raw):
    with pytest.raises(JobDefinitionError, match=name):
        parse_launch_settings({name: raw})


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([repr, str, "{:.17e}".format, "{:f}".format]))
def test_any_float_is_read_back_or_refused_by_the_one_rule(value, form):
    text = form(value)
    got = parse_number(text, float)
    want = float(text)  # what the text says (the {:f} form rounds)
    assert got == (want if math.isfinite(want) else None)
    if form is repr and math.isfinite(value):
        assert got == value
    try:
        grace = parse_launch_settings({"BYOC_GRACE_PERIOD_S": text}).grace_period_s
    except JobDefinitionError as exc:
        assert "BYOC_GRACE_PERIOD_S" in str(exc) and not (math.isfinite(want) and 0 <= want <= MAX_DURATION)
    else:
        assert math.isfinite(grace) and 0 <= grace <= MAX_DURATION


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=30), st.sampled_from([int, float]))
def test_any_text_is_a_finite_number_or_none(text, kind):
    got = parse_number(text, kind)
    assert got is None or (type(got) is kind and math.isfinite(got))
    try:
        value = parse_setting("BYOC_X", text, kind, 0.0, 1e6)
    except JobDefinitionError as exc:
        assert "BYOC_X" in str(exc)
    else:
        assert 0.0 <= value <= 1e6


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=30), st.floats().map(repr), st.integers(min_value=-10**30, max_value=10**30).map(str)))
def test_any_capacity_end_is_a_calendar_time_or_a_note_and_always_describable(raw):
    ends_at, readable = parse_capacity_end(raw)
    assert (ends_at is None) or (readable and parse_epoch_s(ends_at) == ends_at)
    settings_ = parse_launch_settings({END: raw})
    from entrypoint.decide.plan import describe_capacity_end
    from entrypoint.decide.settings import decide_capacity_stop_at

    # never a traceback (OverflowError, OSError)
    assert describe_capacity_end(settings_, decide_capacity_stop_at(settings_)) is not None


@pytest.mark.parametrize("raw, readable", [
    ("99999999999999999999", False),  # milliseconds: the year 3,170,843,894
    # milliseconds (from 10^11 on): the last second of the year 9999, just under and over it
    (str(int(CALENDAR_LAST * 1000) - 1), True), (str(int(CALENDAR_LAST * 1000)), True),
    (str(int(CALENDAR_LAST * 1000) + 1000), False),
    ("9" * 400, False), ("0001-01-01T00:00:00+01:00", False), ("9999-12-31T23:59:59Z", True),
])
def test_a_time_past_any_calendar_is_unreadable(raw, readable):
    assert parse_capacity_end(raw)[1] is readable


def test_a_stop_before_the_year_one_is_described_not_raised():
    assert "no calendar date" in describe_utc(-1e20)
    assert "no calendar date" in describe_utc(float("nan"))


@pytest.mark.parametrize("raw", ["\u0663", "1_0", "nan", "1e999", "2.0"])
def test_process_counts_in_hyperparameters_follow_the_same_rule(raw):
    from types import SimpleNamespace

    from entrypoint.job.config import parse_hyperparameters

    hps = parse_hyperparameters({"sagemaker_mpi_enabled": "true", "sagemaker_mpi_num_of_processes_per_host": raw})
    with pytest.raises(JobDefinitionError, match="sagemaker_mpi_num_of_processes_per_host"):
        parse_distribution(SimpleNamespace(hyperparameters=hps, sdk_v3=None))


@pytest.mark.parametrize("raw, ok", [(4096, True), ("4096", True), (4097, False), ("4097", False), (10**29, False),
                                     ("1" + "0" * 29, False), (True, False)])
def test_processes_per_host_are_at_most_what_a_host_runs_under_sdk_v2_as_under_v3(raw, ok):
    """The same bound as SDK v3's process_count_per_node (tests/entrypoint/decide/test_v3_launch.py)."""
    from types import SimpleNamespace

    from entrypoint.job.config import parse_hyperparameters

    hps = parse_hyperparameters({"sagemaker_mpi_enabled": "true", "sagemaker_mpi_num_of_processes_per_host": raw})
    job = SimpleNamespace(hyperparameters=hps, sdk_v3=None)
    if ok:
        assert parse_distribution(job).processes_per_host == 4096
    else:
        with pytest.raises(JobDefinitionError, match="sagemaker_mpi_num_of_processes_per_host must be a whole number "
                                                     "from 1 to 4096"):
            parse_distribution(job)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.integers(min_value=-10**40, max_value=10**40), st.booleans(), st.floats(), st.text(max_size=32),
                 st.integers(min_value=-10**40, max_value=10**40).map(str)))
def test_any_count_is_a_whole_number_in_range_or_none(value):
    got = parse_count(value, MAX_PROCESSES_PER_HOST)
    assert got is None or (type(got) is int and 1 <= got <= MAX_PROCESSES_PER_HOST)
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_PROCESSES_PER_HOST:
        assert got == value
    assert parse_count(value) is None or parse_count(value) >= 1


@pytest.mark.parametrize("raw", ["nan", "inf", "-5", "1e999", "1e10", "2419200.5", "\u0663", "1_000"])
def test_sdk_v3s_helper_takes_the_default_for_what_the_tables_row_refuses_and_says_so(raw, capfd):
    """The row's own rule (the entrypoint refused these before handing the job to v3's drivers);
    one that reaches the helper anyway is said, and the default waited."""
    assert parse_peer_wait_timeout({"BYOC_PEER_WAIT_TIMEOUT_S": raw}) == 300.0
    assert f"BYOC_PEER_WAIT_TIMEOUT_S={raw!r} must be" in capfd.readouterr().err


@pytest.mark.parametrize("raw, seconds", [("0", 0.0), ("2419200", 2419200.0), ("2419199.5", 2419199.5), ("", 300.0)])
def test_sdk_v3s_helper_reads_what_the_row_takes(raw, seconds):
    assert parse_peer_wait_timeout({"BYOC_PEER_WAIT_TIMEOUT_S": raw}) == seconds


def test_the_v3_route_refuses_a_bad_setting_as_our_own_does():
    from entrypoint.cli import find_refused_setting

    assert find_refused_setting({"BYOC_PEER_WAIT_TIMEOUT_S": "1e10"}).startswith(
        "The environment variable BYOC_PEER_WAIT_TIMEOUT_S='1e10' must be")
    assert find_refused_setting({"BYOC_PEER_WAIT_TIMEOUT_S": "60"}) is None


# --- through the real entrypoint ----------------------------------------------------------------

@pytest.mark.parametrize("name, raw", [("BYOC_HANG_TIMEOUT_S", "nan"), ("BYOC_CAPACITY_STOP_LEAD_S", "nan"),
                                       ("BYOC_REPORT_INTERVAL_S", "nan"), ("BYOC_GRACE_PERIOD_S", "inf"),
                                       ("BYOC_MAX_RESTARTS", "1e999")])
def test_a_job_with_a_setting_that_is_not_a_number_is_refused_in_output_failure(tmp_path, name, raw):
    root = write_tree(tmp_path / "ml", script="open('ran', 'w').close()\n")
    done = run_entrypoint(root, **{name: raw, END: "1796000000"})
    assert done.returncode == 2, done.stderr
    assert name in failure_text(root) and "Traceback" not in done.stderr + failure_text(root)
    assert not (root / "code/ran").exists()
    dry = run_entrypoint(root, "--dry-run", **{name: raw})
    assert dry.returncode == 2 and name in dry.stderr


def test_a_capacity_end_past_any_clock_is_a_note_and_the_job_runs(tmp_path):
    root = write_tree(tmp_path / "ml", script="print('trained')\n")
    done = run_entrypoint(root, **{END: "99999999999999999999"})
    assert done.returncode == 0, done.stderr
    assert "is not a time this image reads" in done.stderr and "Traceback" not in done.stderr
    assert (root / "output/success").exists()

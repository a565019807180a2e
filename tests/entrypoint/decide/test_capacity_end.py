"""A training plan's capacity ending (decide/capacity.py): the time read in every form the AWS
guide and its example use, the stop time decided, said in the plan, and a real job stopped
the way StopTrainingJob stops one, with output/failure saying why."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from support.jobtree import failure_text, run_entrypoint, write_tree  # noqa: E402

from entrypoint.decide.capacity import MILLISECONDS_FROM, decide_capacity_stop, parse_capacity_end  # noqa: E402
from entrypoint.decide.settings import decide_capacity_stop_at, parse_launch_settings  # noqa: E402
from entrypoint.errors import JobDefinitionError  # noqa: E402

END = "SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"
WHEN = 1_796_000_000  # 2026-11-30 00:53:20 UTC


@pytest.mark.parametrize("raw, want", [
    (str(WHEN), WHEN),  # epoch seconds
    (f"{WHEN}.5", WHEN + 0.5),
    (str(WHEN * 1000), WHEN),  # epoch milliseconds
    (f"{WHEN * 1000}.0", WHEN),
    ("2026-11-30T00:53:20Z", WHEN),  # ISO 8601
    ("2026-11-30T00:53:20+00:00", WHEN),
    ("2026-11-30T01:53:20+01:00", WHEN),
    ("2026-11-30T00:53:20", WHEN),  # no offset: UTC
    ("2026-11-30 00:53:20", WHEN),
    (" 2026-11-30T00:53:20.000Z ", WHEN),
])
def test_the_capacity_end_is_read_in_every_documented_form(raw, want):
    assert parse_capacity_end(raw) == (pytest.approx(want), True)


@pytest.mark.parametrize("value, seconds", [
    (MILLISECONDS_FROM - 1, MILLISECONDS_FROM - 1),  # just under: seconds (the year 5138)
    (MILLISECONDS_FROM, MILLISECONDS_FROM / 1000),  # at: milliseconds (1973-03-03)
    (MILLISECONDS_FROM + 1, (MILLISECONDS_FROM + 1) / 1000),
])
def test_seconds_and_milliseconds_part_at_ten_to_the_eleventh(value, seconds):
    assert parse_capacity_end(str(int(value))) == (pytest.approx(seconds), True)


@pytest.mark.parametrize("raw", [None, "", "0", " 0 "])
def test_no_value_or_the_guides_default_is_no_capacity_end(raw):
    assert parse_capacity_end(raw) == (None, True)


@pytest.mark.parametrize("raw", ["soon", "-5", "1e12", "2026-13-01T00:00:00Z", "\x00", "\ud800"])
def test_an_unreadable_value_is_said_in_the_plan_and_stops_nothing(raw):
    settings = parse_launch_settings({END: raw})
    assert settings.capacity_ends_at is None and settings.capacity_end_unreadable == raw
    from entrypoint.decide.plan import describe_capacity_end

    assert "is not a time this image reads" in describe_capacity_end(settings, decide_capacity_stop_at(settings))[0]


def test_the_stop_is_thirty_minutes_and_the_grace_period_before_the_end():
    settings = parse_launch_settings({END: str(WHEN), "BYOC_GRACE_PERIOD_S": "120"})
    assert decide_capacity_stop_at(settings) == WHEN - 1800 - 120
    moved = parse_launch_settings({END: str(WHEN), "BYOC_CAPACITY_STOP_LEAD_S": "600"})
    assert decide_capacity_stop_at(moved) == WHEN - 1800 - 600
    assert decide_capacity_stop(None, 1800, 90) is None
    with pytest.raises(JobDefinitionError, match="BYOC_CAPACITY_STOP_LEAD_S"):
        parse_launch_settings({END: str(WHEN), "BYOC_CAPACITY_STOP_LEAD_S": "-1"})


def test_the_plan_names_the_end_and_the_stop(tmp_path):
    root = write_tree(tmp_path / "ml", script="print('x')\n")
    done = run_entrypoint(root, "--dry-run", **{END: f"{WHEN * 1000}", "BYOC_GRACE_PERIOD_S": "60"})
    assert done.returncode == 0, done.stderr
    assert ("training plan: the capacity ends at 2026-11-30 00:53:20 UTC and its instances are terminated from "
            "30 minutes before; every host stops its processes at 2026-11-30 00:22:20 UTC") in done.stdout


# A script that checkpoints on SIGTERM and exits 0, as scripts on training plans are told to.
CHECKPOINTING = """
import os, signal, sys, time
def on_term(signum, frame):
    open(os.path.join(os.environ['SM_MODEL_DIR'], 'checkpointed'), 'w').write(str(time.time()))
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print('training', flush=True)
time.sleep(60)
print('finished', flush=True)
"""


@pytest.mark.parametrize("exit_code", [0, 3])
def test_a_job_is_stopped_before_the_capacity_ends_and_says_why(tmp_path, exit_code):
    """The script's own exit code after the stop is the job's, as under the platform's stop
    (SIGTERM to the entrypoint: test_the_platforms_stop_reports_the_same_script_the_same_way):
    one that saved and exited 0 is not "killed by SIGTERM"."""
    root = write_tree(tmp_path / "ml", script=CHECKPOINTING.replace("sys.exit(0)", f"sys.exit({exit_code})"))
    ends = time.time() + 1800 + 3  # BYOC_CAPACITY_STOP_LEAD_S=0: the stop is 30 min before the end, 3 s from now
    done = run_entrypoint(root, timeout=120, **{END: f"{ends:.3f}", "BYOC_CAPACITY_STOP_LEAD_S": "0",
                                                 "BYOC_GRACE_PERIOD_S": "10"})
    assert done.returncode == exit_code, done.stderr[-2000:]
    # The script had its SIGTERM at the stop time, not before, and ended itself in its grace period.
    assert float((root / "model" / "checkpointed").read_text()) >= float(f"{ends:.3f}") - 1800
    assert "finished" not in done.stdout and "killed by SIGTERM" not in done.stderr
    assert "time is up: sending SIGKILL" not in done.stderr
    if exit_code == 0:
        assert (root / "output" / "success").exists() and not (root / "output" / "failure").exists()
        assert "because the training plan's reserved capacity ends at" in done.stderr
        assert "ended with exit code 0 after the stop" in done.stderr
    else:
        first = failure_text(root).splitlines()[0]
        assert first.startswith("Stopped at ") and "because the training plan's reserved capacity ends at" in first
        assert "with exit code 3." in failure_text(root) and "killed by" not in failure_text(root)


def test_the_platforms_stop_reports_the_same_script_the_same_way(tmp_path):
    import signal
    import subprocess

    from support.jobtree import entrypoint_env

    root = write_tree(tmp_path / "ml", script=CHECKPOINTING)
    proc = subprocess.Popen([sys.executable, "-m", "entrypoint", "train"], env=entrypoint_env(root),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "training\n"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert (root / "model" / "checkpointed").exists() and (root / "output" / "success").exists()


def test_a_job_that_begins_after_its_stop_time_is_not_started(tmp_path):
    root = write_tree(tmp_path / "ml", script="open('started', 'w')\n")
    done = run_entrypoint(root, **{END: f"{time.time() + 1800 - 60:.0f}", "BYOC_CAPACITY_STOP_LEAD_S": "0"})
    assert done.returncode == 143, done.stderr[-2000:]
    assert failure_text(root).startswith("The training never started: the training plan's reserved capacity ends at")
    assert not (root / "code" / "started").exists()


def test_without_a_capacity_end_nothing_is_stopped(tmp_path):
    root = write_tree(tmp_path / "ml", script="print('done')\n")
    done = run_entrypoint(root, **{END: "0"})
    assert done.returncode == 0 and (root / "output" / "success").exists(), done.stderr[-2000:]

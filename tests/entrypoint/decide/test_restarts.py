"""Restart in place (entrypoint/decide/restarts.py, BYOC_MAX_RESTARTS): which endings are restarted,
and a real single-process job that crashes once, or every time."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from support.jobtree import run_entrypoint, write_tree  # noqa: E402

from entrypoint.decide.settings import parse_launch_settings  # noqa: E402
from entrypoint.errors import JobDefinitionError  # noqa: E402
from entrypoint.decide.restarts import RunEnding, decide_restart  # noqa: E402
from entrypoint.outcome.failure import describe_earlier_failures  # noqa: E402
from entrypoint.rank.record_errors import build_restart_note  # noqa: E402


@pytest.mark.parametrize("role, ending, done, restarted", [
    ("mpi-leader", RunEnding(1), 0, True),
    ("mpi-leader", RunEnding(137), 1, True),
    ("single", RunEnding(1), 2, False),  # every restart used
    ("mpi-leader", RunEnding(0), 0, False),  # success
    ("mpi-leader", RunEnding(143, stopped_by="SIGTERM"), 0, False),  # the platform stopped it
    ("single", RunEnding(2, launch_error="no such file"), 0, False),  # it will never start
    ("mpi-leader", RunEnding(1, lost_host="host algo-2 stopped answering"), 0, False),
    ("torchrun", RunEnding(1), 0, False),  # one host: torchrun's own --max_restarts does it
    ("torchrun-hosts", RunEnding(1), 0, True),  # several: every host's entrypoint, on the leader's word
    ("torchrun-hosts", RunEnding(1, lost_host="host algo-2 stopped answering"), 0, False),
    ("parameter-server", RunEnding(1), 0, True),
    ("parameter-server", RunEnding(1), 2, False),
    ("mpi-worker", RunEnding(1), 0, False),  # the leader relaunches, not the workers
])
def test_which_endings_are_restarted(role, ending, done, restarted):
    from entrypoint.decide.launchers import find_family_of_role
    from entrypoint.decide.plan import Role

    # the two fields a family's decide_relaunched reads
    plan = SimpleNamespace(role=Role(role.removesuffix("-hosts")), multi_host=role != "torchrun")
    why_not = decide_restart(find_family_of_role(plan.role).decide_relaunched(plan), 2, done, ending)
    assert (why_not is None) == restarted, why_not


def test_each_attempt_gets_its_rendezvous_id_and_its_number():
    from entrypoint.decide.restarts import ATTEMPT_ENV, build_attempt_processes
    from entrypoint.decide.specs import ProcessSpec

    torchrun = ProcessSpec("torchrun", ("python", "-m", "run", "--rdzv_id", "byoc-attempt-1", "t.py", "--rdzv_id"),
                           env=(("A", "1"), (ATTEMPT_ENV, "9")))
    server = ProcessSpec("ps0", ("python", "-m", "train.ps_server"))
    second = build_attempt_processes((torchrun, server), 2)
    # the script's own last argument of the same spelling is not torchrun's
    assert second[0].argv == ("python", "-m", "run", "--rdzv_id", "byoc-attempt-2", "t.py", "--rdzv_id")
    assert second[0].env == (("A", "1"), (ATTEMPT_ENV, "2")) and second[1].env == ((ATTEMPT_ENV, "2"),)
    assert second[1].argv == server.argv
    assert build_attempt_processes((torchrun,), 1)[0].argv == torchrun.argv


def test_restarts_setting_its_old_name_and_bounds():
    assert parse_launch_settings({}).max_restarts == 0
    assert parse_launch_settings({"BYOC_MAX_RESTARTS": "3"}).max_restarts == 3
    assert parse_launch_settings({"BYOC_TORCHRUN_MAX_RESTARTS": "2"}).max_restarts == 2
    assert parse_launch_settings({"BYOC_MAX_RESTARTS": "1", "BYOC_TORCHRUN_MAX_RESTARTS": "5"}).max_restarts == 1
    for bad in ("-1", "101", "two"):
        with pytest.raises(JobDefinitionError, match="BYOC_MAX_RESTARTS"):
            parse_launch_settings({"BYOC_MAX_RESTARTS": bad})


def test_a_restarted_torchrun_host_says_so_once():
    env = {"TORCHELASTIC_RESTART_COUNT": "1", "TORCHELASTIC_MAX_RESTARTS": "3", "LOCAL_RANK": "0"}
    assert build_restart_note(env) == ("[entrypoint] restart 1 of 3: torchrun started this host's ranks again after "
                                       "one failed (BYOC_MAX_RESTARTS)")
    assert build_restart_note({**env, "LOCAL_RANK": "1"}) is None
    assert build_restart_note({**env, "TORCHELASTIC_RESTART_COUNT": "0"}) is None
    assert build_restart_note({}) is None


CRASHES_ONCE = """\
import os, sys
marker = os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "attempts")
os.makedirs(os.path.dirname(marker), exist_ok=True)
with open(marker, "a") as f:
    f.write("x")
attempts = len(open(marker).read())
if attempts <= int(os.environ.get("CRASHES", "1")):
    with open(os.path.join(os.environ["SM_OUTPUT_DIR"], "failure"), "w") as f:
        f.write(f"the script's own failure file, attempt {attempts}")
    raise RuntimeError(f"transient fault {attempts}")
print("trained on attempt", attempts)
"""


def test_a_job_that_crashes_once_is_restarted_and_succeeds(tmp_path):
    root = write_tree(tmp_path, script=CRASHES_ONCE)
    done = run_entrypoint(root, BYOC_MAX_RESTARTS="2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "restart 1 of 2: train.py exited with code 1 (rank 0 on algo-1: RuntimeError: transient fault 1); " \
           "starting it again in place (BYOC_MAX_RESTARTS)" in done.stderr
    assert "trained on attempt 2" in done.stdout
    # The first attempt's own failure file is not the job's outcome.
    assert (root / "output/success").exists() and not (root / "output/failure").exists()


def test_a_job_that_always_crashes_fails_after_its_restarts_naming_each_failure(tmp_path):
    root = write_tree(tmp_path, script=CRASHES_ONCE)
    done = run_entrypoint(root, BYOC_MAX_RESTARTS="2", CRASHES="99")
    assert done.returncode == 1
    assert (root / "output/data/attempts").read_text() == "xxx"  # the first run and 2 restarts
    assert "restart 2 of 2" in done.stderr and "restart 3" not in done.stderr
    report = (root / "output/failure").read_text()
    assert report == "the script's own failure file, attempt 3"  # the script's word stands, as without restarts


def test_the_last_failure_report_lists_the_restarted_ones(tmp_path):
    root = write_tree(tmp_path, script="import os\nraise SystemExit(int(os.environ.get('CODE', '3')))\n")
    done = run_entrypoint(root, BYOC_MAX_RESTARTS="1")
    assert done.returncode == 3
    report = (root / "output/failure").read_text()
    assert "The job was restarted 1 time(s) before this failure (BYOC_MAX_RESTARTS):\n  attempt 1: exit code 3" in report
    assert describe_earlier_failures(["a", "b"]).splitlines()[1:] == ["  attempt 1: a", "  attempt 2: b"]


def test_without_restarts_nothing_is_restarted(tmp_path):
    root = write_tree(tmp_path, script=CRASHES_ONCE)
    done = run_entrypoint(root)
    assert done.returncode == 1 and "] restart" not in done.stderr
    assert (root / "output/data/attempts").read_text() == "x"


def test_the_plan_says_how_restarts_apply_to_the_parameter_server(tmp_path):
    import json

    root = write_tree(tmp_path, script="pass\n", hosts=("algo-1", "algo-2"),
                      hyperparameters={"sagemaker_parameter_server_enabled": True})
    done = run_entrypoint(root, "--dry-run", BYOC_MAX_RESTARTS="2")
    assert done.returncode == 0, done.stderr
    notes = json.loads(done.stdout)["notes"]
    assert any(n.startswith("BYOC_MAX_RESTARTS=2 on 2 hosts: after a failure the leader restarts the parameter "
                            "server's processes on every host") for n in notes), notes

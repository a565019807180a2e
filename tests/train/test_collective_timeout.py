"""DDP's collective timeout (train/ddp_train.py): a rank waiting in a collective for a peer
that never joins fails with an error once the timeout has passed, instead of holding the job
until SageMaker's maximum runtime. Real processes: two gloo ranks, one never joins."""

from __future__ import annotations

import datetime
import subprocess
from pathlib import Path

import pytest

from tests.train.train_helpers import PYTHON, free_port, job_env
from train.ddp_train import DEFAULT_COLLECTIVE_TIMEOUT, parse_collective_timeout

REPO = Path(__file__).resolve().parents[2]

RANK = """\
import os, sys, time
import torch
import torch.distributed as dist
from train.ddp_train import start_process_group
from train.ranks import parse_rank_info

ranks = parse_rank_info(os.environ)
print("ready", flush=True)
while not os.path.exists(sys.argv[1]):  # both ranks start the rendezvous together
    time.sleep(0.05)
start_process_group("gloo", ranks, os.environ)
print("joined", flush=True)
if ranks.rank == 1:
    time.sleep(600)  # alive, its sockets open, but it never joins the collective
try:
    dist.all_reduce(torch.ones(1))
except Exception as exc:
    print(f"COLLECTIVE FAILED: {type(exc).__name__}: {exc}", flush=True)
    # Not sys.exit: the failed gloo work still held by the group can abort the interpreter's
    # exit ("terminate called without an active exception", SIGABRT), which is not under test.
    os._exit(3)
print("COLLECTIVE RETURNED", flush=True)
"""


@pytest.mark.parametrize("environ, expected", [
    ({}, DEFAULT_COLLECTIVE_TIMEOUT),
    ({"BYOC_COLLECTIVE_TIMEOUT_MIN": "45"}, datetime.timedelta(minutes=45)),  # as documented before: whole minutes
    ({"BYOC_COLLECTIVE_TIMEOUT_MIN": "0.05"}, datetime.timedelta(seconds=3)),
    ({"BYOC_COLLECTIVE_TIMEOUT_S": "3"}, datetime.timedelta(seconds=3)),
    ({"BYOC_COLLECTIVE_TIMEOUT_S": "2.5", "BYOC_COLLECTIVE_TIMEOUT_MIN": "45"}, datetime.timedelta(seconds=2.5)),
    ({"BYOC_COLLECTIVE_TIMEOUT_S": "", "BYOC_COLLECTIVE_TIMEOUT_MIN": " 10 "}, datetime.timedelta(minutes=10)),
])  # fmt: skip
def test_collective_timeout_setting(environ, expected):
    assert parse_collective_timeout(environ) == expected


@pytest.mark.parametrize("environ, seconds", [
    ({"BYOC_COLLECTIVE_TIMEOUT_S": "1"}, 1.0),  # at the low bound
    ({"BYOC_COLLECTIVE_TIMEOUT_S": "2419200"}, 2419200.0),  # at the high one: 28 days
    ({"BYOC_COLLECTIVE_TIMEOUT_S": "2419199.9"}, 2419199.9),  # just under
    ({"BYOC_COLLECTIVE_TIMEOUT_MIN": "40320"}, 2419200.0),
])  # fmt: skip
def test_the_collective_timeouts_bounds_are_the_settings_tables(environ, seconds):
    assert parse_collective_timeout(environ) == datetime.timedelta(seconds=seconds)


@pytest.mark.parametrize("environ", [
    {"BYOC_COLLECTIVE_TIMEOUT_S": "soon"}, {"BYOC_COLLECTIVE_TIMEOUT_S": "0"}, {"BYOC_COLLECTIVE_TIMEOUT_S": "-5"},
    {"BYOC_COLLECTIVE_TIMEOUT_S": "0.99"}, {"BYOC_COLLECTIVE_TIMEOUT_S": "2419200.1"}, {"BYOC_COLLECTIVE_TIMEOUT_S": "1e10"},
    {"BYOC_COLLECTIVE_TIMEOUT_S": "\u0663"}, {"BYOC_COLLECTIVE_TIMEOUT_S": "1_000"},
    {"BYOC_COLLECTIVE_TIMEOUT_S": "nan"}, {"BYOC_COLLECTIVE_TIMEOUT_MIN": "nan"}, {"BYOC_COLLECTIVE_TIMEOUT_MIN": "inf"},
    {"BYOC_COLLECTIVE_TIMEOUT_MIN": "40320.1"},
])  # fmt: skip
def test_a_bad_collective_timeout_is_an_error_naming_the_variable(environ):
    """The settings table's rule (the entrypoint refuses these before the launch, exit 2:
    tests/entrypoint/job/test_bad_input.py); run outside it, the rank says the same."""
    from entrypoint.errors import JobDefinitionError

    (name, raw), = environ.items()
    with pytest.raises(JobDefinitionError) as err:
        parse_collective_timeout(environ)
    assert str(err.value).startswith(f"The environment variable {name}={raw!r} must be a finite decimal number between")


def test_a_rank_waiting_for_a_peer_that_never_joins_fails_instead_of_hanging(tmp_path):
    go = tmp_path / "go"
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = {**job_env(tmp_path), "PYTHONPATH": str(REPO), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "BYOC_COLLECTIVE_TIMEOUT_S": "4"}
    ranks = [subprocess.Popen([PYTHON, str(script), str(go)], env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=str(tmp_path))
             for r in (0, 1)]  # fmt: skip
    try:
        for rank in ranks:
            assert rank.stdout.readline().strip() == "ready"
        go.touch()
        # Rank 1 sleeps 600 s, alive with its sockets open, so no closed connection ends rank 0's
        # wait: rank 0 ends before that only if its collective gave up. Without the timeout
        # setting it would wait the default 30 minutes (and this wait would fail).
        out, _ = ranks[0].communicate(timeout=120)
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
            rank.communicate()
    assert "joined" in out, out
    assert ranks[0].returncode == 3, out
    assert "COLLECTIVE FAILED: " in out and "Timed out" in out and "4000ms" in out, out

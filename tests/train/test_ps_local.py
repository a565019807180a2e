"""The local parameter-server launcher stops the whole job when one process fails, instead of
leaving the RPC group waiting for the missing member."""

from __future__ import annotations

import subprocess

from tests.train.train_helpers import job_env, ps_argv, write_job


def test_a_failing_worker_ends_the_job_with_its_exit_code(tmp_path):
    root = write_job(tmp_path)
    # The guard against a hang (120 s) is far under the shards' RPC timeout (30 min): they were stopped.
    result = subprocess.run(ps_argv(2, 1, ["--epochz", "3"]), env=job_env(root), capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1
    assert "unknown hyperparameter --epochz" in result.stderr
    assert "worker" in result.stderr and "stopped the others" in result.stderr
    assert (root / "output" / "failure").read_text().startswith("bad hyperparameter: unknown hyperparameter")

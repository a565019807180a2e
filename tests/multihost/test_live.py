"""The job watched live on 2 emulated hosts (torchrun): the worker's figures reach the leader
every interval (BYOC-HOST-LIVE on its job port) and are in the leader's TensorBoard folder while
the job is still running (its ranks are held after their first steps until the test has read
them); the traffic each worker sent is bounded and logged."""

import os
import re
import time
from pathlib import Path

import pytest

from localcluster import EmulatedCluster
from support.multihost import assert_nothing_left, job, needs_root, start

accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator",
                                  reason="the test extra's tensorboard (not in the image, where these tests also run)")

pytestmark = [needs_root, pytest.mark.slow]
# PYTHONPATH: this tree's entrypoint on every host, whatever the venv's editable install points at.
LIVE = {"BYOC_TENSORBOARD": "1", "BYOC_LIVE_INTERVAL_S": "1", "BYOC_REPORT_INTERVAL_S": "0.5",
        "BYOC_STATUS_INTERVAL_S": "2", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}


def scalar_tags(folder: str) -> set:
    if not os.path.isdir(folder):
        return set()
    acc = accumulator.EventAccumulator(folder)
    acc.Reload()
    return set(acc.Tags()["scalars"])


def test_the_workers_figures_arrive_live_on_the_leader():
    with EmulatedCluster(["algo-1", "algo-2"], job("held_steps_job.py", "torch_distributed")) as cluster:
        run = start(cluster, env=LIVE)
        folder = os.path.join(cluster.opt_ml("algo-1"), "output", "tensorboard", "byoc-job")
        wanted = {"rank/0/step_ms", "rank/1/step_ms", "host/algo-1/cpu_pct", "host/algo-2/cpu_pct",
                  "host/algo-2/tree_cpu_pct"}
        deadline = time.monotonic() + 120  # a hang guard, not a speed goal
        while not wanted <= scalar_tags(folder):
            assert all(code is None for code in run.exit_codes().values()), "the job ended before its figures arrived"
            assert time.monotonic() < deadline, f"missing: {wanted - scalar_tags(folder)}"
            time.sleep(0.2)
        assert all(code is None for code in run.exit_codes().values())  # read while the job runs
        with open(os.path.join(cluster.model_dir, "go"), "w"):
            pass
        result = run.wait(timeout=180)
        assert result.ok, {h: r.output[-3000:] for h, r in result.results.items()}
        worker = result.results["algo-2"].output
        sent = re.search(r"job report \(live\): (\d+) update\(s\) sent to the leader, (\d+) bytes, the largest (\d+)",
                         worker)
        assert sent, worker[-3000:]
        messages, total, largest = map(int, sent.groups())
        assert messages >= 2 and largest <= 16_500 and total <= messages * largest  # bounded: 16,000 of figures
        print(f"\nworker algo-2: {messages} live updates, {total} bytes, the largest {largest} bytes")
        leader = result.results["algo-1"].output
        assert "BYOC-STATUS elapsed_s" in leader and "BYOC-STATUS" not in worker
        assert not os.path.exists(os.path.join(cluster.opt_ml("algo-2"), "output", "tensorboard"))
        assert_nothing_left(cluster)

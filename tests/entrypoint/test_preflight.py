"""Pre-flight checks (entrypoint/preflight.py): each a pure decision on probed facts, tested on
both sides, and the whole run end to end: a fatal finding stops the job before the script."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from entrypoint.errors import EXIT_BAD_JOB
from entrypoint.preflight import MIB, PreflightFacts, decide_preflight, probe_preflight_facts
from support.jobtree import PYTHON, entrypoint_env, failure_text, write_tree

HEALTHY = PreflightFacts(host="algo-1", instance_type="ml.p4d.24xlarge", shm_bytes=64 * 1024 * MIB,
                         free_bytes=(("/opt/ml/model", 100 * 1024 * MIB),), gpu_count=8, neuron_core_count=0,
                         efa=True, memlock_soft=None, processes_per_host=8)  # fmt: skip


def texts(facts: PreflightFacts) -> list[tuple[bool, str]]:
    return [(f.fatal, f.text) for f in decide_preflight(facts)]


def test_a_healthy_host_passes():
    assert texts(HEALTHY) == []
    assert texts(HEALTHY._replace(instance_type="local", gpu_count=0, efa=False, processes_per_host=1,
                                  shm_bytes=64 * MIB)) == []  # fmt: skip


def test_dev_shm_too_small_for_nccl_is_fatal_and_for_cpu_ranks_a_warning():
    [(fatal, text)] = texts(HEALTHY._replace(shm_bytes=64 * MIB))
    assert fatal and text.startswith("/dev/shm on algo-1 is 64 MiB: NCCL between this host's 8 GPU processes")
    assert "--shm-size" in text
    [(fatal, text)] = texts(HEALTHY._replace(instance_type="local", gpu_count=0, efa=False, shm_bytes=64 * MIB,
                                             processes_per_host=2))  # fmt: skip
    assert not fatal and "for 2 processes" in text
    assert texts(HEALTHY._replace(shm_bytes=SHM_OK)) == []


SHM_OK = 1024 * MIB


def test_free_disk_fatal_below_64_mib_warning_below_1_gib():
    [(fatal, text)] = texts(HEALTHY._replace(free_bytes=(("/opt/ml/model", 10 * MIB),)))
    assert fatal and text.startswith("/opt/ml/model on algo-1 has 10 MiB free")
    [(fatal, text)] = texts(HEALTHY._replace(free_bytes=(("/opt/ml/checkpoints", 500 * MIB),)))
    assert not fatal and text == "/opt/ml/checkpoints on algo-1 has only 500 MiB free."
    assert texts(HEALTHY._replace(free_bytes=(("/opt/ml/model", 2048 * MIB),))) == []


def test_a_missing_gpu_or_neuron_core_is_fatal():
    [(fatal, text)] = texts(HEALTHY._replace(gpu_count=7, processes_per_host=7))
    assert fatal and "algo-1 (ml.p4d.24xlarge) shows 7 of its 8 GPUs" in text
    trn = HEALTHY._replace(instance_type="ml.trn1.32xlarge", gpu_count=0, processes_per_host=32)
    [(fatal, text)] = texts(trn._replace(neuron_core_count=30))
    assert fatal and "shows 30 of its 32 Neuron cores" in text
    assert texts(trn._replace(neuron_core_count=32)) == []
    assert texts(HEALTHY._replace(instance_type="ml.unknown.size")) == []  # not in the table: not checked


def test_efa_needs_unlimited_locked_memory():
    [(fatal, text)] = texts(HEALTHY._replace(memlock_soft=64 * 1024))
    assert fatal and text.startswith("ulimit -l on algo-1 is 64 KiB: EFA") and "--ulimit memlock=-1" in text
    assert texts(HEALTHY._replace(memlock_soft=64 * 1024, efa=False)) == []


def test_the_probe_reads_this_machine(tmp_path):
    facts = probe_preflight_facts("algo-1", "local", [str(tmp_path / "not-yet" / "made")], 0, 0, False, 1)
    assert facts.free_bytes[0][0] == str(tmp_path / "not-yet" / "made") and facts.free_bytes[0][1] > 0
    assert facts.shm_bytes is None or facts.shm_bytes > 0


def test_a_fatal_finding_stops_the_job_before_the_script(tmp_path):
    if os.geteuid() != 0 or shutil.which("unshare") is None or subprocess.run(
            ["unshare", "--mount", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs root and unshare(1) allowed: /opt/ml/model is a full 1 MiB tmpfs in a mount namespace")
    root = write_tree(tmp_path, script="print('must not run')\n")
    model = root / "model"
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
         'mount -t tmpfs -o size=1m tmpfs "$MODEL" && exec "$0" -m entrypoint train', PYTHON],
        env={**entrypoint_env(root), "MODEL": str(model)}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == EXIT_BAD_JOB, done.stderr[-2000:]
    assert "must not run" not in done.stdout
    report = failure_text(root)
    assert report.startswith(f"Pre-flight check failed, the training never started: {model} on algo-1 has 1 MiB free")
    assert "pre-flight: 1 fatal" in done.stderr

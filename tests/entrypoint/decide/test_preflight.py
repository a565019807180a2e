"""Pre-flight checks (entrypoint/decide/preflight.py): each a pure decision on probed facts, tested on
both sides, and the whole run end to end: a fatal finding stops the job before the script."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from entrypoint.errors import EXIT_BAD_JOB
from entrypoint.decide.preflight import MIB, PreflightFacts, decide_preflight, probe_preflight_facts
from support.jobtree import PYTHON, entrypoint_env, failure_text, write_tree

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

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


# From AWS's published specifications of the EC2 instance types (the ml.* type has the same
# accelerators); the g4dn family and the g6/g6e mid sizes were missing from the table.
@pytest.mark.parametrize("instance_type, gpus", [
    ("ml.g4dn.xlarge", 1), ("ml.g4dn.2xlarge", 1), ("ml.g4dn.4xlarge", 1), ("ml.g4dn.8xlarge", 1),
    ("ml.g4dn.16xlarge", 1), ("ml.g4dn.12xlarge", 4),
    ("ml.g6.4xlarge", 1), ("ml.g6.8xlarge", 1), ("ml.g6.16xlarge", 1),
    ("ml.g6e.2xlarge", 1), ("ml.g6e.4xlarge", 1), ("ml.g6e.8xlarge", 1), ("ml.g6e.16xlarge", 1),
    ("ml.g6e.12xlarge", 4), ("ml.p5en.48xlarge", 8), ("ml.p3.8xlarge", 4),
])  # fmt: skip
def test_every_gpu_instance_type_is_checked_for_its_gpus(instance_type, gpus):
    facts = HEALTHY._replace(instance_type=instance_type, gpu_count=gpus, processes_per_host=gpus, efa=False)
    assert texts(facts) == []
    [(fatal, text)] = texts(facts._replace(gpu_count=gpus - 1))
    assert fatal and f"algo-1 ({instance_type}) shows {gpus - 1} of its {gpus} GPUs" in text


@pytest.mark.parametrize("instance_type, cores", [
    ("ml.trn1.2xlarge", 2), ("ml.trn1n.32xlarge", 32), ("ml.trn2.48xlarge", 64),  # trn2: logical cores, LNC=2
    ("ml.inf2.xlarge", 2), ("ml.inf2.8xlarge", 2), ("ml.inf2.24xlarge", 12), ("ml.inf2.48xlarge", 24),
])  # fmt: skip
def test_every_neuron_instance_type_is_checked_for_its_cores(instance_type, cores):
    facts = HEALTHY._replace(instance_type=instance_type, gpu_count=0, neuron_core_count=cores,
                             processes_per_host=cores, efa=False)  # fmt: skip
    assert texts(facts) == []
    [(fatal, text)] = texts(facts._replace(neuron_core_count=cores - 1))
    assert fatal and f"shows {cores - 1} of its {cores} Neuron cores" in text


def test_the_instance_tables_hold_only_plausible_counts():
    from entrypoint.decide.preflight import GPUS, NEURON_CORES

    assert all(name.startswith("ml.") and count in (1, 2, 4, 8) for name, count in GPUS.items())
    assert all(name.startswith("ml.") and count % 2 == 0 for name, count in NEURON_CORES.items())
    assert not set(GPUS) & set(NEURON_CORES)


def test_efa_needs_unlimited_locked_memory():
    [(fatal, text)] = texts(HEALTHY._replace(memlock_soft=64 * 1024))
    assert fatal and text.startswith("ulimit -l on algo-1 is 64 KiB: EFA") and "--ulimit memlock=-1" in text
    assert texts(HEALTHY._replace(memlock_soft=64 * 1024, efa=False)) == []


def test_the_probe_reads_this_machine(tmp_path):
    facts = probe_preflight_facts("algo-1", "local", [str(tmp_path / "not-yet" / "made")], 0, 0, False, 1)
    assert facts.free_bytes[0][0] == str(tmp_path / "not-yet" / "made") and facts.free_bytes[0][1] > 0
    assert facts.shm_bytes is None or facts.shm_bytes > 0


def skip_without_mount_namespaces(what: str) -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None or subprocess.run(
            ["unshare", "--mount", "true"], capture_output=True).returncode != 0:
        pytest.skip(f"needs root and unshare(1) allowed: {what} is a full 1 MiB tmpfs in a mount namespace")


def run_with_a_full_folder(root, folder) -> subprocess.CompletedProcess:
    """The entrypoint on the tree `root`, with `folder` a full 1 MiB tmpfs (a private mount)."""
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
         'mount -t tmpfs -o size=1m tmpfs "$FULL" && exec "$0" -m entrypoint train', PYTHON],
        env={**entrypoint_env(root), "FULL": str(folder)}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_fatal_finding_stops_the_job_before_the_script(tmp_path):
    skip_without_mount_namespaces("/opt/ml/model")
    root = write_tree(tmp_path, script="print('must not run')\n")
    model = root / "model"
    done = run_with_a_full_folder(root, model)
    assert done.returncode == EXIT_BAD_JOB, done.stderr[-2000:]
    assert "must not run" not in done.stdout
    report = failure_text(root)
    assert report.startswith(f"Pre-flight check failed, the training never started: {model} on algo-1 has 1 MiB free")
    assert "pre-flight: 1 fatal" in done.stderr


def test_a_full_output_folder_warns_and_the_job_still_runs(tmp_path):
    """/opt/ml/output holds output/failure, output/data and NCCL's dumps, but the training does
    not need it: a full one is a warning naming it, the script runs, and the job keeps the
    script's exit code (the outcome that cannot be written goes to the log: outcome/writer.py). The
    model folder has room; only the output folder is full."""
    skip_without_mount_namespaces("/opt/ml/output")
    root = write_tree(tmp_path, script="print('the script ran')\nraise SystemExit(3)\n")
    output = root / "output"
    done = run_with_a_full_folder(root, output)
    assert done.returncode == 3, done.stderr[-2000:]
    assert "the script ran" in done.stdout
    assert f"pre-flight warning: {output} on algo-1 has 1 MiB free: output/failure and output/data may not be written" in done.stderr
    assert "pre-flight: 0 fatal" in done.stderr


def test_the_output_folder_only_warns_where_the_model_folder_is_fatal():
    facts = HEALTHY._replace(free_bytes=(("/opt/ml/output", 10 * MIB), ("/opt/ml/model", 10 * MIB)), output_dir="/opt/ml/output")
    assert [(f.fatal, f.text.split(" on ")[0]) for f in decide_preflight(facts)] == [
        (False, "/opt/ml/output"), (True, "/opt/ml/model")]
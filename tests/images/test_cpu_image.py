"""docker/Dockerfile.cpu built for real (buildah) and run as SageMaker runs it (podman),
on one host and on two emulated hosts (network namespaces), with the real entrypoint.

Slow: the first build on a fresh machine takes minutes (the image is cached by the hash
of its inputs under $HOME/.cache/byoc-images; an unchanged tree reuses it)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from tests.images.image_harness import (
    build_run_args,
    probe_image_config,
    run_hosts,
    run_podman,
    start_network,
    write_job_tree,
)

pytestmark = pytest.mark.slow

SIZE_GOAL_BYTES = 1_500_000_000

# What a rank saw, written where the test can read it (model/ is shared, as in local mode),
# then the real training script from train/ runs in the same process.
RECORDING_JOB = """\
import json, os, runpy, socket, sys
rank = os.environ.get("RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or "0"
record = {
    "hostname": socket.gethostname(),
    "current_host": os.environ.get("SM_CURRENT_HOST"),
    "rank": int(rank),
    "world_size": int(os.environ.get("WORLD_SIZE") or os.environ.get("OMPI_COMM_WORLD_SIZE") or 1),
    "argv": sys.argv[1:],
}
with open(f"/opt/ml/model/rank-{rank}.json", "w") as f:
    json.dump(record, f)
sys.argv = [sys.argv[0], *sys.argv[1:]]
runpy.run_module(os.environ.get("JOB_MODULE", "train.ddp_train"), run_name="__main__")
"""


def _npz(x, y) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, x=x, y=y)
    return buffer.getvalue()


def _channels() -> dict[str, dict[str, bytes]]:
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(3, 8)) * 2
    y = rng.integers(0, 3, size=160)
    x = (centers[y] + rng.normal(size=(160, 8))).astype(np.float32)
    return {"train": {"part-0.npz": _npz(x[:64], y[:64]), "part-1.npz": _npz(x[64:128], y[64:128])},
            "validation": {"val.npz": _npz(x[128:], y[128:])}}


def _records(model_dir: Path) -> list[dict]:
    return sorted((json.loads(p.read_text()) for p in model_dir.glob("rank-*.json")), key=lambda r: r["rank"])


def _show(runs) -> str:
    return "\n".join(f"--- {r.host} (exit {r.returncode}) ---\n{r.output[-6000:]}" for r in runs)


def test_image_config_is_what_sagemaker_expects(cpu_image, image_store):
    config = probe_image_config(image_store, cpu_image.tag)
    inner = config["Config"]
    assert inner["Entrypoint"] == ["python3", "-m", "entrypoint"]
    assert not inner.get("Cmd")
    env = dict(item.split("=", 1) for item in inner["Env"])
    assert env["PYTHONDONTWRITEBYTECODE"] == "1" and env["PYTHONUNBUFFERED"] == "1"
    assert env["LANG"] == "C.UTF-8" and env["BASH_ENV"] == "/etc/byoc/bash-env.sh"
    assert env["PATH"].startswith("/usr/local/byoc/bin:/opt/venv/bin:")
    labels = inner["Labels"]
    assert labels["org.opencontainers.image.version"] == "0.1.0"
    assert len(labels["org.opencontainers.image.revision"]) in (40, len("unknown"))
    # Docker media types: SageMaker rejects OCI manifests.
    assert config["ManifestType"] == "application/vnd.docker.distribution.manifest.v2+json"
    assert cpu_image.size_bytes <= SIZE_GOAL_BYTES, f"{cpu_image.size_bytes / 1e9:.2f} GB"


FILESYSTEM_CHECKS = r"""
set -e
# No key of any kind is in the image.
! ls /etc/ssh/ssh_host_* 2>/dev/null
! ls /root/.ssh/id_* 2>/dev/null
grep -q 'StrictHostKeyChecking no' /root/.ssh/config
grep -q 'UserKnownHostsFile /dev/null' /root/.ssh/config
test "$(command -v train)" = /usr/local/byoc/bin/train
test "$(command -v python3)" = /opt/venv/bin/python3
command -v torchrun mpirun pip >/dev/null
test -x /usr/sbin/sshd
for d in code model checkpoints input/config input/data output/data; do test -d /opt/ml/$d; done
horovodrun --check-build | grep -F '[X] PyTorch'
echo FILESYSTEM-OK
"""


def test_image_filesystem_has_tools_and_no_keys(cpu_image, image_store):
    # /bin/sh is dash: it does not read BASH_ENV, so this sees the image as built.
    args = build_run_args(cpu_image.tag, name="byoc-fs-check", entrypoint="/bin/sh",
                          command=["-c", FILESYSTEM_CHECKS], timeout_s=120)
    result = run_podman(image_store, args, timeout_s=180)
    assert result.returncode == 0 and "FILESYSTEM-OK" in result.stdout, result.stdout + result.stderr


def test_bash_env_prepares_sshd_for_drivers_that_bypass_the_entrypoint(cpu_image, image_store):
    """SDK v3 runs `bash -c` scripts: BASH_ENV makes /run/sshd and this container's own host
    keys; two containers get different keys."""
    script = "test -d /run/sshd && /usr/sbin/sshd -t && ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub"
    fingerprints = []
    for n in (1, 2):
        args = build_run_args(cpu_image.tag, name=f"byoc-bashenv-{n}", entrypoint="/bin/bash",
                              command=["-c", script], timeout_s=120)
        result = run_podman(image_store, args, timeout_s=180)
        assert result.returncode == 0, result.stdout + result.stderr
        fingerprints.append(result.stdout.split()[1])
    assert fingerprints[0] != fingerprints[1]


@pytest.mark.parametrize(
    "how",
    ["entrypoint", "bash-c"],
    ids=["docker-run-image-train", "sdk-v3-bash-c-train"],
)
def test_single_host_train(cpu_image, image_store, tmp_path, how):
    """`docker run <image> train` with an /opt/ml tree, and the same through `bash -c train`
    (a platform that bypasses the ENTRYPOINT)."""
    hosts = ["algo-1"]
    mounts = write_job_tree(
        tmp_path, hosts,
        {"sagemaker_program": "job.py", "epochs": 1, "max_steps": 2, "log_every": 1},
        {"job.py": RECORDING_JOB}, _channels(),
    )
    command = ["train"] if how == "entrypoint" else ["-c", "train"]
    with start_network(hosts, tmp_path) as network:
        if how == "bash-c":
            args = build_run_args(cpu_image.tag, name=f"{network.hosts[0].netns}-c", hostname="algo-1",
                                  netns=network.hosts[0].netns, hosts_file=network.hosts_file,
                                  mounts=mounts["algo-1"], entrypoint="/bin/bash", command=command,
                                  timeout_s=240)
            result = run_podman(image_store, args, timeout_s=300)
            runs_ok, shown = result.returncode == 0, result.stdout + result.stderr
        else:
            runs = run_hosts(image_store, cpu_image.tag, network, mounts, command)
            runs_ok, shown = all(r.returncode == 0 for r in runs), _show(runs)
    assert runs_ok, shown
    records = _records(tmp_path / "model")
    assert [(r["hostname"], r["current_host"], r["world_size"]) for r in records] == [("algo-1", "algo-1", 1)]
    assert records[0]["argv"][:2] == ["--epochs", "1"]
    assert not (tmp_path / "algo-1" / "output" / "failure").exists()


def _two_host_job(cpu_image, image_store, tmp_path, hyperparameters, module):
    hosts = ["algo-1", "algo-2"]
    job = RECORDING_JOB.replace('os.environ.get("JOB_MODULE", "train.ddp_train")', repr(module))
    mounts = write_job_tree(tmp_path, hosts, hyperparameters, {"job.py": job}, _channels())
    with start_network(hosts, tmp_path) as network:
        runs = run_hosts(image_store, cpu_image.tag, network, mounts, timeout_s=300)
    assert all(r.returncode == 0 for r in runs), _show(runs)
    records = _records(tmp_path / "model")
    assert [(r["rank"], r["world_size"]) for r in records] == [(0, 2), (1, 2)], _show(runs)
    # One rank per host, each on its own host (hostname and SageMaker's view agree).
    assert sorted((r["hostname"], r["current_host"]) for r in records) == [
        ("algo-1", "algo-1"), ("algo-2", "algo-2")]
    for host in hosts:
        assert not (tmp_path / host / "output" / "failure").exists(), _show(runs)


def test_two_hosts_torchrun(cpu_image, image_store, tmp_path):
    _two_host_job(cpu_image, image_store, tmp_path, {
        "sagemaker_program": "job.py", "sagemaker_torch_distributed_enabled": True,
        "epochs": 1, "max_steps": 2, "log_every": 1,
    }, "train.ddp_train")


def test_two_hosts_mpirun_over_ssh(cpu_image, image_store, tmp_path):
    _two_host_job(cpu_image, image_store, tmp_path, {
        "sagemaker_program": "job.py", "sagemaker_mpi_enabled": True,
        "sagemaker_mpi_num_of_processes_per_host": 1,
        "epochs": 1, "max_steps": 2, "log_every": 1,
    }, "train.mpi_train")

"""docker/Dockerfile.cpu built with Docker and run as SageMaker runs it (`docker run <image>
train`), with the real entrypoint. Multi-host runs go through the SageMaker SDK's local
mode (tests/localmode/).

Slow: the first build on a fresh machine takes minutes (Docker's layer cache keeps it)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest

from support.jobtree import write_tree
from tests.images.image_harness import build_run_argv, probe_image_config, run_docker

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


def test_image_config_is_what_sagemaker_expects(cpu_image):
    inner = probe_image_config(cpu_image.tag)["Config"]
    assert inner["Entrypoint"] == ["python3", "-m", "entrypoint"]
    assert inner["Cmd"] == ["train"]  # what SageMaker passes; also for a platform that passes nothing
    env = dict(item.split("=", 1) for item in inner["Env"])
    assert env["PYTHONDONTWRITEBYTECODE"] == "1" and env["PYTHONUNBUFFERED"] == "1"
    assert env["LANG"] == "C.UTF-8" and env["BASH_ENV"] == "/etc/byoc/bash-env.sh"
    assert env["PATH"].startswith("/usr/local/byoc/bin:/opt/venv/bin:")
    # The build's pip settings (docker/build-local/) stay in the builder stage.
    assert "PIP_CONFIG_FILE" not in env
    labels = inner["Labels"]
    assert labels["org.opencontainers.image.version"] == "0.1.0"
    assert len(labels["org.opencontainers.image.revision"]) in (40, len("unknown"))
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
# Development-only code does not ship; nothing the build added for this machine does.
! python3 -c 'import localcluster' 2>/dev/null
! python3 -c 'import jobs' 2>/dev/null
! test -e /opt/byoc-build-local
echo FILESYSTEM-OK
"""


def test_image_filesystem_has_tools_and_no_keys(cpu_image):
    # /bin/sh is dash: it does not read BASH_ENV, so this sees the image as built.
    result = run_docker(build_run_argv(cpu_image.tag, entrypoint="/bin/sh", command=["-c", FILESYSTEM_CHECKS]))
    assert result.returncode == 0 and "FILESYSTEM-OK" in result.stdout, result.stdout + result.stderr


def test_bash_env_prepares_sshd_for_drivers_that_bypass_the_entrypoint(cpu_image):
    """SDK v3 runs `bash -c` scripts: BASH_ENV makes /run/sshd and this container's own host
    key, on a tmpfs and nowhere else (a stopped container's writable layer holds no private
    key); the image's sshd uses that key; two containers get different keys."""
    script = (
        "test -d /run/sshd && /usr/sbin/sshd -t"
        " && test \"$(/usr/sbin/sshd -T | sed -n 's/^hostkey //p')\" = /dev/shm/byoc-sshd/ssh_host_ed25519_key"
        " && test \"$(stat -f -c %T /dev/shm/byoc-sshd)\" = tmpfs"
        " && test \"$(stat -c %a /dev/shm/byoc-sshd)\" = 700"
        " && ! ls /etc/ssh/ssh_host_* 2>/dev/null"
        " && ! grep -rlsI 'PRIVATE KEY' /etc /root /run /opt/ml /tmp"
        " && ssh-keygen -lf /dev/shm/byoc-sshd/ssh_host_ed25519_key.pub"
    )
    fingerprints = []
    for _ in (1, 2):
        result = run_docker(build_run_argv(cpu_image.tag, entrypoint="/bin/bash", command=["-c", script]))
        assert result.returncode == 0, result.stdout + result.stderr
        fingerprints.append(result.stdout.split()[1])
    assert fingerprints[0] != fingerprints[1]


# Two ranks started without our rank wrapper (as SDK v3's drivers start them), printing to one
# pipe through a slow reader: lines glue unless each line is one write. The inner bash reads
# BASH_ENV once the v3 driver folder exists, as v3's `bash -c` driver scripts do.
V3_PRINTER = "import sys\nfor i in range(3000):\n    print('LINE', sys.argv[1], i, 'x' * (i % 200), 'END')\n"
SLOW_READER = "import sys, time\nwhile chunk := sys.stdin.buffer.read1(4096):\n    sys.stdout.buffer.write(chunk)\n    time.sleep(0.0005)\n"
V3_JOB = ("mkdir -p /opt/ml/input/data/sm_drivers && : > /opt/ml/input/data/sm_drivers/sm_train.sh && exec bash -c '"
          "{ python3 /t/printer.py a & python3 /t/printer.py b & wait; } | python3 /t/slow.py; "
          "echo BYOC_WHOLE_LINES=$BYOC_WHOLE_LINES'")


def test_ranks_an_sdk_v3_driver_starts_write_whole_lines(cpu_image, tmp_path):
    """In a v3 job (its sm_drivers present) bash-env.sh sets BYOC_WHOLE_LINES=1 and the image's
    byoc-whole-lines.pth makes every Python process write a line per write."""
    (tmp_path / "printer.py").write_text(V3_PRINTER)
    (tmp_path / "slow.py").write_text(SLOW_READER)
    argv = build_run_argv(cpu_image.tag, mounts=[(tmp_path, "/t:ro")], entrypoint="/bin/bash", command=["-c", V3_JOB])
    result = run_docker(argv, timeout_s=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "BYOC_WHOLE_LINES=1" in result.stdout
    lines = [line for line in result.stdout.splitlines() if "LINE " in line or " END" in line]
    bad = [line for line in lines if not re.fullmatch(r"LINE [ab] (\d+) x* END", line)]
    assert len(lines) == 6000 and not bad, bad[:3]


# SDK v3's torchrun driver, as it runs in a v3 job: its sm_train.sh names torchrun_driver.py, the
# driver (a Python process under `bash -c`) sets NCCL_PROTO=simple and runs `torchrun` from PATH.
V3_TORCHRUN_JOB = (
    "mkdir -p /opt/ml/input/data/sm_drivers "
    "&& echo 'python3 /opt/ml/input/data/sm_drivers/distributed_drivers/torchrun_driver.py' "
    "> /opt/ml/input/data/sm_drivers/sm_train.sh "
    "&& exec bash -c 'python3 /t/driver.py'")
V3_TORCHRUN_DRIVER = ("import os, subprocess, sys\n"
                      "os.environ['NCCL_PROTO'] = 'simple'  # what v3's torchrun_driver.setup_env does\n"
                      "sys.exit(subprocess.call(['torchrun', '--nproc_per_node=1', '/t/proto.py']))\n")


@pytest.mark.parametrize("job_env, want", [({}, "<unset>"), ({"NCCL_PROTO": "LL128"}, "LL128")],
                         ids=["job-without-nccl-proto", "job-with-its-own"])
def test_an_sdk_v3_torchrun_jobs_ranks_get_the_jobs_own_nccl_protocol(cpu_image, tmp_path, job_env, want):
    """v3's driver forces NCCL_PROTO=simple (a workaround for aws-ofi-nccl <= 1.5): the image's
    torchrun gives the ranks the job's own value, or none (sdk_v3/nccl_proto.py)."""
    (tmp_path / "proto.py").write_text("import os\nprint('RANK-NCCL_PROTO=' + os.environ.get('NCCL_PROTO', '<unset>'))\n")
    (tmp_path / "driver.py").write_text(V3_TORCHRUN_DRIVER)
    argv = build_run_argv(cpu_image.tag, mounts=[(tmp_path, "/t:ro")], entrypoint="/bin/bash", env=job_env,
                          command=["-c", V3_TORCHRUN_JOB])
    result = run_docker(argv, timeout_s=180)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"RANK-NCCL_PROTO={want}" in result.stdout, result.stdout[-2000:] + result.stderr[-2000:]


@pytest.mark.parametrize("how", ["entrypoint", "bash-c"], ids=["docker-run-image-train", "sdk-v3-bash-c-train"])
def test_single_host_train(cpu_image, tmp_path, how):
    """`docker run <image> train` with an /opt/ml tree, and the same through `bash -c train`
    (a platform that bypasses the ENTRYPOINT)."""
    root = write_tree(tmp_path / "ml", program="job.py", script=RECORDING_JOB,
                      hyperparameters={"epochs": 1, "max_steps": 2, "log_every": 1},
                      resource_extra={"network_interface_name": "eth0"}, channel_files=_channels())
    mounts = [(root, "/opt/ml")]
    if how == "entrypoint":
        argv = build_run_argv(cpu_image.tag, mounts=mounts, hostname="algo-1", command=["train"])
    else:
        argv = build_run_argv(cpu_image.tag, mounts=mounts, hostname="algo-1", entrypoint="/bin/bash",
                              command=["-c", "train"])
    result = run_docker(argv, timeout_s=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    records = _records(root / "model")
    assert [(r["hostname"], r["current_host"], r["world_size"]) for r in records] == [("algo-1", "algo-1", 1)]
    assert records[0]["argv"][:2] == ["--epochs", "1"]
    assert (root / "output/success").exists() and not (root / "output/failure").exists()

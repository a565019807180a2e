"""Failures as a SageMaker SDK v2 local-mode user meets them: the real SDK's fit() against the
image built from this tree (harness.py), 2 hosts, the product's default settings.

SDK v2 runs `docker-compose up --abort-on-container-exit` (the first container to exit gets
the others stopped: SIGTERM, SIGKILL 10 s later), then copies every host's /opt/ml/output into
ONE folder, host by host: the last host's output/failure is the one output.tar.gz holds. So:
- a failing rank on any host must fail fit() within 60 s, and
- whichever host's output/failure ends up last must lead with the job's root cause;
- no private SSH key may be left in any stopped container (`docker export`), on any path,
  including a container killed with SIGKILL.
"""

from __future__ import annotations

import posixpath
import subprocess
import tarfile
import threading
import time

import pytest

from localmode import harness

pytestmark = pytest.mark.slow

# Raises on the host at --fail_host (index in SM_HOSTS), once every rank is up; the others wait
# in a collective, as real training would, until the job is torn down. --hold: how long a job
# without a failure stays up.
FAULT_SCRIPT = '''
import argparse, json, os, socket, sys, time

parser = argparse.ArgumentParser()
parser.add_argument("--fail_host", type=int, default=-1)
parser.add_argument("--hold", type=float, default=0.0)
parser.add_argument("--abort", type=int, default=0)  # 1: the failing rank dies of SIGABRT, no exception
args = parser.parse_args()
hosts = json.loads(os.environ["SM_HOSTS"])
me = os.environ["SM_CURRENT_HOST"]

if "OMPI_COMM_WORLD_RANK" in os.environ:
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    barrier = comm.Barrier
else:
    import torch.distributed as dist
    dist.init_process_group("gloo")
    barrier = dist.barrier
barrier()
print(f"ranks-ready on {me}", flush=True)
if hosts.index(me) == args.fail_host:
    if args.abort:
        os.abort()  # a C++ abort in a library: no Python exception, no record of its own
    raise RuntimeError(f"injected failure on {me}")
deadline = time.time() + args.hold
while time.time() < deadline:
    time.sleep(0.1)
barrier()
print(f"done on {me}", flush=True)
'''

DISTRIBUTIONS = {
    "mpi": {"mpi": {"enabled": True, "processes_per_host": 1}},
    "torch_distributed": {"torch_distributed": {"enabled": True}},
}
# A host that outlived the failure by waiting for a peer until a setting ran out says so in the
# log: fit() failing fast means none of these (not a wall-time bound: a loaded machine is slow).
WAITED_OUT = ("(BYOC_PEER_WAIT_TIMEOUT_S)", "time is up: sending SIGKILL")


def run_fault_job(tmp_path, image, launcher, fail_host, name, hold=0.0, abort=False, **kwargs):
    return harness.run_v2_job(
        tmp_path, source_files={"fault.py": FAULT_SCRIPT}, entry_point="fault.py", instance_count=2,
        distribution=DISTRIBUTIONS[launcher], hyperparameters={"fail_host": fail_host, "hold": hold, "abort": int(abort)},
        image=image, timeout_s=420, name=name, **kwargs,
    )


# --- 1 and 2: a failing rank on either host; the merged failure names it ---------------------


@pytest.mark.parametrize("fail_host", [1, 0], ids=["worker-raises", "leader-raises"])
@pytest.mark.parametrize("launcher", sorted(DISTRIBUTIONS))
def test_a_failing_rank_fails_fit_fast_and_the_merged_failure_names_it(request, tmp_path, byoc_image, launcher,
                                                                       fail_host):
    """An MPI job's containers are scanned for private keys too (keys_left, case 4): a failed
    job's keys are gone as a successful one's are."""
    keys = request.getfixturevalue("keys_left") if launcher == "mpi" else None
    result = run_fault_job(tmp_path, byoc_image, launcher, fail_host, f"{launcher}-{fail_host}")
    if keys is not None:
        assert len(keys) == 2 and keys == {c: [] for c in keys}, keys
    assert not result.ok, result.log_tail()
    assert not result.timed_out, result.log_tail()
    assert [w for w in WAITED_OUT if w in result.log] == [], result.log_tail()
    failing = result.hosts[fail_host]
    head = result.output_text("failure")[:1024]
    assert head.startswith(f"RuntimeError: injected failure on {failing}\n"), head
    assert f"rank {fail_host} on host {failing}" in head, head
    assert f"RuntimeError: injected failure on {failing}" in result.log
    assert all(code != 0 for code in result.exit_codes.values()), result.exit_codes


@pytest.mark.parametrize("fail_host", [0, 1], ids=["leader-rank-aborts", "worker-rank-aborts"])
@pytest.mark.parametrize("launcher", sorted(DISTRIBUTIONS))
def test_a_rank_killed_by_sigabrt_is_named_in_the_merged_failure(tmp_path, byoc_image, launcher, fail_host):
    """The merged failure named the healthy host's SIGTERM (docker-compose stopped it once the
    leader exited), not the rank, the host or the signal."""
    result = run_fault_job(tmp_path, byoc_image, launcher, fail_host, f"{launcher}-abort-{fail_host}", abort=True)
    assert not result.ok and not result.timed_out, result.log_tail()
    failing = result.hosts[fail_host]
    first = result.output_text("failure")[:1024].splitlines()[0]
    assert f"rank {fail_host} " in first and f"on {failing} was killed by SIGABRT (signal 6)" in first, first
    assert all(code != 0 for code in result.exit_codes.values()), result.exit_codes


# --- 4: no private key outlives the job ------------------------------------------------------

SCANNED = ("run/", "tmp/", "root/", "etc/ssh/", "var/", "opt/ml/", "dev/")


def list_job_containers(job_root, env) -> list[str]:
    done = subprocess.run(["docker-compose", "-f", str(job_root / harness.COMPOSE_FILE), "ps", "-q"],
                          capture_output=True, text=True, env=dict(env), timeout=60)
    return done.stdout.split()


def load_changed_paths(container: str, env) -> tuple[set[str], set[str]]:
    """`docker diff`: what the container added to or changed in the image (its writable layer),
    and every path it lists (deleted ones too)."""
    done = subprocess.run(["docker", "diff", container], capture_output=True, text=True, env=dict(env), timeout=60)
    listed = {line[2:].lstrip("/"): line[:1] for line in done.stdout.splitlines()}
    return {path for path, kind in listed.items() if kind in "AC"}, set(listed)


def decide_copied_paths(changed: set[str], listed: set[str]) -> list[str]:
    """What to copy out of the container to see every file find_private_keys looks at: each
    SCANNED folder whole, and each changed path outside them with nothing listed below it (a
    folder marked changed because of what changed inside it is not copied whole: /usr)."""
    outside = [path for path in changed if not (path + "/").startswith(SCANNED)]
    leaves = [path for path in outside if not any(other.startswith(path + "/") for other in listed)]
    return [folder.rstrip("/") for folder in SCANNED] + sorted(leaves)


def find_private_keys(container: str, env) -> list[str]:
    """Every file of the stopped container (its whole filesystem, the image's layers included;
    memory-backed mounts such as /dev/shm are not in it) that is in its writable layer or under
    SCANNED and holds a private key. Read with `docker cp` of those paths only: `docker export`
    streamed the whole 1.5 GB filesystem for it, 26 s of dockerd's work a container."""
    changed, listed = load_changed_paths(container, env)
    found = []
    for path in decide_copied_paths(changed, listed):
        proc = subprocess.Popen(["docker", "cp", f"{container}:/{path}", "-"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=dict(env))
        try:
            with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
                for member in tar:
                    # Named from the copied path's last part: /root gives root/..., /usr/local/x gives x.
                    name = posixpath.normpath(posixpath.join(posixpath.dirname(path), member.name))
                    if not member.isfile() or member.size > 1 << 20:
                        continue
                    if name in changed or name.startswith(SCANNED):
                        data = tar.extractfile(member).read()
                        if b"PRIVATE KEY" in data:
                            found.append(name)
        except tarfile.ReadError:  # nothing came: the path is not there (said on stderr, below)
            pass
        error = proc.stderr.read().decode(errors="replace")
        proc.wait(timeout=120)
        assert proc.returncode == 0 or "Could not find the file" in error, f"docker cp {container}:/{path}: {error}"
    return found


@pytest.fixture
def keys_left(monkeypatch):
    """{container: [paths holding a private key]}, filled just before the harness removes the
    job's stopped containers (harness.run_compose_down)."""
    found: dict[str, list[str]] = {}
    original = harness.run_compose_down

    def scan_then_down(job_root, env):
        if job_root is not None and (job_root / harness.COMPOSE_FILE).is_file():
            for container in list_job_containers(job_root, env):
                found[container] = find_private_keys(container, env)
        original(job_root, env)

    monkeypatch.setattr(harness, "run_compose_down", scan_then_down)
    return found


def test_no_private_key_is_left_in_any_container_of_an_mpi_job_that_succeeds(tmp_path, byoc_image, keys_left):
    """A failing rank's MPI jobs are scanned in test_a_failing_rank_fails_fit_fast_…[mpi-…]."""
    result = run_fault_job(tmp_path, byoc_image, "mpi", -1, "keys-1")
    assert result.ok, result.log_tail()
    assert len(keys_left) == 2, keys_left
    assert keys_left == {c: [] for c in keys_left}


def kill_job_containers_when_running(container_root, env, marker: str, timeout_s: float = 120) -> threading.Thread:
    """In the background: once the job's containers are up and one has printed `marker`, SIGKILL
    them all (`docker kill`), as the out-of-memory killer or compose's stop timeout would.
    (Under mpirun every rank's output reaches the leader's log.)"""

    def watch():
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            job_root = harness.probe_job_root(container_root)
            containers = list_job_containers(job_root, env) if job_root else []
            logs = [subprocess.run(["docker", "logs", c], capture_output=True, text=True, env=dict(env)).stdout
                    for c in containers]
            if len(containers) == 2 and any(marker in log for log in logs):
                subprocess.run(["docker", "kill", *containers], capture_output=True, env=dict(env), timeout=60)
                return
            time.sleep(0.5)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_a_container_killed_with_sigkill_leaves_no_private_key(tmp_path, byoc_image, keys_left):
    """The one path the entrypoint cannot clean up after: the key must have been in memory."""
    env = harness.load_docker_env()
    killer = kill_job_containers_when_running(tmp_path / "killed" / "sagemaker-local", env, "ranks-ready")
    result = run_fault_job(tmp_path, byoc_image, "mpi", -1, "killed", hold=120)
    killer.join(timeout=5)
    assert not result.ok, result.log_tail()
    assert sorted(result.exit_codes.values()) == [137, 137], result.log_tail()
    assert len(keys_left) == 2, keys_left
    assert keys_left == {c: [] for c in keys_left}


# --- 3: `docker stop` of a training container (one host, plain `docker run` as SageMaker) ----

# The digits trainer of the train package, after leaving an orphan behind: `sh` exits at once
# and its background `sleep` is adopted by PID 1, our entrypoint, which must reap it.
STOP_WRAPPER = '''
import subprocess, sys
subprocess.run(["sh", "-c", "sleep 0.5 &"])
from train.ddp_train import main
main(sys.argv[1:])
'''
ZOMBIES = ("import os\n"
           "print([p for p in os.listdir('/proc') if p.isdigit() and "
           "open(f'/proc/{p}/stat').read().rsplit(')', 1)[1].split()[0] == 'Z'])")


def docker(env, *args, timeout=120, check=True):
    done = subprocess.run(["docker", *args], capture_output=True, text=True, env=dict(env), timeout=timeout)
    assert not check or done.returncode == 0, f"docker {' '.join(args)}: {done.stderr}"
    return done


def container_log(env, name) -> str:
    done = docker(env, "logs", name)
    return done.stdout + done.stderr


def test_docker_stop_checkpoints_and_the_container_ends_itself_before_its_sigkill(tmp_path, byoc_image):
    import json

    from jobs.main_job import ENTRY_SCRIPT, build_job_files, build_resource_config, write_job

    env = harness.load_docker_env()
    root = tmp_path / "ml"
    # Many epochs, checkpoints only on SIGTERM: a checkpoint file proves the stop path ran.
    files = build_job_files("ddp", overrides={"epochs": 100000, "checkpoint_every": 0, "log_every": 20})
    files["input/config/resourceconfig.json"] = json.dumps(build_resource_config(["algo-1"], "algo-1")).encode()
    files[f"code/{ENTRY_SCRIPT}"] = STOP_WRAPPER.encode()
    write_job(str(root), files)
    name = f"byoc-stop-{tmp_path.name}"[:60]
    docker(env, "run", "-d", "--name", name, "--hostname", "algo-1", "-v", f"{root}:/opt/ml", byoc_image, "train")
    try:
        deadline = time.monotonic() + 120
        while "step" not in container_log(env, name):
            assert time.monotonic() < deadline, container_log(env, name)[-3000:]
            running = docker(env, "inspect", "--format", "{{.State.Running}}", name).stdout.strip()
            assert running == "true", container_log(env, name)[-3000:]
            time.sleep(0.5)
        zombies = docker(env, "exec", name, "python3", "-c", ZOMBIES).stdout.strip()
        assert zombies == "[]", f"zombie processes (pids) in the container: {zombies}"
        assert docker(env, "inspect", "--format", "{{.State.Pid}}", name).stdout.strip() != "0"
        assert "python3 -m entrypoint train" in docker(env, "exec", name, "cat", "/proc/1/cmdline").stdout.replace("\0", " ")

        # SIGTERM to PID 1, SIGKILL after StopTrainingJob's 120 s (docker's own 10 s is a bound
        # on wall time: CI saw a loaded machine take longer to end torch's processes).
        docker(env, "stop", "-t", "120", name, timeout=300)
        logs = container_log(env, name)
        exit_code = int(docker(env, "inspect", "--format", "{{.State.ExitCode}}", name).stdout)
        # Non-zero, and not docker's SIGKILL (137): the container ended itself, and nothing in it
        # was killed either (the entrypoint's grace, torchrun's own). torchrun, which runs the
        # digits trainer even on one host, exits 1 when it is stopped; a plain script's own code
        # (143) is kept.
        assert exit_code not in (0, 137), f"exit {exit_code}\n{logs[-3000:]}"
        assert "sending SIGKILL" not in logs and "forcefully exiting" not in logs, logs[-3000:]
        assert (root / "checkpoints" / "checkpoint.pt").is_file()
        assert (root / "output" / "failure").read_text().startswith("Training was stopped by SIGTERM.")
        assert "[entrypoint] received SIGTERM" in logs
    finally:
        docker(env, "rm", "-f", name, check=False)

"""SSH between hosts trusts one per-job key, only from the leader's address (threat model:
docs/multi-host.md). Someone holding the image, or the key but not the leader's address,
gets nowhere."""

import os
import signal
import subprocess

import pytest

from localcluster import EmulatedCluster
from localcluster.optml import InstanceGroupSpec, JobSpec
from support.multihost import job, needs_root, start, wait_for_files

pytestmark = [needs_root, pytest.mark.slow]

SSH_OPTS = ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=5"]


def test_only_the_leaders_per_job_key_from_the_leaders_address_gets_in(tmp_path):
    base = job("hetero_job.py", "mpi", hold=60)
    spec = JobSpec(**{**base.__dict__, "instance_groups": (InstanceGroupSpec("train", 2), InstanceGroupSpec("data", 1)),
                      "distribution_instance_groups": ("train",)})
    with EmulatedCluster(["algo-1", "algo-2", "algo-3"], spec) as cluster:
        run = start(cluster)
        try:
            wait_for_files(cluster.model_dir, "started-", 2, timeout=90)
            # The job's own folder (runtime_dirs.py): one job-<id> under /run/byoc, mode 0700.
            found = cluster.run_on("algo-1", ["sh", "-c", "stat -c '%a %n' /run/byoc/job-*"])
            mode, folder = found.output.split()
            assert mode == "700", found.output
            # The leader itself, with the job's configuration: allowed.
            ok = cluster.run_on("algo-1", ["ssh", "-F", f"{folder}/ssh/config", "algo-2", "hostname"])
            assert ok.returncode == 0 and ok.output.strip().endswith("algo-2"), ok.output

            # Someone with a key of their own (all that holding the image gives): refused.
            own = tmp_path / "own_key"
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(own)], check=True)
            denied = cluster.run_on("algo-3", ["ssh", *SSH_OPTS, "-i", str(own), "algo-2", "true"])
            assert denied.returncode == 255 and "Permission denied" in denied.output, denied.output

            # The leader's per-job key itself, used from another host: refused (from= binding).
            stolen = tmp_path / "stolen_key"
            key = cluster.run_on("algo-1", ["cat", f"{folder}/ssh/host_ed25519_key"])
            stolen.write_text(key.output)
            os.chmod(stolen, 0o600)
            denied = cluster.run_on("algo-3", ["ssh", *SSH_OPTS, "-i", str(stolen), "algo-2", "true"])
            assert denied.returncode == 255 and "Permission denied" in denied.output, denied.output

            # The per-job key never lands in the image or on a shared disk: /run is per host.
            assert not os.path.exists(f"{folder}/ssh/host_ed25519_key") or open(f"{folder}/ssh/host_ed25519_key").read() != key.output
        finally:
            run.signal(signal.SIGTERM)
            run.wait(timeout=60, fail_fast=False)


def test_mpirun_reaches_the_third_host_through_the_second_each_trusting_only_the_jobs_hosts_keys():
    """With 3 hosts the launch radix is 1 (decide/launchers/mpirun.decide_launch_radix): mpirun starts
    algo-2's orted, and algo-2's orted starts algo-3's, logging in with algo-2's own key, which
    algo-3 accepts only from algo-2's address. Every host's key is pinned on every host."""
    with EmulatedCluster(["algo-1", "algo-2", "algo-3"], job("mpi_job.py", "mpi", hold=60)) as cluster:
        run = start(cluster)
        try:
            wait_for_files(cluster.model_dir, "started-", 3, timeout=90)
            # orted keeps the environment of the SSH session that started it: who logged in, from where.
            read = "tr '\\0' '\\n' < /proc/$(pgrep -o orted)/environ | grep ^SSH_CONNECTION="
            came_from = {h: cluster.run_on(h, ["sh", "-c", read]).output.split("=", 1)[-1].split()[:1]
                         for h in ("algo-2", "algo-3")}
            assert came_from == {"algo-2": [cluster.address("algo-1")], "algo-3": [cluster.address("algo-2")]}, came_from
            folder = cluster.run_on("algo-3", ["sh", "-c", "ls -d /run/byoc/job-*"]).output.strip()
            authorized = cluster.run_on("algo-3", ["cat", f"{folder}/ssh/authorized_keys"]).output.splitlines()
            assert sorted(line.split(",")[0] for line in authorized) == sorted(
                f'from="{cluster.address(h)}"' for h in ("algo-1", "algo-2")), authorized
            assert all(",restrict ssh-ed25519 " in line for line in authorized)
            pinned = cluster.run_on("algo-2", ["cat", f"{folder}/ssh/known_hosts"]).output.splitlines()
            assert [line.split(",")[0] for line in pinned] == ["algo-1", "algo-2", "algo-3"], pinned
            # Another host's key from the wrong address is refused: algo-1's own key, used on algo-2
            # to reach algo-3, is bound to algo-1's address.
            key = cluster.run_on("algo-1", ["cat", f"{folder}/ssh/host_ed25519_key"]).output
            denied = cluster.run_on("algo-2", ["sh", "-c", f"umask 077; printf '%s' \"$0\" > /tmp/k && ssh {' '.join(SSH_OPTS)} "
                                               f"-i /tmp/k algo-3 true", key])
            assert denied.returncode == 255 and "Permission denied" in denied.output, denied.output
        finally:
            run.signal(signal.SIGTERM)
            run.wait(timeout=60, fail_fast=False)

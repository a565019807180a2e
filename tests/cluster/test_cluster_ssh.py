"""sshd inside an emulated host, ssh between hosts: what mpirun over SSH builds on (root needed)."""

import os
import subprocess
import sys
import time

import pytest

from localcluster import EmulatedCluster

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="emulated hosts need root (namespaces, veths, mounts)")


def keygen(path):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "localcluster-test", "-f", str(path)], check=True)


def ssh_until_up(cluster, host, argv, timeout=10.0):
    """ssh from `host` until sshd answers (it needs a moment to start listening)."""
    deadline = time.monotonic() + timeout
    while True:
        result = cluster.run_on(host, argv)
        if result.returncode == 0 or time.monotonic() > deadline:
            return result
        time.sleep(0.05)


def test_sshd_with_its_own_config_accepts_ssh_from_another_host(tmp_path, machine_files):
    keygen(tmp_path / "client_key")
    keygen(tmp_path / "host_key")
    auth = tmp_path / "auth"
    auth.mkdir()
    (auth / "authorized_keys").write_text((tmp_path / "client_key.pub").read_text())
    (tmp_path / "ssh_config").write_text(
        f"Host *\n  IdentityFile {tmp_path}/client_key\n  StrictHostKeyChecking no\n"
        "  UserKnownHostsFile /dev/null\n  BatchMode yes\n  LogLevel ERROR\n"
    )
    with EmulatedCluster(["algo-1", "algo-2"]) as cluster:
        (tmp_path / "sshd_config").write_text(
            f"ListenAddress {cluster.address('algo-2')}\n"
            f"HostKey {tmp_path}/host_key\n"
            f"AuthorizedKeysFile {auth}/authorized_keys\n"
            # StrictModes refuses key files under a world-writable folder such as /tmp.
            "StrictModes no\n"
            "PidFile none\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\nUseDNS no\n"
        )
        sshd = cluster.start_on("algo-2", ["/usr/sbin/sshd", "-D", "-e", "-f", str(tmp_path / "sshd_config")])
        argv = ["ssh", "-F", str(tmp_path / "ssh_config"), "root@algo-2", "hostname; cat /proc/1/cmdline"]
        result = ssh_until_up(cluster, "algo-1", argv)
        assert result.returncode == 0, result.output + sshd.output
        hostname, init = result.output.split("\n", 1)
        assert hostname == "algo-2"
        assert "localcluster/hostinit.py" in init  # the session runs inside algo-2's PID namespace
        assert f"Accepted publickey for root from {cluster.address('algo-1')}" in sshd.output


def test_plain_sshd_with_the_machine_config_and_a_key_seeded_in_root_ssh(tmp_path, machine_files):
    """The image-like flow: `/usr/sbin/sshd -D` as the entrypoint would start it, host keys
    and /root/.ssh private to each host, one key pair in every host's /root/.ssh."""
    seed = tmp_path / "seed"
    seed.mkdir()
    keygen(seed / "id_ed25519")
    (seed / "authorized_keys").write_text((seed / "id_ed25519.pub").read_text())
    (seed / "config").write_text("Host *\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n")
    with EmulatedCluster(["algo-1", "algo-2"], ssh_seed=str(seed)) as cluster:
        sshd = cluster.start_on("algo-2", ["/usr/sbin/sshd", "-D", "-e"])
        result = ssh_until_up(cluster, "algo-1", ["ssh", "-o", "BatchMode=yes", "algo-2", "hostname"])
        assert result.returncode == 0, result.output + sshd.output
        assert result.output == "algo-2\n"
        if os.path.isfile("/root/.bashrc"):
            # The remote shell reads the host's own (empty) ~/.bashrc, not this machine's.
            rc = cluster.run_on("algo-1", ["ssh", "-o", "BatchMode=yes", "algo-2", "cat ~/.bashrc"])
            assert rc.output == "# An emulated host's root: no shell start-up work, as in a container.\n"
    # machine_files: the machine's /etc/ssh and /root/.ssh were never written


def test_mpirun_over_ssh_across_hosts(tmp_path):
    """Open MPI from algo-1 starts ranks on both hosts over SSH (plm_rsh_agent)."""
    if subprocess.run(["which", "mpirun"], capture_output=True).returncode != 0:
        pytest.skip("Open MPI (mpirun) is not installed")
    seed = tmp_path / "seed"
    seed.mkdir()
    keygen(seed / "id_ed25519")
    (seed / "authorized_keys").write_text((seed / "id_ed25519.pub").read_text())
    (seed / "config").write_text(
        "Host *\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  BatchMode yes\n  LogLevel ERROR\n"
    )
    # One write a line: print() under PYTHONUNBUFFERED writes the text and the newline apart, and
    # two ranks' lines glued in mpirun's output once ("rankrank 1 on algo-2", a loaded fresh root).
    rank = ("import os, socket; os.write(1, f\"rank {os.environ['OMPI_COMM_WORLD_RANK']} on "
            "{socket.gethostname()}\\n\".encode())")
    with EmulatedCluster(["algo-1", "algo-2"], ssh_seed=str(seed)) as cluster:
        for host in ("algo-1", "algo-2"):
            cluster.start_on(host, ["/usr/sbin/sshd", "-D"])
        assert ssh_until_up(cluster, "algo-1", ["ssh", "algo-2", "true"]).returncode == 0
        result = cluster.run_on(
            "algo-1",
            ["mpirun", "--allow-run-as-root", "--host", "algo-1:1,algo-2:1", "-np", "2",
             "-mca", "plm_rsh_no_tree_spawn", "1", "-mca", "btl_tcp_if_include", "eth0",
             "-mca", "oob_tcp_if_include", "eth0", "-mca", "btl", "^openib",
             sys.executable, "-c", rank],
            timeout=60,
        )  # fmt: skip
        assert result.returncode == 0, result.output
        assert sorted(line for line in result.output.splitlines() if line.startswith("rank")) == [
            "rank 0 on algo-1",
            "rank 1 on algo-2",
        ]

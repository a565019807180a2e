"""Per-job SSH trust: pure builders, and real key generation (no key in the image)."""

import os

import pytest

from entrypoint.hosts import ssh

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick


def test_keyscan_output_to_public_key():
    out = "# algo-1:22 SSH-2.0-OpenSSH_9.2\nalgo-1 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample\n"
    assert ssh.parse_keyscan(out) == "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample"
    assert ssh.parse_keyscan("") is None


def test_authorized_key_is_bound_to_the_leader_addresses_and_restricted():
    line = ssh.build_authorized_key("ssh-ed25519 AAAAkey", ["10.0.0.1", "fd00::1"])
    assert line == 'from="10.0.0.1,fd00::1",restrict ssh-ed25519 AAAAkey\n'


def test_sshd_config_allows_keys_only():
    text = ssh.build_sshd_config(ssh.SshFiles("/run/byoc/ssh"), 22)
    assert "PasswordAuthentication no" in text and "PermitRootLogin prohibit-password" in text
    assert "AuthorizedKeysFile /run/byoc/ssh/authorized_keys" in text


def test_every_start_generates_a_new_host_key(tmp_path):
    files = ssh.SshFiles(str(tmp_path / "ssh"))
    ssh.write_host_key_and_configs(files, 2222)
    first = ssh.public_key(files)
    ssh.write_host_key_and_configs(files, 2222)
    assert first.startswith("ssh-ed25519 ") and ssh.public_key(files) != first
    assert (tmp_path / "ssh/host_ed25519_key").stat().st_mode & 0o077 == 0


def test_the_server_offers_x25519_only_and_this_sshd_accepts_the_config(tmp_path):
    """ssh-keyscan cannot be told which key exchange to prefer: the server offering only
    X25519 keeps the workers' scans of the leader cheap. `sshd -t` checks the file."""
    import shutil
    import subprocess

    files = ssh.SshFiles(str(tmp_path / "ssh"))
    ssh.write_host_key_and_configs(files, 2222)
    assert "KexAlgorithms curve25519-sha256,curve25519-sha256@libssh.org\n" in open(files.sshd_config).read()
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    if os.geteuid() != 0:
        pytest.skip("sshd -t needs root (its privilege-separation folder, /run/sshd)")
    ssh.prepare_sshd_runtime()  # what the entrypoint does before it starts sshd
    done = subprocess.run([sshd, "-t", "-f", files.sshd_config], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_client_prefers_x25519_and_this_openssh_accepts_the_config(tmp_path):
    """X25519 key exchange first (a tenth of the post-quantum default's CPU per session, and
    the leader opens three sessions per worker); the algorithm names must be ones this
    OpenSSH knows, or every ssh would refuse the file: `ssh -G` parses it as ssh would."""
    import shutil
    import subprocess

    files = ssh.SshFiles(str(tmp_path / "ssh"))
    ssh.write_host_key_and_configs(files, 2222)
    if shutil.which("ssh") is None:
        raise AssertionError("the ssh client is part of the image and of this project's setup")
    done = subprocess.run(["ssh", "-G", "-F", files.client_config, "algo-2"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    effective = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    assert effective["kexalgorithms"].split(",")[0] == "curve25519-sha256"
    assert effective["port"] == "2222" and effective["batchmode"] == "yes"

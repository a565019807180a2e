"""SSH between the hosts of one job, for mpirun, with no key baked into the image.

Trust scheme (threat model in docs/multi-host.md):
- Every host generates a fresh ed25519 host key at start; nothing secret is in the image.
- The leader's host key is also its client identity. Each worker learns the leader's public
  key with ssh-keyscan over the job's private network when the job starts (trust on first
  use) and authorizes exactly that key, only from the leader's addresses
  (`from="…",restrict` in authorized_keys).
- The leader records each worker's host key on first contact (StrictHostKeyChecking
  accept-new, a per-job known_hosts).
Holding the image gives nobody a way in; an attacker would have to be on the cluster's
network and answer for the leader's address during the seconds the job starts.

`build_*` are pure; `write_*`/`start_*`/`scan_*` touch files and processes.
"""

from __future__ import annotations

import os
import socket
import subprocess
from dataclasses import dataclass

SSHD = "/usr/sbin/sshd"


@dataclass(frozen=True)
class SshFiles:
    """Per-job SSH files under the runtime folder (a tmpfs /run in containers)."""

    folder: str

    @property
    def host_key(self) -> str:
        return os.path.join(self.folder, "host_ed25519_key")

    @property
    def sshd_config(self) -> str:
        return os.path.join(self.folder, "sshd_config")

    @property
    def authorized_keys(self) -> str:
        return os.path.join(self.folder, "authorized_keys")

    @property
    def client_config(self) -> str:
        return os.path.join(self.folder, "config")

    @property
    def known_hosts(self) -> str:
        return os.path.join(self.folder, "known_hosts")


def build_sshd_config(files: SshFiles, port: int) -> str:
    return "\n".join(
        [
            f"Port {port}",
            f"HostKey {files.host_key}",
            f"AuthorizedKeysFile {files.authorized_keys}",
            "PidFile none",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "UseDNS no",
            "StrictModes no",
            "PermitUserEnvironment no",
            "X11Forwarding no",
            "AllowTcpForwarding no",
            "PrintMotd no",
            "LogLevel ERROR",
            "",
        ]
    )


def build_client_config(files: SshFiles, port: int) -> str:
    return "\n".join(
        [
            "Host *",
            f"  Port {port}",
            f"  IdentityFile {files.host_key}",
            "  IdentitiesOnly yes",
            f"  UserKnownHostsFile {files.known_hosts}",
            "  StrictHostKeyChecking accept-new",
            "  BatchMode yes",
            "  LogLevel ERROR",
            "  ConnectTimeout 10",
            # A dead peer is noticed in ~15 s instead of the TCP timeout's minutes.
            "  ServerAliveInterval 5",
            "  ServerAliveCountMax 3",
            "",
        ]
    )


def build_authorized_key(public_key_line: str, addresses: list[str]) -> str:
    """`ssh-ed25519 AAAA…` restricted to the leader's addresses and to running commands."""
    key_type, key_b64 = public_key_line.split()[:2]
    return f'from="{",".join(addresses)}",restrict {key_type} {key_b64}\n'


def parse_keyscan(output: str) -> str | None:
    """`algo-1 ssh-ed25519 AAAA…` -> `ssh-ed25519 AAAA…` (first ed25519 key)."""
    for line in output.splitlines():
        parts = line.split()
        if len(parts) >= 3 and not line.startswith("#") and parts[1] == "ssh-ed25519":
            return f"{parts[1]} {parts[2]}"
    return None


# --- I/O ------------------------------------------------------------------------------------


def write_host_key_and_configs(files: SshFiles, port: int) -> None:
    os.makedirs(files.folder, mode=0o700, exist_ok=True)
    for path in (files.host_key, files.host_key + ".pub"):
        if os.path.exists(path):
            os.remove(path)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "byoc-job", "-f", files.host_key],
        check=True,
        stdin=subprocess.DEVNULL,
    )
    _write(files.sshd_config, build_sshd_config(files, port))
    _write(files.client_config, build_client_config(files, port))
    _write(files.known_hosts, "")
    if not os.path.exists(files.authorized_keys):
        _write(files.authorized_keys, "")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)


def public_key(files: SshFiles) -> str:
    with open(files.host_key + ".pub") as f:
        return " ".join(f.read().split()[:2])


def authorize(files: SshFiles, public_key_line: str, addresses: list[str]) -> None:
    _write(files.authorized_keys, build_authorized_key(public_key_line, addresses))


def sshd_argv(files: SshFiles) -> tuple[str, ...]:
    return (SSHD, "-D", "-e", "-f", files.sshd_config)


def prepare_sshd_runtime() -> None:
    # sshd's privilege-separation folder; /run is a fresh tmpfs in a container.
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)


def scan_host_key(host: str, port: int, timeout_s: int = 3) -> str | None:
    try:
        done = subprocess.run(
            ["ssh-keyscan", "-T", str(timeout_s), "-t", "ed25519", "-p", str(port), host],
            capture_output=True,
            text=True,
            timeout=timeout_s + 5,
        )
    except subprocess.TimeoutExpired:
        return None
    return parse_keyscan(done.stdout)


def resolve_addresses(host: str) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return []
    return sorted({info[4][0] for info in infos})


def can_connect(host: str, port: int, timeout_s: float = 2.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False

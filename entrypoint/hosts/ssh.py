"""SSH between the hosts of one job, for mpirun, with no key baked into the image.

Trust scheme (threat model in docs/multi-host.md):
- Every host generates a fresh ed25519 host key at start; nothing secret is in the image.
- A host's key is also its client identity: mpirun's tree spawn has each host's Open MPI
  daemon start the next hosts' (decide/launchers/mpirun.decide_launch_radix).
- The keys travel on the job port (hosts/job_port.py: MPI-READY, PEER-KEYS), signed with the
  job's key and checked against the sender's address: each worker sends the leader its public
  key, the leader sends every worker every host's. Each host then authorizes exactly those
  keys, each only from its own host's addresses (`from="…",restrict` in authorized_keys), and
  pins them in a per-job known_hosts (a key that differs is refused).
Holding the image gives nobody a way in; an attacker would have to be on the cluster's
network, know the job's key, and answer for a host's address during the seconds the job
starts.

`build_*` are pure; `write_*`/`start_*`/`scan_*` touch files and processes.
"""

from __future__ import annotations

import os
import re
import subprocess

from entrypoint.decide.specs import SshFiles
from entrypoint.settings import DEFAULTS

SSHD = "/usr/sbin/sshd"


MEMORY_FILESYSTEMS = ("tmpfs", "ramfs")


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
            # X25519 only (see build_client_config): the workers' ssh-keyscan of the leader
            # would otherwise choose the post-quantum default, ~100 ms of the leader's CPU each.
            "KexAlgorithms curve25519-sha256,curve25519-sha256@libssh.org",
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
            # X25519 first: OpenSSH 9.x's default, the post-quantum sntrup761x25519, costs
            # ~100 ms of CPU on each end of every session (10 ms with X25519, measured here),
            # and the leader opens three sessions per worker (probe, orted, outcome): at 256
            # hosts, over a minute of the leader's CPU. These sessions carry only our commands
            # and the outcome; the job's own traffic (MPI, NCCL, gloo) is not over SSH at all.
            "  KexAlgorithms curve25519-sha256,curve25519-sha256@libssh.org,sntrup761x25519-sha512@openssh.com",
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


def build_authorized_keys(keys) -> str:
    """One restricted line per (host, addresses, public key) of the job (PeerKeys' shape)."""
    return "".join(build_authorized_key(key, list(addresses)) for _host, addresses, key in keys)


def build_known_hosts(keys, port: int) -> str:
    """The job's hosts' keys, pinned by name and address (`[name]:port` off port 22)."""
    def named(name: str) -> str:
        return name if port == 22 else f"[{name}]:{port}"

    return "".join(f"{','.join(named(n) for n in (host, *addresses))} {key}\n" for host, addresses, key in keys)


def parse_keyscan(output: str) -> str | None:
    """`algo-1 ssh-ed25519 AAAA…` -> `ssh-ed25519 AAAA…` (first ed25519 key)."""
    for line in output.splitlines():
        parts = line.split()
        if len(parts) >= 3 and not line.startswith("#") and parts[1] == "ssh-ed25519":
            return f"{parts[1]} {parts[2]}"
    return None


def parse_mounts(text: str) -> list[tuple[str, str]]:
    """/proc/self/mounts -> [(mount point, filesystem type)], in mount order."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 3:
            # Spaces and other odd characters in mount points are octal escapes (\040).
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1])
            mounts.append((point, fields[2]))
    return mounts


def _is_inside(path: str, folder: str) -> bool:
    """path is folder or below it (by whole names: /a is not inside /ab)."""
    try:
        return os.path.commonpath([path, folder]) == os.path.normpath(folder)
    except ValueError:  # one absolute, one not
        return False


def filesystem_of(path: str, mounts: list[tuple[str, str]]) -> str | None:
    """The type of the filesystem holding path: the last-mounted, longest mount point above it."""
    best, best_len = None, -1
    for point, fstype in mounts:
        if _is_inside(path, point) and len(point) >= best_len:
            best, best_len = fstype, len(point)
    return best


def decide_key_folder(ssh_folder: str, mounts: list[tuple[str, str]], private_folder: str) -> tuple[str, str | None]:
    """Where the job's private key lives, and a note when it has to be on disk.

    The key is removed when the job ends on every path the entrypoint survives; a container
    killed with SIGKILL (docker-compose after 10 s, the out-of-memory killer) cannot remove
    it, so the key must live in memory-backed storage that ends with the container. Docker
    does not make /run a tmpfs (the key would stay in the stopped container's writable
    layer: `docker diff`, `docker export`), but /dev/shm is one in every container, and
    mounting our own tmpfs needs CAP_SYS_ADMIN, which a plain `docker run` does not grant."""
    if filesystem_of(ssh_folder, mounts) in MEMORY_FILESYSTEMS:
        return ssh_folder, None
    if filesystem_of(private_folder, mounts) in MEMORY_FILESYSTEMS:
        # private_folder: the job's own folder in /dev/shm (runtime_dirs.py names it and makes
        # it, exclusively, mode 0700; /dev/shm is the machine's own outside a container), and
        # the host's environment beside the key (decide_host_env_file) is the job's own too.
        return os.path.join(private_folder, "ssh"), None
    return ssh_folder, (
        f"no memory-backed folder for the job's SSH key ({ssh_folder} is on disk and {os.path.dirname(private_folder)} is "
        f"not a tmpfs): the key is removed when the job ends, but a container killed with SIGKILL "
        f"would leave it on disk"
    )


# --- I/O ------------------------------------------------------------------------------------


def load_mounts() -> list[tuple[str, str]]:
    try:
        with open("/proc/self/mounts") as f:
            return parse_mounts(f.read())
    except OSError:
        return []


def remove_private_key(files: SshFiles) -> None:
    """Called on every way out of a multi-host job: no private key (nor the host's
    environment, which may hold credentials) outlives it."""
    for path in (files.host_key, files.host_key + ".pub", files.host_env):
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
    if files.key_folder and files.key_folder != files.folder:
        try:
            os.rmdir(files.key_folder)
        except OSError:
            pass


def write_host_key_and_configs(files: SshFiles, port: int) -> None:
    os.makedirs(files.folder, mode=0o700, exist_ok=True)
    os.makedirs(os.path.dirname(files.host_key), mode=0o700, exist_ok=True)
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


def write_job_keys(files: SshFiles, keys, port: int, authorized) -> None:
    """Every host's key pinned in known_hosts; those of `authorized` (the hosts that may log in
    here) in authorized_keys, each from its own addresses."""
    _write(files.known_hosts, build_known_hosts(keys, port))
    _write(files.authorized_keys, build_authorized_keys([k for k in keys if k[0] in authorized]))


def sshd_argv(files: SshFiles) -> tuple[str, ...]:
    return (SSHD, "-D", "-e", "-f", files.sshd_config)


def prepare_sshd_runtime() -> None:
    # sshd's privilege-separation folder; /run is a fresh tmpfs in a container.
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)


def scan_host_key(host: str, port: int, timeout_s: int = DEFAULTS.keyscan_timeout_s) -> str | None:
    try:
        done = subprocess.run(
            ["ssh-keyscan", "-T", str(timeout_s), "-t", "ed25519", "-p", str(port), host],
            capture_output=True,
            text=True,
            timeout=timeout_s + DEFAULTS.keyscan_margin_s,
        )
    except subprocess.TimeoutExpired:
        return None
    return parse_keyscan(done.stdout)

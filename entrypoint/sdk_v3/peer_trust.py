"""SSH trust for SageMaker Python SDK v3's MPI driver, with no key in the image.

`ModelTrainer(distributed=MPI())` bypasses our ENTRYPOINT: every host runs v3's `sm_train.sh`
with `bash -c`, whose `mpi_driver.py` starts `/usr/sbin/sshd -D` and then needs passwordless
root SSH both ways: paramiko and `ssh` from the leader (algo-1) to every worker, `ssh` from
each worker back to the leader (the "ready" file), and mpirun's own `ssh` to start `orted`.
The AWS images make that work with ONE key pair baked into the image. Here instead (threat
model in docs/multi-host.md, "SDK v3 ModelTrainer with MPI()"):

- /etc/byoc/bash-env.sh (BASH_ENV, read before v3's driver runs) makes this container's own
  ed25519 host key in /dev/shm (the image's sshd HostKey: no private key in the writable
  layer) and, in a v3 MPI job, starts this module once, in the background.
- This container's ed25519 host key is also root's client identity (`/root/.ssh/id_ed25519`
  is a link to it), as in entrypoint/hosts/ssh.py: what a peer learns with ssh-keyscan is exactly
  the key this host will log in with.
- Each host polls `ssh-keyscan -t ed25519` on the peers it must trust until their sshd
  (started by v3's driver) answers, then authorizes exactly that key, only from that peer's
  addresses, with `restrict`: the leader (the first of resourceconfig.json's hosts, v3's
  algo-1) authorizes every worker; a worker authorizes the leader only (v3 runs mpirun with
  `plm_rsh_no_tree_spawn 1`: workers never log in to each other).

Pure: decide_trusted_peers, build_authorized_keys, parse_peer_wait_timeout.
Reads: load_resource_config. Acts: write_identity, write_authorized_keys, run_trust_exchange.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from entrypoint.hosts import net, ssh
from entrypoint.job.config import ResourceConfig, parse_json_document, parse_resource_config
from entrypoint.errors import JobDefinitionError
from entrypoint.settings import DEFAULTS

# v3's mpi_utils.DEFAULT_SSH_PORT: its driver starts sshd with the image's configuration.
SSH_PORT = 22
# Marks the lines this module owns in authorized_keys (the key comment): others are kept.
KEY_TAG = "byoc-sdk-v3:"
LOG_PREFIX = "byoc sdk-v3 ssh:"


@dataclass(frozen=True)
class V3SshPaths:
    resource_config: str = "/opt/ml/input/config/resourceconfig.json"
    # The HostKey of the image's sshd drop-in (docker/scripts/configure-sshd.sh), made by
    # /etc/byoc/bash-env.sh on a tmpfs.
    host_key: str = "/dev/shm/byoc-sshd/ssh_host_ed25519_key"
    ssh_dir: str = "/root/.ssh"

    @property
    def identity(self) -> str:
        # The first name OpenSSH's client and paramiko (look_for_keys) try for an ed25519 key.
        return os.path.join(self.ssh_dir, "id_ed25519")

    @property
    def authorized_keys(self) -> str:
        # sshd's default AuthorizedKeysFile: v3 starts `sshd -D` with the image's configuration.
        return os.path.join(self.ssh_dir, "authorized_keys")


# --- deciding (pure) ------------------------------------------------------------------------


def decide_trusted_peers(resource: ResourceConfig) -> tuple[str, ...]:
    """The hosts allowed to log in here: the leader trusts the workers, a worker the leader.
    v3's leader is the literal "algo-1" (its SM_MASTER_ADDR), which is the first of `hosts`
    both in local mode (algo-1…N) and on SageMaker (hosts sorted as strings)."""
    leader = resource.hosts[0]
    if resource.current_host == leader:
        return tuple(h for h in resource.hosts if h != leader)
    return (leader,)


def build_authorized_keys(existing: str, trusted: Mapping[str, tuple[str, Sequence[str]]]) -> str:
    """authorized_keys with one line per trusted peer (`from="<its addresses>",restrict <key>
    byoc-sdk-v3:<host>`), in the order given; lines not written by this module are kept."""
    kept = [line for line in existing.splitlines() if line.strip() and KEY_TAG not in line]
    ours = [
        ssh.build_authorized_key(key, list(addresses)).rstrip("\n") + f" {KEY_TAG}{host}"
        for host, (key, addresses) in trusted.items()
    ]
    return "".join(line + "\n" for line in kept + ours)


def parse_peer_wait_timeout(environ: Mapping[str, str]) -> float:
    """BYOC_PEER_WAIT_TIMEOUT_S by its row of the settings table, as for our own mpirun flow.
    The entrypoint refused a bad value before it handed the job to v3's drivers (cli.main);
    should one reach this helper anyway (it runs in the background of v3's driver, with nobody
    to report a bad job definition to), the refusal is said and the default used."""
    from entrypoint.decide.settings import parse_setting_row
    from entrypoint.settings import SETTINGS_BY_FIELD

    try:
        return parse_setting_row(SETTINGS_BY_FIELD["peer_wait_timeout_s"], environ, {})
    except JobDefinitionError as exc:
        sys.stderr.write(f"[entrypoint] {exc} Waiting the default {DEFAULTS.peer_wait_timeout_s:g} s.\n")
        return DEFAULTS.peer_wait_timeout_s


# --- reading ----------------------------------------------------------------------------------


def load_resource_config(paths: V3SshPaths) -> ResourceConfig:
    with open(paths.resource_config, encoding="utf-8") as f:
        return parse_resource_config(parse_json_document(f.read(), paths.resource_config))


def load_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return ""


# --- acting -----------------------------------------------------------------------------------


def write_identity(paths: V3SshPaths) -> None:
    """root's client key is this container's host key (a link: one private key per container)."""
    os.makedirs(paths.ssh_dir, mode=0o700, exist_ok=True)
    os.chmod(paths.ssh_dir, 0o700)  # sshd's StrictModes refuses a group/world-writable folder
    if os.path.realpath(paths.identity) != os.path.realpath(paths.host_key):
        if os.path.lexists(paths.identity):
            os.remove(paths.identity)
        os.symlink(paths.host_key, paths.identity)


def write_authorized_keys(paths: V3SshPaths, text: str) -> None:
    # Written whole and renamed: sshd never reads half a file.
    tmp = paths.authorized_keys + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, paths.authorized_keys)


def run_trust_exchange(
    paths: V3SshPaths,
    peers: Sequence[str],
    timeout_s: float,
    log: Callable[[str], None],
    port: int = SSH_PORT,
) -> list[str]:
    """Authorize each peer as soon as its sshd answers ssh-keyscan and its name resolves.
    Returns the peers never authorized (empty on success)."""
    trusted: dict[str, tuple[str, list[str]]] = {}
    pending = list(peers)
    deadline = time.monotonic() + timeout_s
    while pending:
        for host in list(pending):
            key = ssh.scan_host_key(host, port, timeout_s=DEFAULTS.v3_keyscan_timeout_s)
            addresses = net.resolve_addresses(host) if key else []
            if key and addresses:
                trusted[host] = (key, addresses)
                write_authorized_keys(paths, build_authorized_keys(load_text(paths.authorized_keys), trusted))
                pending.remove(host)
                log(f"{LOG_PREFIX} {host} may log in as root from {', '.join(addresses)} (its key {key[:32]}…)")
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(DEFAULTS.v3_ssh_poll_s)
    return pending


def main(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    paths = V3SshPaths()

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        resource = load_resource_config(paths)
    except (OSError, JobDefinitionError) as exc:
        log(f"{LOG_PREFIX} no SSH trust set up: {exc}")
        return 1
    peers = decide_trusted_peers(resource)
    if not peers:
        return 0
    write_identity(paths)
    timeout_s = parse_peer_wait_timeout(environ)
    missing = run_trust_exchange(paths, peers, timeout_s, log)
    if missing:
        log(
            f"{LOG_PREFIX} {', '.join(missing)} did not serve SSH within {timeout_s:g} s "
            f"(BYOC_PEER_WAIT_TIMEOUT_S): {'they' if len(missing) > 1 else 'it'} cannot log in here, "
            f"and v3's MPI driver will time out waiting"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The values a launch plan is made of that other rooms build and read (pure, and low: they
import nothing of entrypoint, so the plan, the health check and the rooms that act all take
them from here): the processes to start (ProcessSpec) and the job's runtime files
(RuntimeFiles, SshFiles: run/runtime_dirs.py makes the folders, hosts/ssh.py the SSH files).
"""

from __future__ import annotations

import os
from typing import NamedTuple


class ProcessSpec(NamedTuple):
    name: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()  # on top of the plan's env
    cwd: str | None = None  # None: the plan's cwd
    # A stop request (SIGTERM) goes to the ranks this process started on this host, not to
    # the process: mpirun, whose own SIGTERM handling gives ranks only Open MPI's kill timeout.
    signal_ranks: bool = False
    # Where mpirun's daemon writes each rank's output on this host (--output-filename), which
    # the entrypoint follows and prints (run/rank_output.py); "": the process's pipes carry it.
    rank_output: str = ""
    # Where the hold flag goes in argv to start the next attempt's copy ahead, held until that
    # attempt starts (run/held.py; rank/launch_torchrun.py --held); 0: never started ahead.
    hold_at: int = 0


# --- the job's runtime files -----------------------------------------------------------------

OWNER_FILE = "owner"
OUTCOME_FILE = "job-exit-code"  # a worker's: the job's exit code, written by the leader
LEADER_REPORT_FILE = "job-failure"  # a worker's: the leader's output/failure, when the job failed


class SshFiles(NamedTuple):
    """Per-job SSH files: configuration under the runtime folder, the private key in
    key_folder (memory-backed storage when there is one: see hosts/ssh.decide_key_folder)."""

    folder: str
    key_folder: str = ""  # "": the same as folder

    @property
    def host_key(self) -> str:
        return os.path.join(self.key_folder or self.folder, "host_ed25519_key")

    @property
    def host_env(self) -> str:
        return decide_host_env_file(self.folder, self.key_folder)

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


def decide_host_env_file(ssh_folder: str, key_folder: str) -> str:
    """Where a host keeps its environment for the ranks mpirun starts on it
    (roles/mpi.build_host_env). It may hold the job's credentials, so it lives in the same
    storage as the private key and goes with it; and its path must be the same on every host
    (the leader's mpirun tells each rank where to read it), so not inside the key's folder,
    whose name is random: beside it."""
    if not key_folder or key_folder == ssh_folder:
        return os.path.join(ssh_folder, "byoc-host-env.json")
    return os.path.join(os.path.dirname(key_folder), "byoc-host-env.json")


class RuntimeFiles(NamedTuple):
    """The job's runtime folders and every file the entrypoint keeps in them, in one place."""

    folder: str  # <BYOC_RUNTIME_DIR or /run/byoc>/job-<id>: nothing secret
    key_folder: str = ""  # the job's private SSH key (hosts/ssh.decide_key_folder); "": folder/ssh
    private_folder: str = ""  # the memory-backed job folder that holds key_folder; "": none
    key_note: str | None = None  # why the key has to be on disk, when it has to

    @property
    def folders(self) -> list[str]:
        """What start_job_folder makes and remove_job_folder removes."""
        return [f for f in (self.folder, self.private_folder) if f]

    @property
    def ssh(self) -> SshFiles:
        return SshFiles(os.path.join(self.folder, "ssh"), self.key_folder)

    @property
    def ssh_config(self) -> str:
        return self.ssh.client_config

    @property
    def host_env(self) -> str:
        """The host's environment for the ranks mpirun starts on it: the same path on every host."""
        return self.ssh.host_env

    @property
    def rank_output(self) -> str:
        """Where mpirun's daemon writes each rank's output on this host (run/rank_output.py)."""
        return os.path.join(self.folder, "rank-output")

    @property
    def owner(self) -> str:
        return os.path.join(self.folder, OWNER_FILE)

    @property
    def outcome(self) -> str:
        return os.path.join(self.folder, OUTCOME_FILE)

    @property
    def leader_failure(self) -> str:
        return os.path.join(self.folder, LEADER_REPORT_FILE)


def build_sha256_hex(data: bytes) -> str:
    """The hash behind the names every host of a job derives alike (the job's id, its private
    folder's name, the job key). SHA-256 without hashlib where CPython has its own built-in
    copy: hashlib loads OpenSSL's libcrypto first (~2 ms of every start-up here, on the launch path of every job)."""
    try:
        from _sha256 import sha256  # CPython 3.11 (the images' Python)
    except ImportError:
        try:
            from _sha2 import sha256  # CPython 3.12 and later
        except ImportError:
            from hashlib import sha256
    return sha256(data).hexdigest()

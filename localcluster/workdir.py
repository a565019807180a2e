"""Writing a cluster's folder on this machine: each host's /opt/ml tree, the shared folders,
and the per-host copies of SSH and environment files (the thin layer over optml.py)."""

from __future__ import annotations

import os
import shutil
import subprocess

from localcluster.optml import JobSpec, WorkdirLayout, build_host_directories

ETC_SSH = "/etc/ssh"
ETC_ENVIRONMENT = "/etc/environment"


def host_home(layout: WorkdirLayout, host: str, rootless: bool) -> str:
    # In a user namespace root's real home is unreadable: each host gets one of its own.
    return layout.private(host, "home") if rootless else "/root"


def write_workdir(
    layout: WorkdirLayout, job: JobSpec, host_names: tuple[str, ...], ssh_seed: str | None, rootless: bool
) -> None:
    """Folders and private files; the config files come from EmulatedCluster.write_opt_ml."""
    os.makedirs(layout.shared_model, exist_ok=True)
    os.makedirs(layout.logs, exist_ok=True)
    if job.code_dir is not None:
        os.makedirs(layout.shared_shared, exist_ok=True)
    for c in job.channels:
        if c.source is None:
            os.makedirs(layout.shared_channel(c.name), exist_ok=True)
    for host in host_names:
        for rel in build_host_directories(job):
            os.makedirs(os.path.join(layout.opt_ml(host), rel), exist_ok=True)
        write_private_files(layout, host, ssh_seed, rootless)


def write_private_files(layout: WorkdirLayout, host: str, ssh_seed: str | None, rootless: bool) -> None:
    if os.path.isdir(ETC_SSH):
        etc_ssh = layout.private(host, "etc-ssh")
        # The machine's client and server configuration, but host keys of the host's own:
        # never the machine's private keys, never one key shared by every host.
        shutil.copytree(ETC_SSH, etc_ssh, ignore=shutil.ignore_patterns("ssh_host_*"), dirs_exist_ok=True)
        host_key = os.path.join(etc_ssh, "ssh_host_ed25519_key")
        if shutil.which("ssh-keygen") and not os.path.exists(host_key):  # a reused --workdir has one
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{host}", "-f", host_key],
                check=True, capture_output=True, stdin=subprocess.DEVNULL,
            )  # fmt: skip
    root_ssh = layout.private(host, "root-ssh")
    os.makedirs(root_ssh, exist_ok=True)
    os.chmod(root_ssh, 0o700)
    if ssh_seed is not None:
        shutil.copytree(ssh_seed, root_ssh, dirs_exist_ok=True)
    if rootless:
        os.makedirs(host_home(layout, host, rootless), exist_ok=True)
    else:
        with open(layout.private(host, "root-bashrc"), "w") as f:
            f.write("# An emulated host's root: no shell start-up work, as in a container.\n")
    environment = layout.private(host, "environment")
    if os.path.isfile(ETC_ENVIRONMENT):
        shutil.copyfile(ETC_ENVIRONMENT, environment)
    else:
        open(environment, "w").close()

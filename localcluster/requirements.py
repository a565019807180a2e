"""What localcluster needs from the machine, checked before anything is built."""

from __future__ import annotations

import os
import shutil
import subprocess

from localcluster.errors import ClusterError

TOOLS = {
    "ip": "iproute2",
    "unshare": "util-linux",
    "nsenter": "util-linux",
}

ROOT_MESSAGE = (
    "localcluster needs root (uid 0 with CAP_SYS_ADMIN and CAP_NET_ADMIN): it creates network "
    "namespaces (`ip netns add` mounts them under /run/netns), a bridge and veth pairs, writes "
    "/etc/netns/<namespace>/hosts, and mounts /opt/ml, /run and others inside each host's "
    "mount namespace. Run it as root (e.g. `sudo .venv/bin/python -m localcluster run ...`). "
    "Without root, `python -m localcluster run` runs itself inside a user namespace "
    "(`unshare --user --map-root-user --net --mount`), which needs unprivileged user namespaces "
    "enabled (sysctl user.max_user_namespaces > 0, and kernel.unprivileged_userns_clone=1 where "
    "that sysctl exists); torchrun and gloo work there, sshd does not."
)


def build_requirement_problems(euid: int, missing_tools: list[str]) -> list[str]:
    problems = []
    if euid != 0:
        problems.append(ROOT_MESSAGE)
    for tool in missing_tools:
        problems.append(f"`{tool}` not found on PATH (Debian package {TOOLS[tool]})")
    return problems


def probe_requirements() -> None:
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    problems = build_requirement_problems(os.geteuid(), missing)
    if problems:
        raise ClusterError("\n".join(problems))


def probe_user_namespaces() -> str | None:
    """None when this user can make a user namespace mapped to root, else unshare's complaint."""
    if shutil.which("unshare") is None:
        return "`unshare` not found on PATH (Debian package util-linux)"
    done = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--net", "--mount", "true"], capture_output=True, text=True
    )
    if done.returncode != 0:
        return done.stderr.strip() or f"unshare exited with {done.returncode}"
    return None

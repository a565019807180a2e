"""Running without root: inside a user namespace that maps the caller to root.

`python -m localcluster run ...` started by an ordinary user re-executes itself as
    unshare --user --map-root-user --net --mount --propagation private -- python -m localcluster run ...
There it is uid 0 over a network namespace and a mount namespace of its own: the bridge,
veths and host namespaces live inside that private network namespace (so they vanish with
the process, whatever happens), /run becomes a private tmpfs (for /run/netns and the
registry), and /etc is shadowed so /etc/netns can be created without writing to the real /etc.

What does not work there: sshd (only one uid is mapped, and sshd's privilege separation
needs its own user), and anything that needs the real root's files (/root is unreadable).
torchrun, gloo and plain TCP between hosts work.
"""

from __future__ import annotations

import os

from localcluster import hostinit

MARKER = "LOCALCLUSTER_USERNS"  # set in the re-executed process's environment
FULL_UID_MAP = ["0", "0", "4294967295"]


def parse_uid_map_is_initial(text: str) -> bool:
    """True when /proc/self/uid_map is the initial namespace's identity map."""
    lines = [line.split() for line in text.strip().splitlines()]
    return lines == [FULL_UID_MAP]


def probe_in_user_namespace() -> bool:
    try:
        with open("/proc/self/uid_map") as f:
            return not parse_uid_map_is_initial(f.read())
    except OSError:
        return False


def build_reexec_argv(python: str, cli_args: list[str]) -> list[str]:
    return [
        "unshare", "--user", "--map-root-user", "--net", "--mount", "--propagation", "private",
        "--", python, "-m", "localcluster", *cli_args,
    ]  # fmt: skip


def prepare_user_namespace() -> None:
    """Make /run and /etc/netns writable in this process's private mount namespace."""
    if not probe_in_user_namespace():
        # Outside a user namespace these mounts would cover the real machine's /run and /etc.
        raise RuntimeError(f"{MARKER} is set but this process is not in a user namespace")
    hostinit.mount_tmpfs("/run", 0o755)
    if os.path.isdir("/etc/netns"):
        # Real root's clusters (running now, or an earlier one) made it: cover it, ours is private.
        hostinit.mount_tmpfs("/etc/netns", 0o755)
    else:
        hostinit.ensure_mount_point("/etc/netns", is_dir=True)

"""The "host init": PID 1 of one emulated host.

Started by the cluster as
    ip netns exec <ns> unshare --uts --mount --pid --fork --mount-proc python -I -S hostinit.py SPEC
so it already sits in the host's network namespace (with /etc/netns/<ns>/hosts over
/etc/hosts), a fresh UTS namespace, mount namespace and PID namespace. It then
  1. sets the hostname,
  2. mounts a private tmpfs on /run (sshd needs /run/sshd) and on /dev/shm,
  3. bind-mounts the host's /opt/ml tree and its private /etc/ssh, /root/.ssh and
     /etc/environment; where a mount point does not exist on this machine (say /opt/ml),
     it shadows the parent folder with a tmpfs that re-binds every original entry, so the
     real machine's /opt is never written to,
  4. prints "ready", then reaps orphans until its stdin closes (the cluster's lifeline:
     closed at teardown, or by the kernel when the controlling process dies).
When it exits, the kernel kills every process of the host: that is also the "host dies" fault.

Runs with -I -S, stdlib only: it must start fast and must not import the project.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import sys
import tempfile

MS_BIND = 0x1000
MS_REC = 0x4000
MNT_DETACH = 2

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]

# Folders this init created itself (tmpfs roots and what it made in them): entries can be
# added there without touching the real machine.
_owned: set[str] = set()


def _b(text: str | None) -> bytes | None:
    return None if text is None else os.fsencode(text)


def mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    if _libc.mount(_b(source), _b(target), _b(fstype), flags, _b(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target} ({fstype or 'bind'}): {os.strerror(err)}")


def umount_lazy(target: str) -> None:
    if _libc.umount2(_b(target), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"umount {target}: {os.strerror(err)}")


def mount_tmpfs(target: str, mode: int) -> None:
    mount("tmpfs", target, "tmpfs", 0, f"mode={mode:o}")
    _owned.add(target)


def shadow(folder: str) -> None:
    """Cover `folder` with a tmpfs holding the same entries (each bind-mounted from the
    original), so new entries can be made in it without writing to the real folder."""
    if folder == "/":
        raise OSError("refusing to shadow / to make a mount point")
    st = os.stat(folder)
    stage = tempfile.mkdtemp(prefix=".localcluster-shadow-", dir="/run")
    mount(folder, stage, None, MS_BIND | MS_REC)
    mount_tmpfs(folder, st.st_mode & 0o7777)
    try:
        os.chown(folder, st.st_uid, st.st_gid)
    except OSError:
        pass  # in a user namespace the owner may be unmapped; the mode is what matters
    for name in os.listdir(stage):
        original = os.path.join(stage, name)
        placeholder = os.path.join(folder, name)
        if os.path.islink(original):
            os.symlink(os.readlink(original), placeholder)
            continue
        if os.path.isdir(original):
            os.mkdir(placeholder)
        else:
            open(placeholder, "w").close()
        mount(original, placeholder, None, MS_BIND | MS_REC)
    umount_lazy(stage)
    os.rmdir(stage)


def ensure_mount_point(target: str, is_dir: bool) -> None:
    if os.path.lexists(target):
        return
    parent = os.path.dirname(target)
    if not os.path.isdir(parent):
        ensure_mount_point(parent, True)
    if parent not in _owned:
        shadow(parent)
    if is_dir:
        os.mkdir(target, 0o755)
        _owned.add(target)
    else:
        open(target, "w").close()


def set_up(spec: dict) -> None:
    socket.sethostname(spec["hostname"])
    mount_tmpfs("/run", 0o755)
    os.mkdir("/run/sshd", 0o755)  # sshd's privilege-separation folder
    _owned.add("/run/sshd")
    if os.path.isdir("/dev/shm"):
        mount_tmpfs("/dev/shm", 0o1777)
    for m in spec["mounts"]:
        ensure_mount_point(m["target"], m["is_dir"])
        mount(m["source"], m["target"], None, MS_BIND | MS_REC)


def reap(_signum: int, _frame: object) -> None:
    # PID 1 adopts every orphan of the host (daemonised sshd, ...): collect them.
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main() -> int:
    spec = json.loads(sys.argv[1])
    try:
        set_up(spec)
    except OSError as e:
        print(f"error: {e}", flush=True)
        return 1
    signal.signal(signal.SIGCHLD, reap)
    print("ready", flush=True)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    # Block until the lifeline (stdin) closes; anything written to it is ignored.
    while os.read(0, 4096):
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())

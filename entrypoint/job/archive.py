"""Extract a source archive (`sourcedir.tar.gz`) safely, on every Python the images ship.

`tarfile`'s extraction filters (`filter="data"`) exist only from Python 3.11.4 / 3.12; the
CPU image runs Debian's 3.11.2, where `extractall(filter=...)` is a TypeError. So the rules
are ours, checked for every member before anything is written:

- regular files, folders, and links whose target stays inside the destination;
- no absolute names, no `..` component, no member below a link (a link must not redirect
  a later member out of the destination);
- no devices, FIFOs or other special files;
- modes as the `data` filter leaves them: no setuid/setgid/sticky bits, no group/other
  write, owner read/write kept; ownership is not restored (we run as root).

`decide_unsafe_member` is pure (a member and what came before it → a reason or None);
`extract_tar` reads and writes.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
import tarfile


class UnsafeArchiveError(Exception):
    """The archive holds a member that would land outside the destination or is special."""


class NoRoomError(OSError):
    """The destination's disk cannot hold what the archive expands to: a full disk, not a bad
    job definition. Its text names the archive, the folder, what it needs and what was free."""


def describe_no_room(archive: str, dest: str, needed: int, free: int, total: int, why: str) -> str:
    return (f"no room to unpack sagemaker_submit_directory {archive} into {dest}: it holds {needed:,} bytes, "
            f"and that disk had {free:,} bytes free (of {total:,}) ({why}). Free space there, or keep "
            f"data out of the source directory (pass it as an input channel)")


def _parts(name: str) -> list[str]:
    return [p for p in name.split("/") if p not in ("", ".")]


def decide_unsafe_member(member: tarfile.TarInfo, link_names: frozenset[str]) -> str | None:
    """Why `member` must not be extracted, or None. `link_names` are the normalised names
    of the links seen before it in the archive."""
    name = member.name
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        return "an absolute path"
    parts = _parts(name)
    if ".." in parts:
        return "a '..' component"
    if not parts and not member.isdir():
        return "no name (it would replace the destination itself)"
    for depth in range(1, len(parts)):
        if "/".join(parts[:depth]) in link_names:
            return f"a path through the link {'/'.join(parts[:depth])}"
    if member.isfile() or member.isdir():
        return None
    if member.issym() or member.islnk():
        target = member.linkname
        if target.startswith("/"):
            return f"a link to the absolute path {target}"
        # A symlink's target is relative to its folder; a hard link's to the archive root.
        base = posixpath.dirname("/".join(parts)) if member.issym() else ""
        resolved = posixpath.normpath(posixpath.join(base, target))
        if resolved == ".." or resolved.startswith("../"):
            return f"a link out of the archive ({target})"
        return None
    return "a special file (device, FIFO or other)"


def _safe_mode(member: tarfile.TarInfo) -> int:
    mode = member.mode & 0o777 & ~0o022  # no setuid/setgid/sticky, no group/other write
    return mode | (0o700 if member.isdir() else 0o600)


def _nearest_existing(path: str) -> str:
    """path, or the closest folder above it that exists: the disk it will be made on."""
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def extract_tar(archive: str, dest: str) -> None:
    """Extract `archive` into `dest` after checking every member; nothing is written when
    any member is unsafe (UnsafeArchiveError names it)."""
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
        links: set[str] = set()
        for member in members:
            reason = decide_unsafe_member(member, frozenset(links))
            if reason:
                raise UnsafeArchiveError(f"{archive}: member {member.name!r} is refused: {reason}")
            if member.issym() or member.islnk():
                links.add("/".join(_parts(member.name)))
        for member in members:
            if not (member.issym() or member.islnk()):
                member.mode = _safe_mode(member)
            member.uid = member.gid = 0
            member.uname = member.gname = "root"
        # Where tarfile has its own `data` filter (3.11.4+), it checks the same again.
        extra = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        # The room is measured before anything is written: once the disk is full, it reads 0.
        needed = sum(m.size for m in members if m.isfile())
        disk = os.statvfs(_nearest_existing(dest))  # tarfile makes dest when it is not there yet
        free, total = disk.f_bavail * disk.f_frsize, disk.f_blocks * disk.f_frsize
        if needed > free:
            raise NoRoomError(errno.ENOSPC, describe_no_room(archive, dest, needed, free, total, f"{os.strerror(errno.ENOSPC)}, found before unpacking"))
        try:
            tar.extractall(dest, members=members, numeric_owner=True, **extra)
        except OSError as exc:  # the files' own blocks and folders can still tip it over
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise NoRoomError(exc.errno, describe_no_room(archive, dest, needed, free, total, os.strerror(exc.errno))) from None
    # Folders come out with the archive's modes; make sure we can still read what we made.
    os.chmod(dest, os.stat(dest).st_mode | stat.S_IRWXU)

"""torch.compile's caches on this host (decide/compile_cache.py decides where): restored from
the checkpoint folder's archives before the ranks start, bounded, written back as this host's
one archive at the end, on a stop and every so often. Nothing here may fail a job: every
problem is a log line, and the ranks then compile what they need (a cold start).

Safety, in order of what can go wrong:
  - Another torch (or Triton, CUDA, Python, machine): each archive starts with a stamp of what
    made it (probe_stamp); an archive whose stamp differs is not unpacked. torch also keys every
    entry by its own source hash and the device (docs/compile-cache.md), so this is a second line.
  - A corrupt or truncated archive: it is unpacked into a staging folder and moved into place
    only once the whole gzip stream (its CRC included) read cleanly; else nothing of it is used.
  - A stop while an archive is read (SIGTERM during start-up: the host loop's stopped, which
    CacheKeeper.stop_asked is): looked at after every STOP_CHECK_BYTES of the stream
    (StopAwareStream), so it ends the restore within a megabyte read, however large the member,
    and nothing of that archive is used (the staging is removed). No handler raises into the
    read any more (run/stop.py): a restore that did not look would read on to the end.
  - Ranks writing at once: torch writes each entry whole (a temporary file, then a rename) and
    holds locks/<key>.lock while it builds a kernel; an archive leaves out temporary files and
    any kernel whose lock is held. Each host writes only its own archive, whole, then renames it.
  - Links: the cache folder is left as the last attempt left it, and the checkpoint folder is
    the script's too, so a link may stand anywhere in them. Nothing is written, moved or removed
    through one: every folder below the cache folder (and the cache folder itself, and the
    archives' folder) is opened with O_NOFOLLOW and every write is relative to its folder's
    descriptor (open_folders); an entry whose way is a link or a file is not restored, and a
    link at an entry's name is left as it is. (The folders above the cache folder are the
    user's path, BYOC_COMPILE_CACHE_DIR, and followed.)
  - An unusable folder (a link, a file, read-only, not makeable): the ranks get a private
    folder instead (write_ready_folder, CacheKeeper.use_private_folder), never a path torch
    cannot write; a folder that fills up during a restore is said to be full, not the archive
    corrupt.
"""

from __future__ import annotations

import errno
import json
import os
import queue
import re
import stat
import threading
import time
from typing import NamedTuple

from entrypoint.decide.compile_cache import CompileCache
from entrypoint.log import log

STAMP_NAME = "byoc-compile-cache.json"  # the archive's first member
STAGING_PREFIX = ".byoc-restore-"
PROBE_PREFIX = ".byoc-probe-"  # the write check's empty file, removed at once
PRIVATE_PREFIX = "byoc-compile-cache-"  # an unusable folder's stand-in, in the temporary folder
FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC  # a folder, never through a link
NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
ARCHIVE_NAME = re.compile(r"host-\d+\.tar\.gz\Z")
LOCKS = "locks" + os.sep  # torch's lock files: never archived
STOP_CHECK_BYTES = 1 << 20  # an archive's stream read between two looks at the stop
_VERSION = re.compile(r"""^(__version__|version|cuda|hip|git_version)\s*(?::\s*\w+\s*)?=\s*['"]([^'"]*)['"]""", re.M)


def probe_stamp() -> dict[str, str]:
    """What the cache's entries depend on, read without importing torch (seconds of start-up):
    torch's version.py, Triton's __init__.py, this Python and machine."""
    import importlib.util
    import platform
    import sys

    stamp = {"python": sys.implementation.cache_tag or "", "machine": platform.machine()}
    for package, file in (("torch", "version.py"), ("triton", "__init__.py")):
        spec = importlib.util.find_spec(package)
        folders = list(spec.submodule_search_locations or []) if spec else []
        try:
            with open(os.path.join(folders[0], file), encoding="utf-8") as f:
                text = f.read(65536)
        except (IndexError, OSError, UnicodeDecodeError):
            continue
        for key, value in _VERSION.findall(text):
            stamp[f"{package}.{key}"] = value
    return stamp


def describe_mb(size: int) -> str:
    return f"{size / (1 << 20):.1f} MB"


class FolderUnwritable(Exception):
    """The cache folder did not take a write (full, read-only): the folder's problem, not the
    archive's."""


IN_THE_WAY = (errno.ENOTDIR, errno.ELOOP)  # O_DIRECTORY | O_NOFOLLOW on a link or a file


def describe_os_error(exc: OSError) -> str:
    if exc.errno in IN_THE_WAY:
        return "a symbolic link or a file in the way"
    return exc.strerror or str(exc) or type(exc).__name__


def open_folders(top: int, parts, make: bool = False) -> int:
    """The folder top/parts[0]/parts[1]/…, each part opened without following a link
    (O_NOFOLLOW) and made first when missing if make: a descriptor the caller closes. Raises
    OSError: ENOTDIR (IN_THE_WAY) when a part is a link or a file."""
    fd = os.dup(top)
    try:
        for part in parts:
            if make:
                try:
                    os.mkdir(part, dir_fd=fd)
                except FileExistsError:  # a folder, or a link or a file (then the open refuses it)
                    pass
            inner = os.open(part, FOLDER, dir_fd=fd)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def remove_any(parent: int, name: str) -> None:
    """Whatever is at parent/name: a link itself (never what it points to), a file, or a
    folder's whole tree (shutil.rmtree with a descriptor never follows a link inside it)."""
    try:
        info = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        import shutil  # only here: it imports bz2 and lzma (tests/entrypoint/test_startup_imports.py)

        shutil.rmtree(name, dir_fd=parent)
    else:
        os.unlink(name, dir_fd=parent)


def write_ready_folder(folder: str) -> str | None:
    """Make the cache folder when it is missing, and check that torch can write in it (an empty
    file made and removed): None, or why it cannot be used. A link is refused: torch would
    write wherever it leads."""
    try:
        info = os.lstat(folder)
    except FileNotFoundError:
        info = None
    except OSError as exc:
        return f"cannot be used ({describe_os_error(exc)})"
    if info is not None and stat.S_ISLNK(info.st_mode):
        return "is a symbolic link"
    if info is not None and not stat.S_ISDIR(info.st_mode):
        return "is not a folder"
    probe = f"{PROBE_PREFIX}{os.uname().nodename}-{os.getpid()}"
    try:
        if info is None:
            os.makedirs(folder)
        root = os.open(folder, FOLDER)
        try:
            remove_any(root, probe)  # left by an entrypoint that was killed
            os.close(os.open(probe, NEW_FILE, 0o600, dir_fd=root))
            os.unlink(probe, dir_fd=root)
        finally:
            os.close(root)
    except OSError as exc:
        return f"cannot be {'made' if info is None else 'written'} ({describe_os_error(exc)})"
    return None


def load_entries(folder: str) -> list[tuple[str, int, float]]:
    """(path relative to folder, bytes, last use) of every cache file; what torch is still
    writing (dot files, *.tmp) and our staging folders are not entries. os.fwalk never goes
    through a link (nor into a folder that is one)."""
    found = []
    for root, dirs, files, root_fd in os.fwalk(folder):
        dirs[:] = [d for d in dirs if not d.startswith((".", "tmp.pid_"))]  # Triton's, while it writes
        for name in files:
            if name.startswith(".") or name.endswith(".tmp"):
                continue
            try:
                info = os.stat(name, dir_fd=root_fd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                found.append((os.path.relpath(os.path.join(root, name), folder), info.st_size,
                              max(info.st_atime, info.st_mtime)))
    return found


def decide_kept(entries: list[tuple[str, int, float]], max_bytes: int) -> tuple[list, list]:
    """(kept, evicted): the most recently used entries while they fit in max_bytes (pure)."""
    kept, evicted, total = [], [], 0
    for entry in sorted(entries, key=lambda e: (-e[2], e[0])):
        if total + entry[1] <= max_bytes:
            kept.append(entry)
            total += entry[1]
        else:
            evicted.append(entry)
    return kept, evicted


def run_eviction(folder: str, entries: list[tuple[str, int, float]], max_bytes: int) -> tuple[list, list]:
    """Remove the oldest of the folder's entries (as load_entries read them) until the rest fit
    max_bytes: (kept, evicted), so the caller need not walk the folder again. Each is removed
    in its own folder, reached without following a link."""
    kept, evicted = decide_kept(entries, max_bytes)
    if not evicted:
        return kept, evicted
    try:
        root = os.open(folder, FOLDER)
    except OSError:
        return kept, evicted
    try:
        for name, _, _ in evicted:
            *parents, last = name.split(os.sep)
            try:
                parent = open_folders(root, parents)
            except OSError:
                continue
            try:
                os.unlink(last, dir_fd=parent)
            except OSError:
                pass
            finally:
                os.close(parent)
    finally:
        os.close(root)
    return kept, evicted


def probe_empty(folder: str) -> bool:
    """Whether the folder is missing or empty (a new instance's), without walking it."""
    try:
        with os.scandir(folder) as found:
            return next(found, None) is None
    except FileNotFoundError:
        return True


def _safe_member_path(name: str) -> str | None:
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or name.startswith("/") or ".." in parts or any(p.startswith(".") for p in parts):
        return None
    return os.path.join(*parts)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_member(staging: int, path: str, source, mtime: float) -> bool:
    """One member into the staging folder (this restore's own): False when another member is in
    its way (an archive that names a file twice, or as a folder too). A write that fails is the
    folder's (FolderUnwritable); a read that fails is the archive's (raised as it is)."""
    *parents, last = path.split(os.sep)
    try:
        folder = open_folders(staging, parents, make=True)
        try:
            out = os.open(last, NEW_FILE, 0o644, dir_fd=folder)
        finally:
            os.close(folder)
    except OSError as exc:
        if exc.errno in IN_THE_WAY + (errno.EEXIST, errno.EISDIR):
            return False
        raise FolderUnwritable(describe_os_error(exc)) from exc
    try:
        while chunk := source.read(1 << 20):
            try:
                write_all(out, chunk)
            except OSError as exc:
                raise FolderUnwritable(describe_os_error(exc)) from exc
        try:
            os.utime(out, (mtime, mtime))
        except (OSError, OverflowError, ValueError):
            pass  # an age out of range: the entry is as new as now
    finally:
        os.close(out)
    return True


class RestoreStopped(Exception):
    """A stop came while an archive was read (StopAwareStream): nothing of it is used."""

    def __init__(self, read_bytes: int):
        super().__init__(f"stopped after {describe_mb(read_bytes)} read")
        self.read_bytes = read_bytes


class StopAwareStream:
    """An archive's uncompressed stream as tarfile reads it: every byte goes through read(), its
    headers, the members unpacked and the members skipped alike (tarfile skips one by reading
    it through, in 10 kB reads). Each time another STOP_CHECK_BYTES was read it looks at
    stop_asked, and raises RestoreStopped once a stop came; read_bytes is how far it got."""

    def __init__(self, raw, stop_asked) -> None:
        self.raw, self.stop_asked = raw, stop_asked
        self.read_bytes, self.next_look = 0, STOP_CHECK_BYTES

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.read_bytes += len(data)
        if self.read_bytes >= self.next_look:
            self.next_look = self.read_bytes + STOP_CHECK_BYTES
            if self.stop_asked():
                raise RestoreStopped(self.read_bytes)
        return data


def _unpack(archive: str, staging: int, stamp: dict, max_bytes: int, stop_asked) -> tuple[list, bool, str | None]:
    """Unpack one archive into the staging folder (a descriptor): (the entries unpacked, whether
    that was every member, why it is not used or None). Raises on a corrupt or truncated archive
    (the caller discards staging), FolderUnwritable when the folder takes no more,
    RestoreStopped when a stop came before the stream's end (StopAwareStream)."""
    import gzip
    import tarfile

    unpacked: list[tuple[str, int, float]] = []
    size, whole, stamped = 0, True, False
    with gzip.open(archive, "rb") as gz:
        raw = StopAwareStream(gz, stop_asked)
        with tarfile.open(fileobj=raw, mode="r|") as tar:
            for member in tar:
                if not stamped:
                    if member.name != STAMP_NAME:
                        return [], False, "it has no stamp of what made it"
                    found = json.loads(tar.extractfile(member).read(65536).decode("utf-8"))
                    if found != stamp:
                        return [], False, f"made by {describe_stamp_difference(found, stamp)}"
                    stamped = True
                    continue
                path = _safe_member_path(member.name)
                if path is None or not member.isreg() or size + member.size > max_bytes or \
                        not write_member(staging, path, tar.extractfile(member), member.mtime):
                    whole = False
                    continue
                unpacked.append((path, member.size, float(member.mtime)))
                size += member.size
        while raw.read(1 << 20):  # to the end: gzip checks the whole stream's CRC there
            pass
    return unpacked, whole, None


def describe_stamp_difference(found, stamp: dict) -> str:
    if not isinstance(found, dict):
        return "an unknown stamp"
    keys = sorted(k for k in set(found) | set(stamp) if found.get(k) != stamp.get(k))
    return ", ".join(f"{k} {found.get(k)!r} (this job: {stamp.get(k)!r})" for k in keys[:4])


def _move_entry(staging: int, root: int, name: str) -> bool | None:
    """One unpacked entry from staging to its place in the folder, its folders reached (and made)
    without following a link: True when moved, False when the name is taken (a name is its
    content's key: what is there is the same entry, which a rank may be reading; a link there
    is left as it is), None when a link or a file stands in its way."""
    *parents, last = name.split(os.sep)
    try:
        target = open_folders(root, parents, make=True)
    except OSError as exc:
        if exc.errno in IN_THE_WAY:
            return None
        raise FolderUnwritable(describe_os_error(exc)) from exc
    try:
        source = open_folders(staging, parents)
        try:
            try:
                os.stat(last, dir_fd=target, follow_symlinks=False)
                return False
            except FileNotFoundError:
                pass
            os.replace(last, last, src_dir_fd=source, dst_dir_fd=target)
            return True
        finally:
            os.close(source)
    except OSError as exc:
        raise FolderUnwritable(describe_os_error(exc)) from exc
    finally:
        os.close(target)


def _move_into_place(staging: int, root: int, unpacked: list) -> tuple[list, int]:
    """(the unpacked entries moved into the folder, how many a link or a file kept out)."""
    moved, blocked = [], 0
    for entry in unpacked:
        done = _move_entry(staging, root, entry[0])
        if done is None:
            blocked += 1
        elif done:
            moved.append(entry)
    return moved, blocked


def list_archives(cache: CompileCache) -> list[str]:
    """This host's archive first, then the other hosts' (whose entries this host may use too)."""
    try:
        names = sorted(n for n in os.listdir(cache.archive_folder) if ARCHIVE_NAME.match(n))
    except OSError:
        return []
    own = os.path.basename(cache.archive)
    return [os.path.join(cache.archive_folder, n) for n in sorted(names, key=lambda n: n != own)]


class Restored(NamedTuple):
    """One archive's restore: the log line, the entries it held (whole: all of its members),
    those of them now in the folder that were not there before, whether the folder took no
    more (full, read-only: the next archives would not fit either), and whether a stop ended it
    (nothing of it used; the next archives are not read)."""

    line: str
    entries: list | tuple = ()
    whole: bool = False
    moved: list | tuple = ()
    unwritable: bool = False
    stopped: bool = False


def restore_archive(archive: str, cache: CompileCache, stamp: dict, stop_asked=lambda: False) -> Restored:
    """Unpack one archive into the cache folder (opened without following a link): staged, and
    moved into place only once the whole stream read cleanly with no stop (stop_asked) on the
    way; else the folder is left as it was and the staging removed."""
    try:
        info = os.stat(archive)
    except OSError as exc:
        return Restored(f"torch.compile cache: {archive} not read ({exc}): not used")
    if not stat.S_ISREG(info.st_mode):  # a FIFO would block the start
        return Restored(f"torch.compile cache: {archive} is not a regular file: not used")
    # Named by host and process: in containers every entrypoint is PID 1, and a folder the user
    # points several hosts at (BYOC_COMPILE_CACHE_DIR on a shared file system) is shared.
    staging = f"{STAGING_PREFIX}{os.uname().nodename}-{os.getpid()}"
    try:
        root = os.open(cache.folder, FOLDER)
    except OSError as exc:
        return Restored(f"torch.compile cache: {archive} not unpacked: {cache.folder}: {describe_os_error(exc)}; the "
                        f"ranks compile what they need", unwritable=True)
    try:
        return _restore_into(archive, cache, stamp, root, staging, stop_asked)
    finally:
        try:
            remove_any(root, staging)
        except OSError:
            pass
        os.close(root)


def _restore_into(archive: str, cache: CompileCache, stamp: dict, root: int, staging: str, stop_asked) -> Restored:
    try:
        try:
            remove_any(root, staging)  # left by an entrypoint that was killed (a link: only the link)
            os.mkdir(staging, 0o700, dir_fd=root)
            folder = os.open(staging, FOLDER, dir_fd=root)
        except OSError as exc:
            raise FolderUnwritable(describe_os_error(exc)) from exc
        try:
            unpacked, whole, why = _unpack(archive, folder, stamp, cache.max_bytes, stop_asked)
            moved, blocked = _move_into_place(folder, root, unpacked) if why is None else ([], 0)
        finally:
            os.close(folder)
    except RestoreStopped as exc:
        return Restored(f"torch.compile cache: {archive} not restored: the job was stopped after "
                        f"{describe_mb(exc.read_bytes)} of it was read; nothing of it is used", stopped=True)
    except FolderUnwritable as exc:
        return Restored(f"torch.compile cache: {archive} not unpacked: {cache.folder} could not be written ({exc}); "
                        f"nothing of it is used, the ranks compile what they need", unwritable=True)
    except Exception as exc:  # noqa: BLE001 - a bad archive is a cold start, never a failed job
        why = f"unreadable ({type(exc).__name__}: {exc}), corrupt or truncated"
    if why is not None:
        return Restored(f"torch.compile cache: {archive} not used: {why}; the ranks compile what they need (a cold "
                        f"start)")
    line = f"torch.compile cache: restored {len(unpacked)} file(s), {describe_mb(sum(e[1] for e in unpacked))}, " \
        f"from {archive}"
    if blocked:
        line += f"; {blocked} of them not put in place: a symbolic link or a file in the way (never written through)"
    return Restored(line, unpacked, whole and not blocked, moved)


def build_signature(entries: list[tuple[str, int, float]]) -> frozenset:
    """What an archive of these entries would hold (torch's lock files are never in one)."""
    return frozenset((name, size) for name, size, _ in entries if not name.startswith(LOCKS))


def probe_kernel_locked(root: int, name: str) -> bool:
    """Whether torch holds the lock of the kernel this file belongs to (it is being built)."""
    import fcntl

    key = os.path.basename(name).split(".", 1)[0]
    try:
        locks = open_folders(root, ["locks"])
    except OSError:
        return False
    try:
        fd = os.open(f"{key}.lock", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=locks)
    except OSError:
        return False
    finally:
        os.close(locks)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def add_entry(tar, root: int, name: str) -> bool:
    """One entry into the archive, read without following a link on its way: False when it is
    gone (evicted or replaced meanwhile) or not a regular file."""
    *parents, last = name.split(os.sep)
    try:
        folder = open_folders(root, parents)
        try:
            fd = os.open(last, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
        finally:
            os.close(folder)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as f:
        info = tar.gettarinfo(arcname=name.replace(os.sep, "/"), fileobj=f)
        if not info.isreg():
            return False
        tar.addfile(info, f)
    return True


def write_archive(cache: CompileCache, stamp: dict, entries: list[tuple[str, int, float]]) -> tuple[list, int]:
    """This host's archive of the entries that fit the bound, written whole and renamed into
    place (SageMaker's upload and other hosts never see half of one): (entries written, archive
    bytes). The archives' folder is opened without following a link, and the archive is written
    under a new name in it (never through whatever stood there)."""
    kept, _ = decide_kept([e for e in entries if not e[0].startswith(LOCKS)], cache.max_bytes)
    os.makedirs(cache.archive_folder, exist_ok=True)
    try:
        folder = os.open(cache.archive_folder, FOLDER)
    except OSError as exc:
        raise OSError(exc.errno, f"{cache.archive_folder}: {describe_os_error(exc)}") from exc
    try:
        root = os.open(cache.folder, FOLDER)
        try:
            return _write_archive_in(folder, root, os.path.basename(cache.archive), stamp, kept)
        finally:
            os.close(root)
    finally:
        os.close(folder)


def _write_archive_in(folder: int, root: int, name: str, stamp: dict, kept: list) -> tuple[list, int]:
    import io
    import tarfile

    tmp = f".{name}.{os.getpid()}.tmp"
    stamp_bytes = json.dumps(stamp, sort_keys=True).encode("utf-8")
    written = []
    remove_any(folder, tmp)  # left by a writer that was killed, or a link put there
    try:
        with os.fdopen(os.open(tmp, NEW_FILE, 0o644, dir_fd=folder), "wb") as raw:
            with tarfile.open(fileobj=raw, mode="w:gz", compresslevel=1) as tar:
                info = tarfile.TarInfo(STAMP_NAME)
                info.size, info.mtime = len(stamp_bytes), time.time()
                tar.addfile(info, io.BytesIO(stamp_bytes))
                for entry in kept:
                    if not probe_kernel_locked(root, entry[0]) and add_entry(tar, root, entry[0]):
                        written.append(entry)
        os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
    finally:
        try:
            os.unlink(tmp, dir_fd=folder)
        except FileNotFoundError:
            pass
    return written, os.stat(name, dir_fd=folder, follow_symlinks=False).st_size


def describe_graphs(before: list, after: list) -> str:
    """What the job's graphs did, read off the folder: a graph torch compiled adds an FX graph
    entry (a miss); one it found adds none (a hit)."""
    graphs = "fxgraph" + os.sep
    had = {e[0] for e in before if e[0].startswith(graphs)}
    new = [e for e in after if e[0].startswith(graphs) and e[0] not in had]
    return f"{len(had)} FX graph entr{'y' if len(had) == 1 else 'ies'} at the start, {len(new)} compiled by this job"


class CacheKeeper:
    """This host's torch.compile cache for the length of the job: start() before the ranks,
    end() after them. With an archive, a thread writes it when the run asks: every
    cache.save_every_s (the run's loop keeps that deadline: due_at, save_when_due) and as soon
    as the run begins to stop (note_stop), while the ranks use their grace period. The thread
    only writes what it is asked to, in order (no timer of its own); one lock makes its writes
    and end()'s one at a time."""

    def __init__(self, cache: CompileCache):
        self.cache = cache
        # True once a stop came (the host loop's stopped, set by orchestrate.start_compile_cache):
        # looked at between two archives (a host's restore reads every host's, 256 at 256 hosts)
        # and within one, every STOP_CHECK_BYTES read (StopAwareStream).
        self.stop_asked = lambda: False
        self.todo: queue.SimpleQueue = queue.SimpleQueue()  # the writes asked for (why); None: no more
        self.stop_noted = False  # a stop's write was asked for (once a job)
        self.last_asked = time.monotonic()  # when the last periodic write was asked for (or the start)
        self.stamp: dict = {}
        self.lines: list[str] = []  # for the job report
        self.at_start: list = []
        self.saved: frozenset | None = None  # what the last archive held
        self.lock = threading.Lock()  # owns saved and the archive file
        self.thread: threading.Thread | None = None
        self.folder: str | None = cache.folder  # what the ranks get (use_private_folder); None: torch's default
        self.private: str | None = None  # the private folder made for this job, removed by close()

    def say(self, line: str) -> None:
        log(line)
        self.lines.append(line)

    def start(self) -> None:
        """Restore, bound, and note what the folder holds. The folder is walked at most once: on
        a new instance it was empty, and what the archives held is what it holds. A folder torch
        could not write is replaced by a private one first (self.folder says which the ranks get)."""
        why = write_ready_folder(self.cache.folder)
        if why is not None and not self.use_private_folder(why):
            return
        cache = self.cache
        try:
            was_empty = probe_empty(cache.folder)
            restored = self.restore_archives() if cache.archive is not None else []
            if self.stop_asked():  # the job ends before the ranks start: no walk, no bound, no thread
                return
            entries = restored if was_empty else load_entries(cache.folder)
            self.at_start = self.bound(entries)
        except Exception as exc:  # noqa: BLE001 - never a failed job
            self.say(f"torch.compile cache: not prepared ({type(exc).__name__}: {exc}); the ranks compile what they "
                     f"need in {cache.folder}")
            return
        size = sum(e[1] for e in self.at_start)
        self.say(f"torch.compile cache: {cache.folder} holds {len(self.at_start)} file(s), {describe_mb(size)}, "
                 f"before the ranks start")
        if cache.archive is not None:
            self.last_asked = time.monotonic()
            self.thread = threading.Thread(target=self._keep, name="compile-cache", daemon=True)
            self.thread.start()

    def use_private_folder(self, why: str) -> bool:
        """The folder cannot be used (a link, a file, read-only, not makeable): a new private
        folder in the temporary folder instead, for this job only (removed by close()), which the
        archives are restored into and written from. False when none can be made either: then the
        ranks get no TORCHINDUCTOR_CACHE_DIR at all (torch's own default) and nothing is kept."""
        import tempfile

        wanted = self.cache.folder
        try:
            private = tempfile.mkdtemp(prefix=PRIVATE_PREFIX)
        except OSError as exc:
            self.folder = None
            self.say(f"torch.compile cache: {wanted} {why}, and no private folder could be made "
                     f"({describe_os_error(exc)}): the ranks get torch's own default folder, nothing is kept")
            return False
        self.folder = self.private = private
        self.cache = self.cache._replace(folder=private)
        kept = "; the archives are restored into it and written from it" if self.cache.archive is not None else ""
        self.say(f"torch.compile cache: {wanted} {why}: the ranks use a private folder instead, {private}, removed at "
                 f"the end{kept}")
        return True

    def restore_archives(self) -> list:
        """Every host's archive, this host's first, until a stop (looked at between two archives
        and within one): the entries moved into the folder. An archive of this host's that came
        back whole is what the folder holds: no need to write it again unless the job adds to it
        (saved)."""
        self.stamp = probe_stamp()
        archives = list_archives(self.cache)
        if not archives:
            self.say(f"torch.compile cache: no archive in {self.cache.archive_folder} yet (a cold start)")
        moved = []
        for i, archive in enumerate(archives):
            if self.stop_asked():  # a stop during start-up: the job ends, nothing is left to restore for
                self.say(f"torch.compile cache: {len(archives) - i} archive(s) not restored: the job was stopped")
                break
            restored = restore_archive(archive, self.cache, self.stamp, self.stop_asked)
            self.say(restored.line)
            if restored.stopped:
                if archives[i + 1:]:
                    self.say(f"torch.compile cache: {len(archives) - i - 1} more archive(s) not restored: the job "
                             f"was stopped")
                break
            moved.extend(restored.moved)
            if archive == self.cache.archive and restored.whole:
                with self.lock:
                    self.saved = build_signature(restored.entries)
            if restored.unwritable and archives[i + 1:]:
                self.say(f"torch.compile cache: the other {len(archives) - i - 1} archive(s) not tried: the folder "
                         f"takes no more")
                break
        return moved

    def bound(self, entries: list) -> list:
        """The folder's entries within the bound (the rest are evicted); an eviction changes
        what an archive would hold."""
        kept, evicted = run_eviction(self.cache.folder, entries, self.cache.max_bytes)
        if evicted:
            with self.lock:  # the thread may still be writing (its join is bounded)
                self.saved = None
            self.say(f"torch.compile cache: {len(evicted)} oldest file(s), {describe_mb(sum(e[1] for e in evicted))}, "
                     f"evicted (bound {describe_mb(self.cache.max_bytes)}, BYOC_COMPILE_CACHE_MAX_MB)")
        return kept

    def save(self, why: str, entries: list | None = None) -> None:
        """This host's archive, unless it holds what the folder holds already (SageMaker would
        upload the same archive again)."""
        with self.lock:
            entries = load_entries(self.cache.folder) if entries is None else entries
            if build_signature(entries) == self.saved:
                if why == "the end":
                    self.say(f"torch.compile cache: {self.cache.archive} holds the folder's entries already: "
                             f"not written again")
                return
            started = time.monotonic()
            written, size = write_archive(self.cache, self.stamp, entries)
            self.saved = build_signature(written)
            self.say(f"torch.compile cache: {self.cache.archive} written ({why}): {len(written)} file(s), "
                     f"{describe_mb(size)}, in {time.monotonic() - started:.1f} s")

    def _keep(self) -> None:
        while (why := self.todo.get()) is not None:
            try:
                self.save(why)
            except Exception as exc:  # noqa: BLE001 - the next save tries again
                log(f"torch.compile cache: not written ({type(exc).__name__}: {exc})")

    def due_at(self) -> float | None:
        """When the next periodic write is due (time.monotonic()); None: none is (no archive, or
        BYOC_COMPILE_CACHE_SAVE_EVERY_S=0)."""
        every = self.cache.save_every_s
        return self.last_asked + every if every and self.thread is not None else None

    def save_when_due(self) -> None:
        """The run's loop, at each look: the periodic write, once it is due."""
        due = self.due_at()
        if due is not None and time.monotonic() >= due:
            self.last_asked = time.monotonic()
            self.todo.put("periodic")

    def note_stop(self) -> None:
        """The run begins to stop (the main thread's Supervisor): the thread writes the archive."""
        if not self.stop_noted and self.thread is not None:
            self.stop_noted = True
            self.todo.put("a stop")

    def end(self, join_s: float) -> None:
        """After the ranks: the bound, this host's archive, and what the job's graphs did, off
        one walk of the folder; then close()."""
        self.end_thread()
        if self.thread is not None:
            self.thread.join(join_s)
        try:
            if self.folder is not None:
                self.write_end()
        except Exception as exc:  # noqa: BLE001 - never a failed job
            self.say(f"torch.compile cache: not written ({type(exc).__name__}: {exc})")
        finally:
            self.close()

    def write_end(self) -> None:
        after = self.bound(load_entries(self.cache.folder))
        if not after and not self.at_start:
            return  # nothing compiled (no torch.compile here): nothing to say or keep
        self.say(f"torch.compile cache: {describe_graphs(self.at_start, after)}; {self.cache.folder} holds "
                 f"{len(after)} file(s), {describe_mb(sum(e[1] for e in after))}")
        if self.cache.archive is not None:
            self.save("the end", after)

    def end_thread(self) -> None:
        """The thread ends once the writes asked for so far are done (at the first None: one
        that a second call adds is never read)."""
        if self.thread is not None:
            self.todo.put(None)

    def close(self) -> None:
        """No more writes (the thread ends); the private folder, if one was made, removed."""
        self.end_thread()
        private, self.private = self.private, None
        if private is not None:
            import shutil

            shutil.rmtree(private, ignore_errors=True)

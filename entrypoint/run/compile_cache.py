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
  - Ranks writing at once: torch writes each entry whole (a temporary file, then a rename) and
    holds locks/<key>.lock while it builds a kernel; an archive leaves out temporary files and
    any kernel whose lock is held. Each host writes only its own archive, whole, then renames it.
"""

from __future__ import annotations

import json
import os
import re
import stat
import threading
import time
from typing import NamedTuple

from entrypoint.decide.compile_cache import CompileCache
from entrypoint.log import log

STAMP_NAME = "byoc-compile-cache.json"  # the archive's first member
STAGING_PREFIX = ".byoc-restore-"
ARCHIVE_NAME = re.compile(r"host-\d+\.tar\.gz\Z")
LOCKS = "locks" + os.sep  # torch's lock files: never archived
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


def load_entries(folder: str) -> list[tuple[str, int, float]]:
    """(path relative to folder, bytes, last use) of every cache file; what torch is still
    writing (dot files, *.tmp) and our staging folders are not entries."""
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith((".", "tmp.pid_"))]  # Triton's, while it writes
        for name in files:
            if name.startswith(".") or name.endswith(".tmp"):
                continue
            path = os.path.join(root, name)
            try:
                info = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                found.append((os.path.relpath(path, folder), info.st_size, max(info.st_atime, info.st_mtime)))
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
    max_bytes: (kept, evicted), so the caller need not walk the folder again."""
    kept, evicted = decide_kept(entries, max_bytes)
    for name, _, _ in evicted:
        try:
            os.unlink(os.path.join(folder, name))
        except OSError:
            pass
    return kept, evicted


def probe_empty(folder: str) -> bool:
    """Whether the folder is missing or empty (a new instance's), without walking it."""
    try:
        with os.scandir(folder) as found:
            return next(found, None) is None
    except FileNotFoundError:
        return True


def _remove_tree(path: str) -> None:
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files:
            os.unlink(os.path.join(root, name))
        for name in dirs:
            os.rmdir(os.path.join(root, name))
    os.rmdir(path)


def _safe_member_path(name: str) -> str | None:
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or name.startswith("/") or ".." in parts or any(p.startswith(".") for p in parts):
        return None
    return os.path.join(*parts)


def _unpack(archive: str, staging: str, stamp: dict, max_bytes: int) -> tuple[list, bool, str | None]:
    """Unpack one archive into staging: (the entries unpacked, whether that was every member,
    why it is not used or None). Raises on a corrupt or truncated archive (the caller discards
    staging)."""
    import gzip
    import tarfile

    unpacked: list[tuple[str, int, float]] = []
    size, whole, stamped = 0, True, False
    with gzip.open(archive, "rb") as raw:
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
                if path is None or not member.isreg() or size + member.size > max_bytes:
                    whole = False
                    continue
                target = os.path.join(staging, path)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                source = tar.extractfile(member)
                with open(target, "wb") as out:
                    while chunk := source.read(1 << 20):
                        out.write(chunk)
                os.utime(target, (member.mtime, member.mtime))
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


def _move_into_place(staging: str, folder: str, unpacked: list) -> list:
    """The unpacked entries that are not in the folder yet (a name is its content's key: one
    that is there is the same entry, which a rank may be reading): those moved."""
    moved = []
    for entry in unpacked:
        target = os.path.join(folder, entry[0])
        if not os.path.exists(target):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.replace(os.path.join(staging, entry[0]), target)
            moved.append(entry)
    return moved


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
    and those of them now in the folder that were not there before."""

    line: str
    entries: list | tuple = ()
    whole: bool = False
    moved: list | tuple = ()


def restore_archive(archive: str, cache: CompileCache, stamp: dict) -> Restored:
    """Unpack one archive into the cache folder."""
    try:
        info = os.stat(archive)
    except OSError as exc:
        return Restored(f"torch.compile cache: {archive} not read ({exc}): not used")
    if not stat.S_ISREG(info.st_mode):  # a FIFO would block the start
        return Restored(f"torch.compile cache: {archive} is not a regular file: not used")
    # Named by host and process: in containers every entrypoint is PID 1, and a folder the user
    # points several hosts at (BYOC_COMPILE_CACHE_DIR on a shared file system) is shared.
    staging = os.path.join(cache.folder, f"{STAGING_PREFIX}{os.uname().nodename}-{os.getpid()}")
    try:
        if os.path.isdir(staging):  # left by an entrypoint that was killed
            _remove_tree(staging)
        os.makedirs(staging)
        unpacked, whole, why = _unpack(archive, staging, stamp, cache.max_bytes)
        moved = _move_into_place(staging, cache.folder, unpacked) if why is None else []
    except Exception as exc:  # noqa: BLE001 - a bad archive is a cold start, never a failed job
        unpacked, whole, moved, why = [], False, [], f"unreadable ({type(exc).__name__}: {exc}), corrupt or truncated"
    finally:
        if os.path.isdir(staging):
            _remove_tree(staging)
    if why is not None:
        return Restored(f"torch.compile cache: {archive} not used: {why}; the ranks compile what they need (a cold "
                        f"start)")
    line = f"torch.compile cache: restored {len(unpacked)} file(s), {describe_mb(sum(e[1] for e in unpacked))}, " \
        f"from {archive}"
    return Restored(line, unpacked, whole, moved)


def build_signature(entries: list[tuple[str, int, float]]) -> frozenset:
    """What an archive of these entries would hold (torch's lock files are never in one)."""
    return frozenset((name, size) for name, size, _ in entries if not name.startswith(LOCKS))


def probe_kernel_locked(folder: str, name: str) -> bool:
    """Whether torch holds the lock of the kernel this file belongs to (it is being built)."""
    import fcntl

    key = os.path.basename(name).split(".", 1)[0]
    try:
        fd = os.open(os.path.join(folder, "locks", f"{key}.lock"), os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def write_archive(cache: CompileCache, stamp: dict, entries: list[tuple[str, int, float]]) -> tuple[list, int]:
    """This host's archive of the entries that fit the bound, written whole and renamed into
    place (SageMaker's upload and other hosts never see half of one): (entries written, archive
    bytes)."""
    import tarfile

    kept, _ = decide_kept([e for e in entries if not e[0].startswith(LOCKS)], cache.max_bytes)
    os.makedirs(cache.archive_folder, exist_ok=True)
    tmp = os.path.join(cache.archive_folder, f".{os.path.basename(cache.archive)}.{os.getpid()}.tmp")
    stamp_bytes = json.dumps(stamp, sort_keys=True).encode("utf-8")
    written = []
    try:
        with tarfile.open(tmp, "w:gz", compresslevel=1) as tar:
            info = tarfile.TarInfo(STAMP_NAME)
            info.size, info.mtime = len(stamp_bytes), time.time()
            import io

            tar.addfile(info, io.BytesIO(stamp_bytes))
            for entry in kept:
                if probe_kernel_locked(cache.folder, entry[0]):
                    continue
                try:
                    tar.add(os.path.join(cache.folder, entry[0]), arcname=entry[0].replace(os.sep, "/"),
                            recursive=False)
                except OSError:
                    continue  # evicted or replaced meanwhile
                written.append(entry)
        os.replace(tmp, cache.archive)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return written, os.path.getsize(cache.archive)


def describe_graphs(before: list, after: list) -> str:
    """What the job's graphs did, read off the folder: a graph torch compiled adds an FX graph
    entry (a miss); one it found adds none (a hit)."""
    graphs = "fxgraph" + os.sep
    had = {e[0] for e in before if e[0].startswith(graphs)}
    new = [e for e in after if e[0].startswith(graphs) and e[0] not in had]
    return f"{len(had)} FX graph entr{'y' if len(had) == 1 else 'ies'} at the start, {len(new)} compiled by this job"


class CacheKeeper:
    """This host's torch.compile cache for the length of the job: start() before the ranks,
    finish() after them. With an archive, a thread writes it every cache.save_every_s and as
    soon as a stop is seen (stopped() true), while the ranks use their grace period; one lock
    makes the thread's writes and finish()'s one at a time."""

    def __init__(self, cache: CompileCache, stopped, stop_check_s: float):
        self.cache, self.stopped, self.stop_check_s = cache, stopped, stop_check_s
        self.stamp: dict = {}
        self.lines: list[str] = []  # for the job report
        self.at_start: list = []
        self.saved: frozenset | None = None  # what the last archive held
        self.lock = threading.Lock()  # owns saved and the archive file
        self.done = threading.Event()
        self.thread: threading.Thread | None = None

    def say(self, line: str) -> None:
        log(line)
        self.lines.append(line)

    def start(self) -> None:
        """Restore, bound, and note what the folder holds. The folder is walked at most once: on
        a new instance it was empty, and what the archives held is what it holds."""
        cache = self.cache
        try:
            was_empty = probe_empty(cache.folder)
            os.makedirs(cache.folder, exist_ok=True)
            restored = self.restore_archives() if cache.archive is not None else []
            entries = restored if was_empty else load_entries(cache.folder)
            self.at_start = self.bound(entries)
        except Exception as exc:  # noqa: BLE001 - never a failed job
            self.say(f"torch.compile cache: not prepared ({type(exc).__name__}: {exc}); the ranks compile cold")
            return
        size = sum(e[1] for e in self.at_start)
        self.say(f"torch.compile cache: {cache.folder} holds {len(self.at_start)} file(s), {describe_mb(size)}, "
                 f"before the ranks start")
        if cache.archive is not None:
            self.thread = threading.Thread(target=self._keep, name="compile-cache", daemon=True)
            self.thread.start()

    def restore_archives(self) -> list:
        """Every host's archive, this host's first: the entries moved into the folder. An archive
        of this host's that came back whole is what the folder holds: no need to write it again
        unless the job adds to it (saved)."""
        self.stamp = probe_stamp()
        archives = list_archives(self.cache)
        if not archives:
            self.say(f"torch.compile cache: no archive in {self.cache.archive_folder} yet (a cold start)")
        moved = []
        for archive in archives:
            restored = restore_archive(archive, self.cache, self.stamp)
            self.say(restored.line)
            moved.extend(restored.moved)
            if archive == self.cache.archive and restored.whole:
                self.saved = build_signature(restored.entries)
        return moved

    def bound(self, entries: list) -> list:
        """The folder's entries within the bound (the rest are evicted); an eviction changes
        what an archive would hold."""
        kept, evicted = run_eviction(self.cache.folder, entries, self.cache.max_bytes)
        if evicted:
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
        last, stop_saved = time.monotonic(), False
        while not self.done.wait(self.stop_check_s):
            every = self.cache.save_every_s
            why = "a stop" if not stop_saved and self.stopped() else \
                "periodic" if every and time.monotonic() - last >= every else None
            if why is None:
                continue
            stop_saved = stop_saved or why == "a stop"
            last = time.monotonic()
            try:
                self.save(why)
            except Exception as exc:  # noqa: BLE001 - the next save tries again
                log(f"torch.compile cache: not written ({type(exc).__name__}: {exc})")

    def finish(self, join_s: float) -> None:
        """After the ranks: the bound, this host's archive, and what the job's graphs did, off
        one walk of the folder."""
        self.done.set()
        if self.thread is not None:
            self.thread.join(join_s)
        try:
            after = self.bound(load_entries(self.cache.folder))
            if not after and not self.at_start:
                return  # nothing compiled (no torch.compile here): nothing to say or keep
            self.say(f"torch.compile cache: {describe_graphs(self.at_start, after)}; {self.cache.folder} holds "
                     f"{len(after)} file(s), {describe_mb(sum(e[1] for e in after))}")
            if self.cache.archive is not None:
                self.save("the end", after)
        except Exception as exc:  # noqa: BLE001 - never a failed job
            self.say(f"torch.compile cache: not written ({type(exc).__name__}: {exc})")

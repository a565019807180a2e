"""A stop while the compile cache's archives are restored (run/compile_cache.py, issue 62 case 9,
docs/compile-cache.md "Safety"): an archive of one small entry and one large member, stopped
while the large member is read, leaves the cache folder exactly as it was (no entry of that
archive, no staging folder), the restore ends there (what was read stops short of the member's
end), and the job's outcome is a start-up stop. Never timed: the order is shown by what was
read. Through CacheKeeper with the stop token's own handler (the stop posted at a chosen byte of
the stream), and through the real entrypoint with a real SIGTERM at a chosen line
(tests/support/stop_at.py)."""

from __future__ import annotations

import functools
import gzip
import inspect
import io
import json
import os
import re
import shutil
import signal
import subprocess
import tarfile
from pathlib import Path

import pytest

from entrypoint.decide.compile_cache import CompileCache
from entrypoint.run import compile_cache as keep
from entrypoint.run.stop import Stop
from support.jobtree import PYTHON, REPO, entrypoint_env, write_tree

STOP_AT = str(REPO / "tests" / "support" / "stop_at.py")
SMALL = {"fxgraph/ab/entry": b"a small entry"}  # the archive's first entry, as in the issue
BIG_NAME = "tj/ctj.main.so"
ZEROS = 64 << 20  # one gzip member of zeros, repeated: a large member costs about 64 kB of disk per 64 MB


@functools.lru_cache(maxsize=1)
def build_gzip_of_zeros() -> bytes:
    return gzip.compress(bytes(ZEROS), compresslevel=9, mtime=0)


def write_archive(path: Path, big_size: int, stamp: dict | None = None) -> tuple[int, int]:
    """A well-stamped archive: SMALL, then BIG_NAME of big_size zero bytes, written as gzip
    members one after the other (gzip reads them as one stream, each with its own CRC), so a
    large member costs little disk and little compressing. (Where the large member's data
    starts and ends in the uncompressed stream.)"""
    head = io.BytesIO()
    tar = tarfile.open(fileobj=head, mode="w")
    for name, data in {keep.STAMP_NAME: json.dumps(stamp or keep.probe_stamp()).encode(), **SMALL}.items():
        info = tarfile.TarInfo(name)
        info.size, info.mtime = len(data), 1_000_000
        tar.addfile(info, io.BytesIO(data))
    info = tarfile.TarInfo(BIG_NAME)
    info.size, info.mtime = big_size, 1_000_000
    tar.addfile(info)  # the header only: the data follows as zeros, never in memory
    start = len(head.getvalue())
    tail = -big_size % 512 + big_size + 1024  # the data, its padding, the end-of-archive blocks: all zeros
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(gzip.compress(head.getvalue(), mtime=0))
        for _ in range(tail // ZEROS):
            f.write(build_gzip_of_zeros())
        f.write(gzip.compress(bytes(tail % ZEROS), mtime=0))
    return start, start + big_size


def snapshot(folder: Path) -> dict:
    """Every path under folder and what each file holds (its size, for a large one)."""
    found = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            size = os.path.getsize(path)
            found[os.path.relpath(path, folder)] = "dir" if os.path.isdir(path) else \
                open(path, "rb").read() if size < 4096 else size
    return found


def make_cache(tmp_path: Path, max_bytes: int) -> CompileCache:
    ckpt = tmp_path / "ckpt" / "byoc-compile-cache"
    return CompileCache(str(tmp_path / "local"), str(ckpt), str(ckpt / "host-0.tar.gz"), max_bytes, 0.0)


def fill_earlier(folder: Path) -> None:
    """What an earlier attempt left in the folder: it must stay exactly as it is."""
    (folder / "fxgraph" / "old").mkdir(parents=True)
    (folder / "fxgraph" / "old" / "entry").write_bytes(b"an earlier attempt's")


@pytest.fixture
def tmp_path(tmp_path):
    """pytest's, emptied afterwards: a failing run leaves a large member in it."""
    yield tmp_path
    shutil.rmtree(tmp_path, ignore_errors=True)


class ReaderStoppedAt:
    """The archive's uncompressed stream as the restore reads it (gzip.open's file, wrapped):
    once `at` bytes of it were read, the stop token's signal handler is called, as the kernel's
    SIGTERM would (it posts StopRequested on the host's loop). `count`: what the restore read."""

    def __init__(self, raw, stop: Stop, at: int) -> None:
        self.raw, self.stop, self.at = raw, stop, at
        self.count, self.stop_at = 0, None

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.count += len(data)
        if self.stop_at is None and self.count >= self.at:
            self.stop_at = self.count
            self.stop.on_signal(signal.SIGTERM, None)
        return data

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.raw.close()


def read_with_a_stop_at(monkeypatch, archive: Path, stop: Stop, at: int) -> list[ReaderStoppedAt]:
    """gzip.open of that archive (run/compile_cache._unpack's) reads through ReaderStoppedAt."""
    real_open, readers = gzip.open, []

    def opened(path, mode="rb", *args, **kwargs):
        raw = real_open(path, mode, *args, **kwargs)
        if os.fspath(path) != str(archive):
            return raw
        readers.append(ReaderStoppedAt(raw, stop, at))
        return readers[-1]

    monkeypatch.setattr(gzip, "open", opened)
    return readers


BIG = 256 << 20


@pytest.mark.parametrize("bound", ["under the bound: written to staging", "over the bound: skipped, as in the issue"])
def test_a_stop_while_the_large_member_is_read_leaves_the_folder_as_it_was(tmp_path, monkeypatch, bound):
    """The issue's archive (one small entry first, one large member), stopped 4 MB into the large
    member: the restore ends within the next megabyte, long before the member's end; nothing of
    the archive is moved into the folder, its staging is removed, the other host's archive is
    not read, and the keeper does nothing more (the job ends)."""
    cache = make_cache(tmp_path, BIG * 2 if bound.startswith("under") else 1 << 20)
    archive = Path(cache.archive)
    start, end = write_archive(archive, BIG)
    other = archive.parent / "host-1.tar.gz"
    write_archive(other, 0)
    fill_earlier(tmp_path / "local")
    before = snapshot(tmp_path / "local")
    stop = Stop()
    readers = read_with_a_stop_at(monkeypatch, archive, stop, start + (4 << 20))
    k = keep.CacheKeeper(cache)
    k.stop_asked = stop.loop.stopped  # as orchestrate.start_compile_cache hands it
    k.start()
    k.close()
    [reader] = readers
    assert reader.stop_at is not None and start < reader.stop_at < end  # the stop came within the member
    assert reader.count < end, (reader.count, end)  # and the restore read no further than its next look
    assert reader.count <= reader.stop_at + keep.STOP_CHECK_BYTES + (64 << 10)
    assert snapshot(tmp_path / "local") == before  # no entry of it, no staging
    assert k.lines[-2].startswith(f"torch.compile cache: {archive} not restored: the job was stopped after "), k.lines
    assert k.lines[-1] == "torch.compile cache: 1 more archive(s) not restored: the job was stopped"
    assert k.at_start == [] and k.thread is None  # no bound, no walk, no thread: the job ends


def test_without_a_stop_the_same_archive_is_restored_whole(tmp_path):
    cache = make_cache(tmp_path, BIG * 2)
    write_archive(Path(cache.archive), BIG)
    fill_earlier(tmp_path / "local")
    k = keep.CacheKeeper(cache)
    k.start()
    k.close()
    local = tmp_path / "local"
    assert (local / "fxgraph/ab/entry").read_bytes() == SMALL["fxgraph/ab/entry"]
    assert os.path.getsize(local / BIG_NAME) == BIG
    assert (local / "fxgraph/old/entry").read_bytes() == b"an earlier attempt's"
    assert not [n for n in os.listdir(local) if n.startswith(keep.STAGING_PREFIX)]
    assert k.lines[0].startswith("torch.compile cache: restored 2 file(s), 256.0 MB, from "), k.lines


def find_line(function, text: str) -> int:
    """The line number of the first line of function's source that holds text."""
    lines, first = inspect.getsourcelines(function)
    return first + next(i for i, line in enumerate(lines) if text in line)


def run_stopped_at(tmp_path: Path, name: str, step: int, big_size: int) -> tuple:
    """The real entrypoint (stop_at.py) with a checkpoint folder holding the archive, a SIGTERM
    from the kernel at `step` of the window from the first write_member call to the move into
    place (0: none sent, the window's steps listed). (the run, the tree, the folder, its
    snapshot before, the note, the steps listed)"""
    base = tmp_path / name
    root = write_tree(base / "ml", script="raise SystemExit('the script ran')\n")
    (root / "input/config/checkpointconfig.json").write_text(json.dumps({"LocalPath": str(base / "ckpt"),
                                                                         "S3Path": "s3://bucket/ckpt"}))
    write_archive(base / "ckpt/byoc-compile-cache/host-0.tar.gz", big_size)
    local, note, listing = base / "local", base / "note", base / "steps"
    fill_earlier(local)
    before = snapshot(local)
    (base / "tmp").mkdir()
    env = entrypoint_env(root, BYOC_COMPILE_CACHE_DIR=str(local), BYOC_RUNTIME_DIR=str(base / "run"),
                         BYOC_REPORT="0", TMPDIR=str(base / "tmp"),
                         STOP_AT_FROM="entrypoint.run.compile_cache:write_member",
                         STOP_AT_TO="entrypoint.run.compile_cache:_move_into_place",
                         STOP_AT_STEP=str(step), STOP_AT_NOTE=str(note), STOP_AT_LIST=str(listing) if not step else "")
    done = subprocess.run([PYTHON, STOP_AT], env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    steps = listing.read_text().splitlines() if not step else []
    return done, root, local, before, note.read_text().strip(), steps


def test_a_sigterm_to_the_entrypoint_while_the_large_member_is_read_is_a_start_up_stop_with_nothing_restored(
        tmp_path):
    """The real entrypoint, a real SIGTERM from the kernel on the line that writes the large
    member's first megabyte into the staging folder (the second write_member call; the first
    was the small entry's): the job ends as a start-up stop, the log says how far the restore
    read (short of the member's end), and the folder is exactly as the earlier attempt left it."""
    big = 64 << 20
    write_line = find_line(keep.write_member, "write_all(out, chunk)")
    done, *_, steps = run_stopped_at(tmp_path, "count", 0, big)
    at = f"entrypoint/run/compile_cache.py:{write_line} write_member"
    found = [i + 1 for i, step in enumerate(steps) if step == at]
    assert len(found) == 2, (at, done.stderr[-3000:])  # the small entry's chunk, then the large member's first
    done, root, local, before, note, _ = run_stopped_at(tmp_path, "stop", found[1], big)
    assert note == f"sent at entrypoint/run/compile_cache.py:{write_line} (write_member)", note
    failure = (root / "output/failure").read_text()
    assert done.returncode == 143, done.stderr[-3000:]
    assert failure.startswith("Stopped by SIGTERM during start-up, before the training processes started"), failure
    read = re.search(r"host-0\.tar\.gz not restored: the job was stopped after ([\d.]+) MB of it was read; "
                     r"nothing of it is used", done.stderr)
    assert read is not None and float(read.group(1)) < big / (1 << 20), done.stderr[-3000:]
    assert snapshot(local) == before  # no entry of it, no staging

"""Each rank's output, followed in the file Open MPI's daemon writes for it on this host, and
written as whole lines under a tag of ours.

`mpirun --output-filename DIR:nocopy` (decide/plan.py, a job of one host) has the daemon write
each rank's streams byte for byte to files of their own, `DIR/<job>/rank.<N>/stdout` and
`stderr`, and forward nothing to mpirun. A file holds one rank's one stream: there is nothing to
rejoin and no tag to trust. Under `--tag-output` a tag inside a line is either where mpirun glued
another rank's piece or the rank's own text, and no byte tells which (run/tagged_lines.py); here
the rank's text stays its text. Each line goes out once whole, as `[1,N]<stdout>:line`, the tag
mpirun wrote, so every reader of tagged lines (outcome/hangs.py, the live view, people) reads it
as before. A piece still waiting for its line's end is written as a line of its own when its
file is quiet for quiet_s, when it passes MAX_PENDING_BYTES, and at the end; stop() reads every
file to its end first: nothing a rank wrote is held back long or lost. What has been read is
given back to the file system (a hole punched where it was: the daemon writes on at its own
offset), so the files hold only what is not yet read, not a long job's whole log.

On an MPI worker the same follower writes every rank's lines, each whole and under its tag, to
the stream the leader asked for (run/rank_stream.RankStream), where the leader reads them as
its own ranks'.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import shutil
import stat
import sys
import threading
import time

MAX_PENDING_BYTES = 65536  # as run/tagged_lines.py: a line with no end (a progress bar's \r)
READ_BYTES = 1 << 20  # per file and round: one busy rank cannot hold back the others for long
RELEASE_BYTES = 1 << 20  # read this much more, then give it back to the file system
_RANK_FILE = re.compile(r"(\d+)/rank\.(\d+)/(stdout|stderr|stddiag)")
_PUNCH_HOLE = 0x01 | 0x02  # FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE (linux/falloc.h)


def parse_rank_file(relative: str) -> tuple[bytes, str] | None:
    """`1/rank.3/stdout` -> (b"[1,3]<stdout>:", "stdout"): the tag mpirun writes for that rank
    and stream, and which of our streams it goes to (stddiag: Open MPI's diagnostics, stderr)."""
    match = _RANK_FILE.fullmatch(relative)
    if match is None:
        return None
    job, rank, stream = match.groups()
    return b"[%s,%s]<%s>:" % (job.encode(), rank.encode(), stream.encode()), "stdout" if stream == "stdout" else "stderr"


def build_lines(pending: bytes, data: bytes) -> tuple[list[bytes], bytes]:
    """The whole lines of pending + data, and what waits for its end; a wait past
    MAX_PENDING_BYTES is a line of its own."""
    *lines, rest = (pending + data).split(b"\n")
    if len(rest) > MAX_PENDING_BYTES:
        lines.append(rest)
        rest = b""
    return lines, rest


class _RankFile:
    def __init__(self, fd: int, tag: bytes, sink, stream) -> None:
        self.fd, self.tag, self.sink, self.stream = fd, tag, sink, stream
        self.offset = 0
        self.released = 0  # the start of the file given back to the file system
        self.pending = b""
        self.last_data = time.monotonic()


class RankOutputFollower:
    """Follows every rank file under folder (a thread); stop() drains them. on_line(line,
    stream) gets every tagged line without its newline (the collector's add_line)."""

    def __init__(self, folder: str, on_line, open_stream, quiet_s: float, poll_s: float, sinks=None) -> None:
        self.folder = folder
        self.on_line, self.open_stream = on_line, open_stream
        self.quiet_s, self.poll_s = quiet_s, poll_s
        self.sinks = sinks or {"stdout": sys.stdout.buffer, "stderr": sys.stderr.buffer}
        self.files: dict[str, _RankFile | None] = {}  # relative path -> its state (None: not a rank's file)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._follow, daemon=True, name="rank-output")

    def start(self) -> RankOutputFollower:
        self.thread.start()
        return self

    def stop(self, join_s: float) -> None:
        """Read every file to its end, write what waits as lines, and end (within join_s)."""
        self.stopping.set()
        self.thread.join(timeout=join_s)

    def _follow(self) -> None:
        try:
            while not self.stopping.wait(self.poll_s):
                self._read_all(final=False)
            self._read_all(final=True)
        finally:
            for state in self.files.values():
                if state is not None:
                    os.close(state.fd)

    def _read_all(self, final: bool) -> None:
        self._open_new()
        for state in self.files.values():
            if state is not None:
                try:
                    self._read(state, final)
                except OSError:
                    pass  # this file, this round only: the others go on, and it is read again next round

    def _open_new(self) -> None:
        """Open the rank files that appeared: regular files only, opened without blocking and
        without following a link (the ranks can write to this folder)."""
        for job in _list(self.folder):
            for rank in _list(os.path.join(self.folder, job)):
                for name in _list(os.path.join(self.folder, job, rank)):
                    relative = f"{job}/{rank}/{name}"
                    if relative not in self.files:
                        self.files[relative] = self._open(relative)

    def _open(self, relative: str) -> _RankFile | None:
        parsed = parse_rank_file(relative)
        if parsed is None:
            return None
        try:
            # Read and write: a hole can only be punched through a descriptor open for writing.
            fd = os.open(os.path.join(self.folder, relative), os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW)
        except OSError:
            return None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        tag, stream = parsed
        return _RankFile(fd, tag, self.sinks[stream], self.open_stream())

    def _read(self, state: _RankFile, final: bool) -> None:
        now = time.monotonic()
        while chunk := os.pread(state.fd, READ_BYTES, state.offset):
            state.offset += len(chunk)
            state.last_data = now
            lines, state.pending = build_lines(state.pending, chunk)
            self._write(state, lines)
            if not final:
                break  # the next round reads on, after the other files
        if state.pending and (final or now - state.last_data >= self.quiet_s):
            lines, state.pending = [state.pending], b""
            self._write(state, lines)
        if state.offset - state.released >= RELEASE_BYTES:
            release_read_part(state.fd, state.offset)
            state.released = state.offset

    def _write(self, state: _RankFile, lines: list[bytes]) -> None:
        if not lines:
            return
        tagged = [state.tag + line for line in lines]
        try:
            state.sink.write(b"".join(line + b"\n" for line in tagged))  # one write: lines stay whole
            state.sink.flush()
        except (OSError, ValueError):
            pass  # our own stdout is gone: the lines still reach the collector
        for line in tagged:
            self.on_line(line, state.stream)


@functools.cache
def _load_fallocate():
    try:
        fallocate = ctypes.CDLL(None, use_errno=True).fallocate64
    except (OSError, AttributeError):
        return None
    fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    return fallocate


def release_read_part(fd: int, length: int) -> bool:
    """Punch a hole over the file's first length bytes (its size stays); False where the file
    system cannot (the file then keeps them until the job's folder is removed)."""
    fallocate = _load_fallocate()
    return fallocate is not None and fallocate(fd, _PUNCH_HOLE, 0, length) == 0


def _list(folder: str) -> list[str]:
    try:
        return sorted(os.listdir(folder))
    except OSError:
        return []


def clear(folder: str) -> None:
    """Before mpirun starts: the files an earlier run left (a restart's mpirun would empty them
    while they are followed, and a new follower would print them again)."""
    shutil.rmtree(folder, ignore_errors=True)


def start_following(folder: str, collector, quiet_s: float, poll_s: float) -> RankOutputFollower:
    """Follow what this run's ranks write in folder (from each file's start: nothing is missed
    however late this starts)."""
    return RankOutputFollower(folder, collector.add_line, collector.open_stream, quiet_s, poll_s).start()

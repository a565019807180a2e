"""Each rank's file, followed as Open MPI's daemon writes it (run/rank_output.py): whole lines
under the rank's tag, a waiting piece written when quiet and at the end, nothing lost. The
files are written here as the daemon writes them; tests/entrypoint/rank/test_whole_lines.py runs
the real mpirun through the entrypoint."""

import io
import os
import threading
import time

import pytest

from entrypoint.run import rank_output
from entrypoint.run.rank_output import MAX_PENDING_BYTES, build_lines, parse_rank_file
from entrypoint.run.supervise import OutputCollector

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick


@pytest.mark.parametrize("relative, expected", [
    ("1/rank.0/stdout", (b"[1,0]<stdout>:", "stdout")),
    ("1/rank.12/stderr", (b"[1,12]<stderr>:", "stderr")),
    ("1/rank.3/stddiag", (b"[1,3]<stddiag>:", "stderr")),
    ("1/rank.x/stdout", None), ("1/rank.0/stdout.bak", None), ("1/rank.0", None), ("../1/rank.0/stdout", None),
])
def test_a_rank_files_path_gives_mpiruns_tag_and_our_stream(relative, expected):
    assert parse_rank_file(relative) == expected


@pytest.mark.parametrize("size, waits", [(MAX_PENDING_BYTES - 1, True), (MAX_PENDING_BYTES, True),
                                         (MAX_PENDING_BYTES + 1, False)])
def test_a_piece_waits_for_its_line_up_to_the_limit(size, waits):
    lines, rest = build_lines(b"a\nb", b"c\n" + b"x" * size)
    assert lines == [b"a", b"bc"] + ([] if waits else [b"x" * size])
    assert rest == (b"x" * size if waits else b"")


class Sink(io.RawIOBase):
    def __init__(self):
        self.data, self.lock = b"", threading.Lock()

    def write(self, b):
        with self.lock:
            self.data += bytes(b)
        return len(b)


def write(folder, relative, data: bytes) -> None:
    path = os.path.join(folder, relative)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "ab") as f:
        f.write(data)


def wait_until(condition) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.01)


def follow(tmp_path, quiet_s=0.2):
    folder = str(tmp_path / "rank-output")
    collector = OutputCollector()
    sinks = {"stdout": Sink(), "stderr": Sink()}
    follower = rank_output.RankOutputFollower(folder, collector.add_line, collector.open_stream, quiet_s, 0.01, sinks)
    return folder, collector, sinks, follower.start()


def test_each_ranks_text_comes_out_as_written_under_its_tag_and_a_piece_when_quiet(tmp_path):
    folder, collector, sinks, follower = follow(tmp_path)
    hostile = "x [1,0]<stdout>: \x1b[31m\r\x00 \udcff".encode("utf-8", "surrogateescape")
    write(folder, "1/rank.1/stdout", b"one [1,0]<stdout>: two\n" + hostile + b"\nwaits")
    write(folder, "1/rank.0/stderr", b"err\n")
    wait_until(lambda: b"waits" in sinks["stdout"].data)  # quiet: written before the end
    assert sinks["stdout"].data == b"[1,1]<stdout>:one [1,0]<stdout>: two\n[1,1]<stdout>:" + hostile + \
        b"\n[1,1]<stdout>:waits\n"
    write(folder, "1/rank.1/stdout", b" and the rest\n")
    follower.stop(30)
    assert sinks["stdout"].data.endswith(b"[1,1]<stdout>: and the rest\n")
    assert sinks["stderr"].data == b"[1,0]<stderr>:err\n"
    assert "[1,1]<stdout>:one [1,0]<stdout>: two" in collector.tail
    assert "[1,0]<stderr>:err" in collector.tail


def test_stop_reads_every_file_to_its_end_and_writes_what_waits(tmp_path):
    folder, _, sinks, follower = follow(tmp_path, quiet_s=3600)
    lines = b"".join(b"%06d\n" % i for i in range(200000))  # more than one read of a file
    write(folder, "1/rank.0/stdout", lines + b"last, no newline")
    follower.stop(60)
    assert sinks["stdout"].data == b"".join(b"[1,0]<stdout>:" + line + b"\n"
                                            for line in (lines + b"last, no newline").split(b"\n"))


def test_a_fifo_or_a_link_where_a_rank_file_goes_blocks_nothing_and_is_not_read(tmp_path):
    folder, _, sinks, follower = follow(tmp_path)
    os.makedirs(os.path.join(folder, "1", "rank.0"))
    os.mkfifo(os.path.join(folder, "1", "rank.0", "stdout"))
    secret = tmp_path / "elsewhere"
    secret.write_bytes(b"not a rank's\n")
    os.symlink(secret, os.path.join(folder, "1", "rank.0", "stderr"))
    write(folder, "1/rank.1/stdout", b"read\n")
    follower.stop(30)
    assert not follower.thread.is_alive()
    assert (sinks["stdout"].data, sinks["stderr"].data) == (b"[1,1]<stdout>:read\n", b"")


def test_clearing_before_a_run_removes_what_an_earlier_run_left(tmp_path):
    folder = str(tmp_path / "rank-output")
    write(folder, "1/rank.0/stdout", b"from the run before\n")
    rank_output.clear(folder)
    rank_output.clear(folder)  # nothing there: no error
    assert not os.path.exists(folder)


def test_what_was_read_is_given_back_to_the_file_system_while_the_daemon_writes_on(tmp_path):
    """A long job's log does not pile up in the runtime folder: the part read becomes a hole,
    and a writer at its own offset (the daemon: O_TRUNC, not O_APPEND) goes on after it."""
    folder, _, sinks, follower = follow(tmp_path)
    path = os.path.join(folder, "1", "rank.0", "stdout")
    os.makedirs(os.path.dirname(path))
    line = b"y" * 1023 + b"\n"
    with open(path, "wb", buffering=0) as daemon:
        daemon.write(line * 4096)  # 4 MiB
        wait_until(lambda: len(sinks["stdout"].data) == 4096 * (len(line) + len(b"[1,0]<stdout>:")))
        wait_until(lambda: os.stat(path).st_blocks * 512 < 1 << 20)
        daemon.write(b"after the hole\n")
    follower.stop(30)
    assert os.path.getsize(path) == 4096 * len(line) + len(b"after the hole\n")
    assert sinks["stdout"].data.endswith(b"[1,0]<stdout>:after the hole\n")
    assert sinks["stdout"].data.count(b"[1,0]<stdout>:" + line) == 4096

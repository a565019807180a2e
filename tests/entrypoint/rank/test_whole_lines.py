"""Every line a rank prints arrives whole: never cut, never glued to another rank's line.

Two causes, both tested here with real processes: print() under PYTHONUNBUFFERED=1 writes its
text and its newline as two writes (the rank wrapper now writes whole lines), and mpirun's
daemons tag whatever each read of a rank's pipe returns, cut anywhere (across hosts the
entrypoint rejoins mpirun's tagged pieces: entrypoint/run/tagged_lines.py; on one host it reads
each rank's own file: entrypoint/run/rank_output.py).
"""

import os
import re
import select
import shutil
import socket
import subprocess
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entrypoint.rank import record_errors
from entrypoint.run.tagged_lines import MAX_PENDING_BYTES, TaggedLines
from support.jobtree import PYTHON, run_entrypoint, write_tree

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

RECORD_ERRORS = record_errors.__file__  # this checkout's, or the image's installed one
LINES = 3000
PRINTER = f"""
import os
rank = os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("RANK_ID", "0")
for i in range({LINES}):
    print(f"LINE rank={{rank}} i={{i}} " + "x" * (i % 300) + " END")
"""
WHOLE = re.compile(r"^(?:\[1,(\d)\]<stdout>:)?LINE rank=(\d) i=(\d+) (x*) END$")


def assert_every_line_whole(stdout: str, ranks: int) -> None:
    seen = {str(r): [] for r in range(ranks)}
    for line in stdout.splitlines():
        if "LINE" in line or "END" in line:
            match = WHOLE.match(line)
            assert match, f"a cut or glued line: {line[:300]!r}"
            tag, rank, i, xs = match.groups()
            assert tag in (None, rank) and len(xs) == int(i) % 300, line[:300]
            seen[rank].append(int(i))
    for rank, got in seen.items():
        assert got == list(range(LINES)), f"rank {rank}: {len(got)} of {LINES} lines, in order: {got[:5]}..."


# --- the rejoining of mpirun's tagged pieces (pure) ----------------------------------------------

def test_a_line_cut_by_a_read_and_glued_to_another_ranks_line_is_rejoined():
    lines = TaggedLines()
    out = lines.feed(b"[1,0]<stdout>:LINE a") + lines.feed(b"b[1,1]<stdout>:other\n[1,0]<stdout>:c END\n")
    assert out == b"[1,1]<stdout>:other\n[1,0]<stdout>:LINE abc END\n"
    assert not lines.has_partial


def test_a_tag_cut_by_a_read_is_completed_by_the_next():
    lines = TaggedLines()
    assert lines.feed(b"[1,0]<stdout>:one\n[1,1]<std") == b"[1,0]<stdout>:one\n"
    assert lines.feed(b"err>:two\n") == b"[1,1]<stderr>:two\n"


def test_untagged_text_passes_as_it_comes_and_a_waiting_piece_is_written_when_quiet():
    lines = TaggedLines()
    assert lines.feed(b"mpirun says\n[1,0]<stdout>:Epoch 1 ...") == b"mpirun says\n"
    assert lines.has_partial and lines.flush_partial() == b"[1,0]<stdout>:Epoch 1 ...\n"
    assert lines.feed(b"[1,0]<stdout>: done\n") == b"[1,0]<stdout>: done\n"


@pytest.mark.parametrize("size", [MAX_PENDING_BYTES - 1, MAX_PENDING_BYTES, MAX_PENDING_BYTES + 1])
def test_a_line_with_no_end_is_written_once_it_passes_the_limit(size):
    lines = TaggedLines()
    out = lines.feed(b"[1,0]<stdout>:" + b"\r" * (size - 1)) + lines.feed(b"[1,0]<stdout>:x")
    assert out == (b"[1,0]<stdout>:" + b"\r" * (size - 1) + b"x\n" if size > MAX_PENDING_BYTES else b"")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.text(st.characters(exclude_characters="\n[", codec="utf-8"), max_size=30)),
                max_size=60),
       st.randoms(use_true_random=False))
def test_any_interleaving_of_cut_pieces_comes_out_as_the_lines_each_rank_wrote(written, rnd):
    """A model of mpirun: each rank's bytes cut into random reads, each read tagged, the reads
    of all ranks interleaved, the stream then cut into random chunks for our reads."""
    per_rank = {r: [text.encode() for rank, text in written if rank == r] for r in range(3)}
    reads = []
    for rank, texts in per_rank.items():
        data = b"".join(t + b"\n" for t in texts)
        at, pieces = 0, []
        while at < len(data):
            step = rnd.randint(1, 40)
            pieces.append(data[at:at + step])
            at += step
        reads.append([(rank, p) for p in pieces])
    stream = b""
    while any(reads):
        queue = rnd.choice([q for q in reads if q])
        rank, piece = queue.pop(0)
        tag = f"[1,{rank}]<stdout>:".encode()
        stream += tag + piece[:-1].replace(b"\n", b"\n" + tag) + piece[-1:]  # a tag after each newline but the last
    lines, out, at = TaggedLines(), b"", 0
    while at < len(stream):
        step = rnd.randint(1, 50)
        out += lines.feed(stream[at:at + step])
        at += step
    out += lines.flush_partial()
    got = {r: [] for r in range(3)}
    for line in out.split(b"\n")[:-1]:
        match = re.match(rb"\[1,(\d)\]<stdout>:(.*)$", line, re.S)
        assert match, line
        got[int(match.group(1))].append(match.group(2))
    assert got == per_rank


@pytest.mark.parametrize("line", [
    b"[1,1]<stdout>:a [1,0]<stderr>: another stream's tag",  # on stdout: not mpirun's
    b"[1,1]<stdout>:[1,0]<stdout>: the line starts with a tag",  # right after mpirun's own
    b"[1,1]<stdout>:[1,0]<stdout>:[1,1]<stdout>: two",
    b"[1,1]<stdout>:x [1,7]<stdout>: a rank the job does not have",
])
def test_text_shaped_like_a_tag_where_mpirun_writes_none_stays_in_the_ranks_line(line):
    lines = TaggedLines("stdout", ranks=2)
    out = lines.feed(line + b"\n[1,1]<stdout>:next\n") + lines.flush_partial()
    assert out == line + b"\n[1,1]<stdout>:next\n"


def test_on_mpiruns_stderr_only_stderr_and_stddiag_tags_count():
    lines = TaggedLines("stderr", ranks=2)
    assert lines.feed(b"[1,0]<stderr>:a [1,1]<stdout>:b\n") == b"[1,0]<stderr>:a [1,1]<stdout>:b\n"
    assert lines.feed(b"[1,0]<stderr>:cut [1,1]<stddiag>:diag\n[1,0]<stderr>: end\n") == (
        b"[1,1]<stddiag>:diag\n[1,0]<stderr>:cut  end\n")


# --- real processes -------------------------------------------------------------------------------

def needs_mpirun(fn):
    return pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs Open MPI's mpirun")(fn)


@needs_mpirun
@pytest.mark.parametrize("run", range(3))
def test_two_ranks_under_mpirun_printing_3000_lines_each_all_arrive_whole(tmp_path, run):
    host = socket.gethostname()
    root = write_tree(tmp_path, script=PRINTER, hosts=(host,), current_host=host,
                      hyperparameters={"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2})
    done = run_entrypoint(root, PYTHONUNBUFFERED="1")  # as the images set it
    assert done.returncode == 0, done.stderr[-2000:]
    assert_every_line_whole(done.stdout, ranks=2)


@pytest.mark.parametrize("unbuffered", ["1", ""])
def test_ranks_sharing_one_pipe_write_whole_lines(tmp_path, unbuffered):
    """torchrun, the parameter server and the one-process path hand the ranks the launcher's
    own pipe: the rank wrapper must write each line with one write."""
    script = tmp_path / "printer.py"
    script.write_text(PRINTER)
    env = {**os.environ, "PYTHONUNBUFFERED": unbuffered}
    read, write = os.pipe()
    procs = [subprocess.Popen([PYTHON, RECORD_ERRORS, str(script)], stdout=write, env={**env, "RANK_ID": str(r)})
             for r in range(2)]
    os.close(write)
    chunks = []
    with os.fdopen(read, "rb", buffering=0) as f:
        while chunk := f.read(4096):  # a reader slower than the ranks: the pipe fills, writers wait and race
            chunks.append(chunk)
            time.sleep(0.0005)
    out = b"".join(chunks).decode()
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    assert_every_line_whole(out, ranks=2)


def test_a_partial_line_shows_soon_and_text_without_a_newline_shows_at_exit(tmp_path):
    """The script prints a prompt and then waits for a line from us: the prompt must reach us
    while the script still waits (a wrapper that held it until a newline never would)."""
    script = tmp_path / "prompt.py"
    script.write_text("import sys\nprint('waiting for data...', end='')\nsys.stdin.readline()\nprint(' done')\n"
                      "sys.stdout.write('last words without a newline')\n")
    proc = subprocess.Popen([PYTHON, RECORD_ERRORS, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 60)  # a guard against a hang, not a speed bound
        assert ready, "the prompt never arrived while the script waited for its input"
        assert os.read(proc.stdout.fileno(), 100) == b"waiting for data..."
        proc.stdin.write(b"go\n")
        proc.stdin.close()
        assert proc.stdout.read() == b" done\nlast words without a newline"
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()


@needs_mpirun
def test_text_without_a_newline_at_exit_still_shows_under_mpirun(tmp_path):
    host = socket.gethostname()
    root = write_tree(tmp_path, script="import sys\nsys.stdout.write('no newline here')\n", hosts=(host,),
                      current_host=host, hyperparameters={"sagemaker_mpi_enabled": True})
    done = run_entrypoint(root, PYTHONUNBUFFERED="1")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "<stdout>:no newline here\n" in done.stdout


FAKE_TAGS = """import os, sys
if os.environ['OMPI_COMM_WORLD_RANK'] == '1':
    print('[1,0]<stdout>:a line that starts with a tag')
    print('on stdout [1,0]<stderr>: the other stream')
    print('beyond the ranks [1,5]<stdout>: x')
    sys.stderr.write('[1,0]<stderr>:[1,1]<stderr>: on stderr\\n')
print('done', flush=True)
"""


@needs_mpirun
def test_a_ranks_tag_shaped_text_where_mpirun_writes_no_tag_comes_out_whole(tmp_path):
    host = socket.gethostname()
    root = write_tree(tmp_path, script=FAKE_TAGS, hosts=(host,), current_host=host,
                      hyperparameters={"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2})
    done = run_entrypoint(root, PYTHONUNBUFFERED="1")
    assert done.returncode == 0, done.stderr[-2000:]
    for line in ("[1,1]<stdout>:[1,0]<stdout>:a line that starts with a tag",
                 "[1,1]<stdout>:on stdout [1,0]<stderr>: the other stream",
                 "[1,1]<stdout>:beyond the ranks [1,5]<stdout>: x"):
        assert line in done.stdout.splitlines(), done.stdout
    assert "[1,1]<stderr>:[1,0]<stderr>:[1,1]<stderr>: on stderr" in done.stderr.splitlines(), done.stderr[-2000:]


# --- issue 33, case 6: a job of one host reads each rank's own file, not mpirun's tags ------------

MID_LINE_TAGS = """import os, sys
rank = int(os.environ['OMPI_COMM_WORLD_RANK'])
for i in range(200):
    print(f'rank {rank} i={i} says [1,0]<stdout>: mid-line [1,1]<stdout>: twice')
    print(f'rank {rank} i={i} the next line')
sys.stderr.write(f'rank {rank} on stderr [1,0]<stderr>: mid-line\\n')
if rank == 0:
    os.write(1, b''.join(b'%03d\\n' % i for i in range(1000)))  # one write, as a C extension would
    os.write(1, 'é'.encode() * 700 + b'\\n')
"""


@needs_mpirun
def test_a_ranks_text_holding_mpiruns_tag_mid_line_comes_out_whole_and_nothing_is_lost(tmp_path):
    """Under --tag-output a tag of this stream inside a rank's line cannot be told from mpirun's
    glue: the text after it joined rank 0's line and the next line was mangled, and Open MPI
    dropped lines of a burst of short ones (455-909 of 1,000 came)."""
    host = socket.gethostname()
    root = write_tree(tmp_path, script=MID_LINE_TAGS, hosts=(host,), current_host=host,
                      hyperparameters={"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2})
    done = run_entrypoint(root, PYTHONUNBUFFERED="1")
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    for rank in (0, 1):
        said = [line for line in lines if line.startswith(f"[1,{rank}]<stdout>:rank {rank} ")]
        assert said == [f"[1,{rank}]<stdout>:rank {rank} i={i} {text}" for i in range(200)
                        for text in ("says [1,0]<stdout>: mid-line [1,1]<stdout>: twice", "the next line")], said[:4]
        assert f"[1,{rank}]<stderr>:rank {rank} on stderr [1,0]<stderr>: mid-line" in done.stderr.splitlines()
    assert [line for line in lines if re.fullmatch(r"\[1,0\]<stdout>:\d{3}", line)] == \
        [f"[1,0]<stdout>:{i:03d}" for i in range(1000)]
    assert "[1,0]<stdout>:" + "é" * 700 in lines


@needs_mpirun
def test_a_shell_ranks_tag_shaped_text_comes_out_whole(tmp_path):
    """A shell script writes to fd 1 itself (record_errors.py --exec becomes it): no wrapper
    of ours sees its text, the file does."""
    host = socket.gethostname()
    script = "#!/bin/sh\nprintf 'shell %s [1,0]<stdout>: mid-line\\n' \"$OMPI_COMM_WORLD_RANK\"\nprintf 'shell next\\n'\n"
    root = write_tree(tmp_path, script=script, program="train.sh", hosts=(host,), current_host=host,
                      hyperparameters={"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2})
    done = run_entrypoint(root)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    for rank in (0, 1):
        assert f"[1,{rank}]<stdout>:shell {rank} [1,0]<stdout>: mid-line" in lines, done.stdout
        assert f"[1,{rank}]<stdout>:shell next" in lines, done.stdout

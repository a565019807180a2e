"""What Open MPI's output modes deliver of a rank's lines: `--tag-output` (ours), `--xml`
(every read of a rank's output as `<stdout rank="N">…</stdout>`, its text escaped) and
`--output-filename DIR:nocopy` (each host's daemon writes each of its ranks' streams to a
file of its own, DIR/1/rank.N/stdout, and forwards nothing to mpirun), on one host, 2 ranks,
the machine's own mpirun.

    .venv/bin/python benchmarks/mpirun_output_modes.py [--runs 5]

Three probes, each a rank program:
- tag text: both ranks print 500 lines that hold `[1,0]<stdout>:` mid-line (issue 33, case 6);
- short lines: rank 0 prints 1,000 lines of 4 bytes with one write (a dict or a list printed
  one item a line);
- accented: rank 0 prints one line of 700 `é` (1,400 bytes), then a short one.
Reported per mode and probe, for each run: mpirun's exit code (-11: mpirun died of SIGSEGV),
and how many of the lines the ranks wrote come back whole: under --tag-output through the
entrypoint's rejoiner (run/tagged_lines.py), under --xml decoded by position (each element's
rank and stream, its `&#NNN;` as bytes; a piece with no end tag ends at the next element),
under --output-filename read from each rank's file after the run. Then, for the files: how
long a line takes to reach its file while the rank runs (the delay a host following its
ranks' files would add), the largest of 20 lines written 0.1 s apart.
Not part of the test suite: it measures Open MPI, and quotes go to docs/reliability.md.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from entrypoint.run.tagged_lines import TaggedLines  # noqa: E402

PROBES = {
    "tag text": ("import os\nr = os.environ['OMPI_COMM_WORLD_RANK']\n"
                 "for i in range(500):\n    print(f'rank {r} line {i} hello [1,0]<stdout>: x', flush=True)\n"),
    "short lines": ("import os\nif os.environ['OMPI_COMM_WORLD_RANK'] == '0':\n"
                    "    os.write(1, b''.join(b'%03d\\n' % i for i in range(1000)))\n"),
    "accented": ("import os\nif os.environ['OMPI_COMM_WORLD_RANK'] == '0':\n"
                 "    os.write(1, 'é'.encode() * 700 + b'\\n')\n    os.write(1, b'after\\n')\n"),
}
MODES = ("--tag-output", "--xml", "--output-filename")
LATENCY_PROBE = ("import os, time\nif os.environ['OMPI_COMM_WORLD_RANK'] == '0':\n"
                 "    for i in range(20):\n        os.write(1, b'%.6f\\n' % time.time())\n        time.sleep(0.1)\n")
_ELEMENT = re.compile(rb'<(stdout|stderr)(?: rank="(\d+)")?>(.*?)(?=</\1>|<stdout|<stderr|</mpirun>|\Z)', re.S)


def build_expected(probe: str) -> list[tuple[int, bytes]]:
    """(rank, line) for every line the probe's ranks write."""
    if probe == "tag text":
        return [(r, b"rank %d line %d hello [1,0]<stdout>: x" % (r, i)) for r in (0, 1) for i in range(500)]
    if probe == "short lines":
        return [(0, b"%03d" % i) for i in range(1000)]
    return [(0, "é".encode() * 700), (0, b"after")]


def parse_tagged(out: bytes) -> list[tuple[int, bytes]]:
    lines = TaggedLines("stdout", ranks=2)
    text = lines.feed(out) + lines.flush_partial()
    found = (re.match(rb"\[\d+,(\d+)\]<stdout>:(.*)", line, re.S) for line in text.split(b"\n"))
    return [(int(m.group(1)), m.group(2)) for m in found if m]


def parse_xml(out: bytes) -> list[tuple[int, bytes]]:
    def unescape(text: bytes) -> bytes:
        text = re.sub(rb"&#(\d+);", lambda m: bytes([int(m.group(1)) & 0xFF]), text)
        return text.replace(b"&lt;", b"<").replace(b"&gt;", b">").replace(b"&amp;", b"&")

    per_rank: dict[int, bytes] = {}
    for element in _ELEMENT.finditer(out):
        if element.group(1) == b"stdout" and element.group(2) is not None:
            rank = int(element.group(2))
            per_rank[rank] = per_rank.get(rank, b"") + unescape(element.group(3))
    return [(rank, line) for rank, text in per_rank.items() for line in text.split(b"\n")]


def parse_files(folder: str) -> list[tuple[int, bytes]]:
    """Each rank's stdout file, as its daemon wrote it (nothing framed: one file per rank)."""
    found = []
    for rank in (0, 1):
        try:
            with open(os.path.join(folder, "1", f"rank.{rank}", "stdout"), "rb") as f:
                found += [(rank, line) for line in f.read().split(b"\n")]
        except FileNotFoundError:
            pass  # a rank that printed nothing has no file
    return found


def build_argv(mode: str, program: str, folder: str) -> list[str]:
    framing = ["--output-filename", f"{folder}:nocopy"] if mode == "--output-filename" else [mode]
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", *framing, "-np", "2", sys.executable, "-c", program]


def run_probe(mode: str, probe: str) -> tuple[int, list[tuple[int, bytes]]]:
    with tempfile.TemporaryDirectory() as folder:
        done = subprocess.run(build_argv(mode, PROBES[probe], folder), stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, timeout=120)
        if mode == "--output-filename":
            return done.returncode, parse_files(folder)
        return done.returncode, (parse_tagged if mode == "--tag-output" else parse_xml)(done.stdout)


def measure_file_delay() -> float:
    """The largest delay (s) between a rank's write and its line in the rank's file."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "1", "rank.0", "stdout")
        proc = subprocess.Popen(build_argv("--output-filename", LATENCY_PROBE, folder),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        seen, worst, data = 0, 0.0, b""
        while True:
            ended = proc.poll() is not None  # before the read: that read then sees every line
            if os.path.exists(path):
                with open(path, "rb") as f:
                    data = f.read()
            lines = data.split(b"\n")[:-1]
            now = time.time()
            worst = max([worst] + [now - float(line) for line in lines[seen:]])
            seen = len(lines)
            if seen >= 20 or ended:
                return worst
            time.sleep(0.001)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    print(subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout.splitlines()[0])
    for probe in PROBES:
        expected = build_expected(probe)
        for mode in MODES:
            results = []
            for _ in range(runs):
                rc, found = run_probe(mode, probe)
                got = set(found)
                results.append(f"{rc}:{sum(1 for line in expected if line in got)}")
            print(f"{probe:12} {mode:17} of {len(expected)} lines, exit:whole per run  {' '.join(results)}")
    delays = [measure_file_delay() for _ in range(runs)]
    print(f"--output-filename: a line's largest delay to its file, per run (ms)  "
          f"{' '.join(f'{d * 1000:.1f}' for d in delays)}")


if __name__ == "__main__":
    main()

"""Reads a `docker build` / `docker buildx build` output on stdin, keeps every line of it in
a log file, and prints one line per build step that actually runs, with the time since the
set-up began: a person sees how far the build is and what it does now, instead of ~350 lines
of apt and pip output. Cached steps print nothing, so a cached build stays one line long.

usage: python3 docker/build_progress.py --log FILE [--start EPOCH_SECONDS] [--prefix TEXT]

Both of Docker's output forms are read: the legacy builder's `Step N/M : INSTRUCTION`, then
` ---> Running in …` for a step that runs (` ---> Using cache` for one that does not), and
BuildKit's plain progress, `#N [stage i/n] INSTRUCTION`, then `#N CACHED` or the step's own
timestamped output lines (`#N 0.512 …`). Stdlib only: it runs with any python3."""

from __future__ import annotations

import argparse
import io
import re
import sys
import time
from typing import Iterable, Iterator

LEGACY_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
LEGACY_RUNS = re.compile(r"^ ---> Running in ")
BUILDKIT_STEP = re.compile(r"^#(\d+) \[([^\]]+)\] (.*)$")
BUILDKIT_OUTPUT = re.compile(r"^#(\d+) \d+\.\d+ ")
INSTALLER = re.compile(r"/usr/local/byoc/build/([\w.-]+)")


def describe_instruction(instruction: str) -> str:
    """`RUN /usr/local/byoc/build/install-torch.sh` → `RUN install-torch.sh`; long ones cut."""
    text = INSTALLER.sub(r"\1", instruction.strip())
    return text if len(text) <= 100 else text[:97] + "..."


def find_running_steps(lines: Iterable[str]) -> Iterator[str]:
    """The description of each step that runs, as soon as the output shows it runs."""
    legacy_pending = None  # the legacy step whose next line says whether it runs
    buildkit_steps: dict[str, str] = {}  # BuildKit's step id -> its description, until it shows output
    for line in lines:
        line = line.rstrip("\n")
        if legacy_pending is not None and LEGACY_RUNS.match(line):
            yield legacy_pending
            legacy_pending = None
            continue
        match = LEGACY_STEP.match(line)
        if match:
            number, total, instruction = match.groups()
            # Only RUN steps take time; the legacy builder also "runs" ARG, ENV and SHELL in a
            # container of their own, in an instant.
            legacy_pending = f"step {number}/{total}: {describe_instruction(instruction)}" if instruction.startswith("RUN ") else None
            continue
        match = BUILDKIT_STEP.match(line)
        if match:
            step_id, where, instruction = match.groups()
            buildkit_steps[step_id] = f"[{where}] {describe_instruction(instruction)}"
            continue
        match = BUILDKIT_OUTPUT.match(line)
        if match and match.group(1) in buildkit_steps:
            yield buildkit_steps.pop(match.group(1))


def format_elapsed(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--log", required=True, help="the file that gets every line")
    parser.add_argument("--start", type=float, default=None, help="epoch seconds the elapsed time counts from")
    parser.add_argument("--prefix", default="setup", help="the first word of each line")
    args = parser.parse_args(argv)
    start = time.time() if args.start is None else args.start

    # Bytes that are not UTF-8 (a package's output) must not end the filter, and with it the
    # build it reads from.
    stdin = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace")

    def tee(log) -> Iterator[str]:
        for line in stdin:
            log.write(line)
            log.flush()  # the log is the place to look while a long step runs
            yield line

    with open(args.log, "w", encoding="utf-8", errors="replace") as log:
        for step in find_running_steps(tee(log)):
            print(f"{args.prefix} [{format_elapsed(time.time() - start):>5}] image build {step}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

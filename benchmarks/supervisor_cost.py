"""What the entrypoint costs while a job runs: the CPU of `python -m entrypoint train` (and of
its one process, which only sleeps) over a job of N seconds, and its wall time past N (how soon
the end of the process is seen). Two checkouts, interleaved, to compare (issue 44: the run's
10 ms poll gave way to SIGCHLD on the host loop).

    .venv/bin/python benchmarks/supervisor_cost.py --seconds 10 --repeats 3 [--repo PATH ...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from support.jobtree import entrypoint_env, write_tree  # noqa: E402


def run_job(repo: str, seconds: float) -> tuple[int, float, float]:
    """(exit code, CPU s of the entrypoint and what it waited for, wall s)."""
    with tempfile.TemporaryDirectory(prefix="supervisor-cost-") as tmp:
        root = Path(tmp) / "ml"
        write_tree(root, script=f"import time\ntime.sleep({seconds})\n")
        env = entrypoint_env(root, BYOC_REPORT="0", BYOC_COMPILE_CACHE="0")
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "entrypoint", "train"], env=env, cwd=repo,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)  # the child's rusage, the processes it reaped included
        return os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime, time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--repo", action="append", help="a checkout to run (default: this one); give several to compare")
    args = parser.parse_args()
    repos = args.repo or [str(HERE.parent)]
    results: dict[str, list[tuple[float, float]]] = {r: [] for r in repos}
    for _ in range(args.repeats):
        for repo in repos:
            code, cpu, wall = run_job(repo, args.seconds)
            if code != 0:
                print(f"{repo}: exit code {code}", file=sys.stderr)
                return 1
            results[repo].append((cpu, wall))
    for repo, runs in results.items():
        cpus, walls = sorted(c for c, _ in runs), sorted(w for _, w in runs)
        print(f"{repo}: CPU {cpus[len(cpus) // 2]:.3f} s (median of {len(runs)}; {cpus[0]:.3f}-{cpus[-1]:.3f}) over a "
              f"{args.seconds:g} s job; wall past the job {walls[len(walls) // 2] - args.seconds:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

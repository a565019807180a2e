"""What a crashed rank costs a job that restarts in place (BYOC_MAX_RESTARTS=1), for every
launcher, through the real entrypoint on emulated hosts (localcluster: Linux namespaces, needs
root):

    .venv/bin/python benchmarks/crash_cost.py [--runs 3] [--only single,mpirun-1,...] [--step-s 0.05]

The job is tests/multihost/scripts/restart_job.py: 60 steps of an all-reduce (gloo under
torchrun, mpi4py under mpirun, none for one process) and --step-s of work each, a checkpoint
every 10 steps; one rank SIGKILLs itself at step 25 (the last rank: on the last host), once.

    crash cost  = the resumed attempt's first step - the kill (both written by the script)
    launcher    = its part of that: from the failure to the next attempt's processes started
                  (the job report's restarts[0].restart_s); the rest is the next attempt's own
                  start-up (interpreters, imports, the rendezvous, the checkpoint's load)
    redone      = the steps between the checkpoint it resumed from and the kill (5 here),
                  at the job's own step time
    job delta   = the whole job's wall time with the crash - without it (same launcher)

The goal (issue 45): the crash cost, beyond the redone steps, at most 10 s. Each case runs
once without the crash first, then --runs times with it; the medians are printed. Not part of
the test suite (nothing under tests/ imports it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from localcluster import EmulatedCluster  # noqa: E402
from support.multihost import job, start  # noqa: E402

# name -> (hosts, distribution)
CASES = {
    "single": (1, "none"),
    "mpirun-1": (1, "mpi"),
    "mpirun-2": (2, "mpi"),
    "torchrun-1": (1, "torch_distributed"),
    "torchrun-2": (2, "torch_distributed"),
}
STEPS, EVERY, KILL_AT = 60, 10, 25


def run_case(name: str, crash: bool, step_s: float) -> dict:
    count, distribution = CASES[name]
    hosts = [f"algo-{i + 1}" for i in range(count)]
    hps = {"steps": STEPS, "every": EVERY, "kill": "worker" if crash else "none", "kill-at": KILL_AT, "step-s": step_s}
    with EmulatedCluster(hosts, job("restart_job.py", distribution, **hps)) as cluster:
        began = time.monotonic()
        result = start(cluster, env={"BYOC_MAX_RESTARTS": "1"}).wait(timeout=300, fail_fast=False)
        wall = time.monotonic() - began
        bad = {h: r.output[-3000:] for h, r in result.results.items() if r.returncode != 0}
        if bad:
            raise SystemExit(f"{name}: the job failed: {bad}")
        model = cluster.model_dir
        figures = {"wall_s": wall}
        if crash:
            killed = float(Path(model, "killed-once").read_text())
            resumed = float(Path(model, "resumed-first-step").read_text())
            with open(os.path.join(model, "result-0.json")) as f:
                resumed_at = json.load(f)["resumed_at"]
            with open(os.path.join(cluster.opt_ml(hosts[0]), "output", "data", "report", "report.json")) as f:
                restarts = json.load(f)["restarts"]  # none where torchrun restarts its ranks itself (one host)
            launcher = restarts[0]["restart_s"] if restarts else None
            figures.update(crash_s=resumed - killed, redone_steps=KILL_AT - resumed_at, launcher_s=launcher)
        return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", default=",".join(CASES))
    parser.add_argument("--step-s", type=float, default=0.05)
    args = parser.parse_args()
    print(f"{'launcher':<12} {'crash s':>8} {'launcher s':>11} {'redone':>7} {'redone s':>9} {'job s':>7} "
          f"{'job s, no crash':>16} {'job delta s':>12}")
    for name in args.only.split(","):
        clean = run_case(name, False, args.step_s)["wall_s"]
        runs = [run_case(name, True, args.step_s) for _ in range(args.runs)]
        crash = statistics.median(r["crash_s"] for r in runs)
        launchers = [r["launcher_s"] for r in runs if r["launcher_s"] is not None]
        launcher = f"{statistics.median(launchers):.2f}" if launchers else "-"
        redone = statistics.median(r["redone_steps"] for r in runs)
        wall = statistics.median(r["wall_s"] for r in runs)
        step = clean / STEPS  # an upper bound: the clean job's wall time includes its start-up
        each = ", ".join(f"{r['crash_s']:.2f}" for r in runs)
        print(f"{name:<12} {crash:>8.2f} {launcher:>11} {redone:>7.0f} {redone * args.step_s:>9.2f} {wall:>7.2f} {clean:>16.2f} "
              f"{wall - clean:>12.2f}   (each run's crash s: {each}; step <= {step:.3f} s)")


if __name__ == "__main__":
    main()

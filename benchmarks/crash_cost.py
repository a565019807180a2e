"""What a crashed rank costs a job that restarts in place (BYOC_MAX_RESTARTS=1), for every
launcher, through the real entrypoint on emulated hosts (localcluster: Linux namespaces, needs
root):

    .venv/bin/python benchmarks/crash_cost.py [--job script|main] [--runs 3] [--only single,mpirun-1,...]

--job script (the default) is tests/multihost/scripts/restart_job.py: 60 steps of an all-reduce
(gloo under torchrun, mpi4py under mpirun, none for one process) and --step-s of work each, a
checkpoint every 10 steps; one rank SIGKILLs itself at step 25 (the last rank: on the last
host), once. --job main is the main job (jobs/main_job.py: train/'s DDP trainer under torchrun
and one process, its mpi4py trainer under mpirun, 2 ranks a host under mpirun on one host), a
checkpoint every 100 steps, a step logged each step; the benchmark SIGKILLs the last rank
once the step-150 line shows, and times the first step line after the resume as it shows.

    crash cost  = the resumed attempt's first step - the kill (both written by the script)
    launcher    = its part of that: from the failure to the next attempt's processes started
                  (the job report's restarts[0].restart_s); the rest is the next attempt's own
                  start-up (interpreters, imports, the rendezvous, the checkpoint's load)
    redone      = the steps between the checkpoint it resumed from and the kill (5 here),
                  at the job's own step time
    job delta   = the whole job's wall time with the crash - without it (same launcher)

--job script also splits the crash cost (--split): the launcher's part, then from the next
attempt's processes started to rank 0's interpreter running (the launcher's own start-up:
torchrun imports torch and forms its rendezvous, mpirun reaches its daemons), rank 0's imports,
its joining the world and reading the checkpoint, and its first step.

The goal (issue 45): the crash cost, beyond the redone steps, at most 10 s. Each case runs
once without the crash first, then --runs times with it; the medians are printed. Not part of
the test suite (nothing under tests/ imports it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
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
MAIN_EVERY, MAIN_KILL_AT = 100, 150
STEP_LINE = re.compile(r"\[metrics\] epoch=\d+ step=(\d+)")


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
            figures["split"] = build_split(result.results[hosts[0]].output, killed, resumed,
                                           restarts[0]["next_started"] if restarts else None)
        return figures


SPLIT_LINE = re.compile(r"rank 0 attempt \d+ of world \d+ resumes at step [1-9]\d* \(began ([0-9.]+), "
                        r"imported ([0-9.]+), joined ([0-9.]+)\)")


def build_split(log: str, killed: float, resumed: float, next_started: float | None) -> list[float | None]:
    """[kill -> next processes, -> rank 0 running, its imports, its join, its first step] (s)."""
    found = SPLIT_LINE.search(log)
    if found is None:
        return [None] * 5
    began, imported, joined = (float(v) for v in found.groups())
    to_start = next_started - killed if next_started is not None else None
    launch = began - next_started if next_started is not None else began - killed
    return [to_start, launch, imported - began, joined - imported, resumed - joined]


def build_main_spec(work: str, name: str):
    from jobs.main_job import DEFAULT_HYPERPARAMETERS, ENTRY_SCRIPT
    from jobs.run_main_job import write_inputs
    from localcluster.optml import Channel, JobSpec

    count, distribution = CASES[name]
    backend = "mpi4py" if distribution == "mpi" else "ddp"
    code, channels = write_inputs(work, backend)
    return JobSpec(job_name=f"crash-{name}", program=ENTRY_SCRIPT, code_dir=code,
                   channels=tuple(Channel(n, path, "application/x-npz") for n, path in channels.items()),
                   distribution=distribution, processes_per_host=2 if name == "mpirun-1" else None,
                   hyperparameters={**DEFAULT_HYPERPARAMETERS, "checkpoint_every": MAIN_EVERY, "log_every": 1})


def find_rank(cluster, host: str, rank: int) -> int | None:
    """The pid of this rank on this host, found the way the entrypoint finds its ranks
    (entrypoint/run/processes.py): the rank wrapper in the command line, or the name a rank
    torchrun forked gives itself, whose /proc environment and command line are torchrun's."""
    from entrypoint.run import processes
    from localcluster.processes import probe_namespace_members

    members = list(probe_namespace_members(cluster.init_pid(host)))
    table = processes.load_process_table()
    for pid in processes.decide_rank_pids(processes.load_cmdlines(members), table):
        label = processes.load_rank_label(pid)
        if label == str(rank) or (rank == 0 and label == f"pid {pid}"):  # one process: no RANK
            return pid
    return None


def watch_main_job(cluster, run, hosts: list[str], world: int, crash: bool) -> dict:
    """Kill the last rank at MAIN_KILL_AT (once), and time the resumed attempt's first step."""
    leader, victim_host = run.procs[hosts[0]], hosts[-1]
    killed = resumed = None
    seen = 0
    while run.exit_codes()[hosts[0]] is None:
        text = leader.output
        if crash and killed is None and f"step={MAIN_KILL_AT} " in text:
            pid = find_rank(cluster, victim_host, world - 1)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                killed, seen = time.time(), len(text)
        if killed is not None and resumed is None and "[checkpoint] resumed from" in text[seen:]:
            after = text[seen:][text[seen:].index("[checkpoint] resumed from"):]
            if STEP_LINE.search(after):
                resumed = time.time()
        time.sleep(0.01)
    return {"killed": killed, "resumed": resumed}


def run_main_case(name: str, crash: bool) -> dict:
    import tempfile

    count, _ = CASES[name]
    hosts = [f"algo-{i + 1}" for i in range(count)]
    world = 2 if name == "mpirun-1" else count  # one rank a host on CPU, but 2 under mpirun on one host
    with tempfile.TemporaryDirectory() as work, EmulatedCluster(hosts, build_main_spec(work, name)) as cluster:
        began = time.monotonic()
        run = start(cluster, env={"BYOC_MAX_RESTARTS": "1"})
        times = watch_main_job(cluster, run, hosts, world, crash)
        result = run.wait(timeout=600, fail_fast=False)
        wall = time.monotonic() - began
        bad = {h: r.output[-3000:] for h, r in result.results.items() if r.returncode != 0}
        if bad:
            raise SystemExit(f"{name}: the job failed: {bad}")
        figures = {"wall_s": wall}
        if crash:
            log = result.results[hosts[0]].output
            resumed_at = int(re.findall(r"\[checkpoint\] resumed from \S+ at step (\d+)", log)[-1])
            with open(os.path.join(cluster.opt_ml(hosts[0]), "output", "data", "report", "report.json")) as f:
                restarts = json.load(f)["restarts"]
            figures.update(crash_s=times["resumed"] - times["killed"], redone_steps=MAIN_KILL_AT - resumed_at,
                           launcher_s=restarts[0]["restart_s"] if restarts else None)
        return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", default=",".join(CASES))
    parser.add_argument("--step-s", type=float, default=0.05)
    parser.add_argument("--job", choices=("script", "main"), default="script")
    parser.add_argument("--split", action="store_true", help="--job script: where the crash's seconds go")
    args = parser.parse_args()

    def run(name: str, crash: bool) -> dict:
        return run_case(name, crash, args.step_s) if args.job == "script" else run_main_case(name, crash)

    print(f"{'launcher':<12} {'crash s':>8} {'launcher s':>11} {'redone':>7} {'redone s':>9} {'job s':>7} "
          f"{'job s, no crash':>16} {'job delta s':>12}")
    for name in args.only.split(","):
        clean = run(name, False)["wall_s"]
        runs = [run(name, True) for _ in range(args.runs)]
        crash = statistics.median(r["crash_s"] for r in runs)
        launchers = [r["launcher_s"] for r in runs if r["launcher_s"] is not None]
        launcher = f"{statistics.median(launchers):.2f}" if launchers else "-"
        redone = statistics.median(r["redone_steps"] for r in runs)
        wall = statistics.median(r["wall_s"] for r in runs)
        step = f"; step <= {clean / STEPS:.3f} s" if args.job == "script" else ""  # the wall time has the start-up
        redone_s = f"{redone * args.step_s:.2f}" if args.job == "script" else "-"
        each = ", ".join(f"{r['crash_s']:.2f}" for r in runs)
        print(f"{name:<12} {crash:>8.2f} {launcher:>11} {redone:>7.0f} {redone_s:>9} {wall:>7.2f} {clean:>16.2f} "
              f"{wall - clean:>12.2f}   (each run's crash s: {each}{step})")
        if args.split and args.job == "script":
            parts = [statistics.median(p) if (p := [r["split"][i] for r in runs if r["split"][i] is not None]) else None
                     for i in range(5)]
            names = ("to the next processes", "to rank 0 running", "its imports", "its join + checkpoint",
                     "its first step")
            print("    split (medians): " + ", ".join(f"{n} {v:.2f} s" if v is not None else f"{n} -"
                                                   for n, v in zip(names, parts)))


if __name__ == "__main__":
    main()

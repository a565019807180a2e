"""Goodput under a failure a minute (issue 52): the main job on 2 emulated hosts (localcluster:
Linux namespaces, needs root) through the real entrypoint, restarting in place, with one rank
SIGKILLed every --every-s seconds, a different rank and host each time, for at least --minutes
of training; once per launcher.

    .venv/bin/python benchmarks/goodput.py [--launchers torchrun,mpirun] [--minutes 5] [--runs 3]

The job: jobs/main_job.py (train/'s DDP trainer under torchrun, its mpi4py trainer under
mpirun), one rank a host, a model big enough that a step is a measurable time on CPU
(--hidden), a checkpoint every --checkpoint-every steps (written in the background), a step
line every step. BYOC_MAX_RESTARTS covers every failure.

Each failing run comes right after a run of the same job without a failure (--clean-steps
steps), paired as in training_scaling.py: this shared machine's speed drifts between minutes.
The clean step time is that run's steps over their time from 15 s after its first step line
to its last, as the benchmark sees them on the leader's output: past its warm-up and past the
next attempt's torchrun started ahead at 10 s (run/held.py), whose import of torch takes this
2-core machine's cores from the training for a few seconds, once a job (over 44 s, the whole
clean run read 9% slower than its steady steps). The failing runs are given enough
steps for --minutes at the first clean run's step time, and a tenth more; the first kill comes
--every-s after its first step line, each next one --every-s after the one before, at the first
step line from then on (a kill never lands in a restart).

    crash cost     = the first step line after the resume - the kill
    steps redone   = the last step line before the kill - the step the resume started from
                     (a floor: a step whose line had not reached the leader's output when the
                     rank was killed is not counted; under mpirun the resume was seen to start
                     one step past the last line seen)
    efficiency     = clean step time x the steps the job made / the training's wall time
                     (first step line to last: the job's start-up, the same with or without
                     failures, is not the failures' cost)
    efficiency, own steps = the same with the failing run's own steady step time (its steps
                     and time from 5 s after each resume to the next kill): what the failures
                     cost, whatever the machine's speed did between the two runs

Prints each run's failures, then one JSON line per launcher (medians over --runs):
{"launcher", "minutes", "failures", "efficiency", "crash_cost_median_s", "steps_redone_median"},
"efficiency_own_steps", and "efficiency_job_report" (report.json's job.efficiency, each run's:
the job's own figure of the same share, from its ranks' step figures).
Not part of the test suite (nothing under tests/ imports it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))

from crash_cost import find_rank  # noqa: E402
from localcluster import EmulatedCluster  # noqa: E402
from support.multihost import start  # noqa: E402

HOSTS = ["algo-1", "algo-2"]
LAUNCHERS = {"torchrun": ("ddp", "torch_distributed"), "mpirun": ("mpi4py", "mpi")}
STEP_LINE = re.compile(r"\[metrics\] epoch=\d+ step=(\d+)")
RESUMED = re.compile(r"\[checkpoint\] resumed from \S+ at step (\d+)")


def build_spec(work: str, launcher: str, steps: int, args) -> object:
    from jobs.main_job import DEFAULT_HYPERPARAMETERS, ENTRY_SCRIPT
    from jobs.run_main_job import write_inputs
    from localcluster.optml import Channel, JobSpec

    backend, distribution = LAUNCHERS[launcher]
    code, channels = write_inputs(work, backend)
    hps = {**DEFAULT_HYPERPARAMETERS, "epochs": 100000, "max_steps": steps, "log_every": 1,
           "checkpoint_every": args.checkpoint_every, "hidden_sizes": [args.hidden, args.hidden],
           "batch_size": args.batch_size, "warmup_epochs": 0.0}
    return JobSpec(job_name=f"goodput-{launcher}", program=ENTRY_SCRIPT, code_dir=code,
                   channels=tuple(Channel(n, path, "application/x-npz") for n, path in channels.items()),
                   distribution=distribution, hyperparameters=hps)


class Watch:
    """The leader's output as it grows: each new step line's step and when it was seen."""

    def __init__(self, proc) -> None:
        self.proc, self.seen, self.steps = proc, 0, []  # seen: lines read; steps: [(step, time seen)]
        self.resumes: list[tuple[int, float, int]] = []  # (step resumed from, time seen, index in steps)

    def read(self) -> None:
        new = self.proc.lines_from(self.seen)  # only the new lines, not a copy of the whole output
        if not new:  # every 10 ms (under 1% of a core by a 5-minute job's end, but growing)
            return
        now, self.seen = time.time(), self.seen + len(new)
        for line in new:
            if (found := STEP_LINE.search(line)) is not None:
                self.steps.append((int(found.group(1)), now))
            elif (found := RESUMED.search(line)) is not None:
                self.resumes.append((int(found.group(1)), now, len(self.steps)))


def run_job(launcher: str, steps: int, every_s: float | None, args) -> dict:
    """One job to its end; with every_s, a rank killed every every_s seconds of training."""
    with tempfile.TemporaryDirectory() as work, \
            EmulatedCluster(HOSTS, build_spec(work, launcher, steps, args)) as cluster:
        run = start(cluster, env={"BYOC_MAX_RESTARTS": str(args.max_restarts)})
        watch, kills = Watch(run.procs[HOSTS[0]]), []
        next_kill = None
        while run.exit_codes()[HOSTS[0]] is None:
            watch.read()
            if every_s is not None and watch.steps:
                next_kill = next_kill or watch.steps[0][1] + every_s
                resumed = not kills or any(r[2] < len(watch.steps) and r[1] > kills[-1]["at"]
                                           for r in watch.resumes)
                if time.time() >= next_kill and resumed:
                    rank = len(kills) % len(HOSTS)  # one rank a host: rank r runs on HOSTS[r]
                    pid = find_rank(cluster, HOSTS[rank], rank)
                    if pid is not None:
                        os.kill(pid, signal.SIGKILL)
                        kills.append({"at": time.time(), "rank": rank, "host": HOSTS[rank],
                                      "step": watch.steps[-1][0]})
                        next_kill = kills[-1]["at"] + every_s
            time.sleep(0.01)
        result = run.wait(timeout=600, fail_fast=False)
        watch.read()
        bad = {h: r.output[-3000:] for h, r in result.results.items() if r.returncode != 0}
        if bad:
            raise SystemExit(f"{launcher}: the job failed: {bad}")
        folder = os.path.join(cluster.opt_ml(HOSTS[0]), "output", "data", "report")
        with open(os.path.join(folder, "report.json")) as f:
            report = json.load(f)
        if every_s is not None and args.keep_report:  # the last failing run's report, to look at
            import shutil

            shutil.copytree(folder, os.path.join(args.keep_report, launcher), dirs_exist_ok=True)
        return {"steps": watch.steps, "resumes": watch.resumes, "kills": kills, "restarts": report.get("restarts", []),
                "report_efficiency": (report.get("job") or {}).get("efficiency")}


def measure_failures(job: dict) -> list[dict]:
    """Each kill's crash cost and steps redone, from the resume that followed it."""
    failures = []
    for kill in job["kills"]:
        resume = next((r for r in job["resumes"] if r[1] >= kill["at"]), None)
        if resume is None:
            raise SystemExit(f"no resume seen after the kill at step {kill['step']}")
        first = next((t for s, t in job["steps"][resume[2]:]), None)
        failures.append({**kill, "resumed_from": resume[0], "crash_cost_s": first - kill["at"],
                         "steps_redone": max(0, kill["step"] - resume[0])})
    return failures


def training_span(job: dict) -> tuple[int, float]:
    """(the steps the job made, its training's wall time): first step line to last."""
    (first_step, first_at), (last_step, last_at) = job["steps"][0], job["steps"][-1]
    return last_step - first_step, last_at - first_at


STEADY_AFTER_S = 5.0  # after a resume's first step line, the steps are steady again


def steady_windows(job: dict) -> list[tuple[int, float]]:
    """Each attempt's steady stretch, (steps, seconds): from 5 s after the start and after each
    resume, up to the next kill (or the end). Attempt by attempt, they tell a slowdown that
    comes with the restarts (the later attempts' ranks, forked from a torchrun started ahead)
    from the machine's drift (every attempt alike)."""
    ends = [k["at"] for k in job["kills"]] + [float("inf")]
    starts = [job["steps"][0][1]] + [r[1] for r in job["resumes"]]
    windows = []
    for begin, end in zip(starts, ends):
        window = [(s, t) for s, t in job["steps"] if begin + STEADY_AFTER_S <= t < end]
        if len(window) > 1:
            windows.append((window[-1][0] - window[0][0], window[-1][1] - window[0][1]))
    return windows


def steady_step_s(job: dict) -> float:
    """The failing run's own step time: its steady stretches' steps over their time."""
    windows = steady_windows(job)
    return sum(t for _, t in windows) / sum(s for s, _ in windows)


CLEAN_AFTER_S = 15.0  # a clean run's steps counted from this long after its first step line


def clean_step_s(job: dict) -> tuple[float, int, float]:
    """(the clean run's step time, the steps and seconds it is taken over)."""
    after = [(s, t) for s, t in job["steps"] if t >= job["steps"][0][1] + CLEAN_AFTER_S]
    made, span = after[-1][0] - after[0][0], after[-1][1] - after[0][1]
    return span / made, made, span


def run_launcher(launcher: str, args) -> dict:
    runs, steps = [], None
    for i in range(args.runs):
        step_s, made, span = clean_step_s(run_job(launcher, args.clean_steps, None, args))
        steps = steps or math.ceil(args.minutes * 60 / step_s * 1.1)
        print(f"{launcher}: run {i + 1}'s clean step {step_s * 1000:.1f} ms ({made} steps in {span:.1f} s); "
              f"the failing runs make {steps} steps", flush=True)
        job = run_job(launcher, steps, args.every_s, args)
        failures = measure_failures(job)
        made, span = training_span(job)
        efficiency, own = step_s * made / span, steady_step_s(job) * made / span
        print(f"  run {i + 1}: the steady step attempt by attempt, ms: "
              + ", ".join(f"{t * 1000 / n:.1f}" for n, t in steady_windows(job) if n), flush=True)
        for f in failures:
            print(f"  run {i + 1}: rank {f['rank']} on {f['host']} killed at step {f['step']}, resumed from "
                  f"{f['resumed_from']}: crash cost {f['crash_cost_s']:.2f} s, {f['steps_redone']} steps redone",
                  flush=True)
        launcher_s = [r.get("restart_s") for r in job["restarts"] if r.get("restart_s") is not None]
        print(f"  run {i + 1}: {span / 60:.2f} min, {len(failures)} failures, efficiency {efficiency:.4f} "
              f"(own steps {own:.4f}; the job report's {job['report_efficiency']})"
              + (f", the launcher's part {statistics.median(launcher_s):.2f} s (median)" if launcher_s else ""),
              flush=True)
        runs.append({"minutes": span / 60, "failures": len(failures), "efficiency": efficiency, "own": own,
                     "report": job["report_efficiency"],
                     "crash": statistics.median(f["crash_cost_s"] for f in failures),
                     "redone": statistics.median(f["steps_redone"] for f in failures)})
    return {"launcher": launcher,
            "minutes": round(statistics.median(r["minutes"] for r in runs), 2),
            "failures": statistics.median(r["failures"] for r in runs),
            "efficiency": round(statistics.median(r["efficiency"] for r in runs), 4),
            "crash_cost_median_s": round(statistics.median(r["crash"] for r in runs), 2),
            "steps_redone_median": statistics.median(r["redone"] for r in runs),
            "efficiency_own_steps": round(statistics.median(r["own"] for r in runs), 4),
            "efficiency_job_report": [r["report"] for r in runs]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--launchers", default=",".join(LAUNCHERS))
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--every-s", type=float, default=60.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--clean-steps", type=int, default=1500)
    parser.add_argument("--checkpoint-every", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--max-restarts", type=int, default=50)
    parser.add_argument("--keep-report", default="", help="a folder: the last failing run's job report, a launcher a folder")
    args = parser.parse_args()
    lines = [run_launcher(name, args) for name in args.launchers.split(",")]
    for line in lines:
        print(json.dumps(line))


if __name__ == "__main__":
    main()

"""What train/'s checkpoints cost the training loop: step time with checkpoints off, at the
default interval (checkpoint_every 100) and at a short one (10), written synchronously
(--checkpoint_background false: the training waits for each write) and in the background
(the default: the step's state is copied, a writer thread serializes, fsyncs and renames).

    .venv/bin/python benchmarks/checkpoint_cost.py [--ranks 1,2] [--batch-size 512] [--steps 1000]
        [--intervals 100,10] [--hidden-sizes "[256, 256]"] [--repeats 5] [--json out.json]

The main job's model and data (the digits MLP, the training images repeated so that no epoch
ends inside a run), DDP under torchrun, one thread per rank, the checkpoint folder under a
temporary folder on this machine's disk. For each configuration:
  - step ms: a run's mean step time: its [metrics] windows' time summed (every window but the
    first, which holds the start-up) over their steps; checkpoints are inside those windows.
    Median and best of the repeats (the configurations of one repeat run back to back);
  - overhead, end to end: the step time over the run without checkpoints of the same repeat,
    minus 1 (median of the repeats), and best over best. It holds every cost, the writer
    thread's use of the cores included, but also this shared machine's noise (often more than
    the effect measured: read it with the next two);
  - training thread: what each "[checkpoint] saved" line says the training thread spent on
    that checkpoint (the copy and hand-over; in the synchronous mode the whole write; a wait
    for the previous write), summed over the run's training time: the direct cost, precise;
  - writer CPU: the writer thread's CPU time (its lines say it), summed over the training
    time: what it can take from the training at most, when no core is free for it (every
    core runs a rank, as with 2 ranks here: each rank is bound to one core, its writer too).
    With a spare core (1 rank here; a GPU host) it takes nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile

from jobs.main_job import build_job_files, load_digits_split, write_job
from training_scaling import build_tiled_split  # this folder is on the path (run as a script)

PYTHON = sys.executable
METRICS = re.compile(r"\[metrics\] epoch=\d+ step=(\d+) .*samples_per_sec=([0-9.eE+]+)")
SAVED = re.compile(r"\[checkpoint\] saved step \d+ .*\(took ([0-9.]+) ms on the training thread(?:; written in [0-9.]+ ms, ([0-9.]+) ms of CPU)?")
WAITED = re.compile(r"\[checkpoint\] step \d+ waited ")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_configs(intervals: list[int]) -> dict[str, list[str]]:
    """name -> the trainer's checkpoint arguments; "off" first (every other is measured against it)."""
    configs = {"off": ["--checkpoint_every", "0"]}
    for every in intervals:
        configs[f"every {every}, sync"] = ["--checkpoint_every", str(every), "--checkpoint_background", "false"]
        configs[f"every {every}, background"] = ["--checkpoint_every", str(every)]
    return configs


def parse_run(stdout: str, global_batch: int) -> dict:
    """The run's training time and steps (every [metrics] window but the first), and its
    checkpoints' time on the training thread."""
    windows = [(int(step), float(rate)) for step, rate in METRICS.findall(stdout)]
    if len(windows) < 3:
        raise RuntimeError(f"too few metric windows in:\n{stdout[-3000:]}")
    seconds = sum((step - previous) * global_batch / rate
                  for (previous, _), (step, rate) in zip(windows, windows[1:]))
    steps = windows[-1][0] - windows[0][0]
    saved = SAVED.findall(stdout)
    took_ms = [float(ms) for ms, _ in saved]
    writer_cpu_ms = [float(cpu) for _, cpu in saved if cpu]
    return {"step_ms": 1000 * seconds / steps, "train_s": seconds, "checkpoints": len(took_ms),
            "checkpoint_ms": took_ms, "on_training_thread_s": sum(took_ms) / 1000,
            "writer_cpu_ms": writer_cpu_ms, "writer_cpu_s": sum(writer_cpu_ms) / 1000,
            "waited": len(WAITED.findall(stdout))}


def run_once(ranks: int, args: list[str], root: str) -> str:
    shutil.rmtree(os.path.join(root, "checkpoints"), ignore_errors=True)
    shutil.rmtree(os.path.join(root, "model"), ignore_errors=True)
    argv = [PYTHON, "-m", "torch.distributed.run", "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
            "--nproc_per_node", str(ranks), "-m", "train.ddp_train", *args]
    env = {**os.environ, "SAGEMAKER_BASE_DIR": root, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    if result.returncode:
        raise RuntimeError(f"{argv} failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
    return result.stdout


def summarize(runs: dict[str, list[dict]]) -> dict:
    off = runs["off"]
    best_off = min(run["step_ms"] for run in off)
    summary = {}
    for name, samples in runs.items():
        per_checkpoint = [ms for run in samples for ms in run["checkpoint_ms"]]
        writer_cpu = [ms for run in samples for ms in run["writer_cpu_ms"]]
        summary[name] = {
            "step_ms_median": statistics.median(run["step_ms"] for run in samples),
            "step_ms_best": min(run["step_ms"] for run in samples),
            "overhead_paired_median": statistics.median(
                run["step_ms"] / base["step_ms"] - 1 for run, base in zip(samples, off)),
            "overhead_best": min(run["step_ms"] for run in samples) / best_off - 1,
            "training_thread_share": statistics.median(run["on_training_thread_s"] / run["train_s"] for run in samples),
            "writer_cpu_share": statistics.median(run["writer_cpu_s"] / run["train_s"] for run in samples),
            "checkpoint_ms_median": statistics.median(per_checkpoint) if per_checkpoint else None,
            "writer_cpu_ms_median": statistics.median(writer_cpu) if writer_cpu else None,
            "checkpoints_per_run": statistics.median(run["checkpoints"] for run in samples),
            "waited_per_run": statistics.median(run["waited"] for run in samples),
        }
    return summary


def print_summary(label: str, summary: dict) -> None:
    print(f"\n{label}")
    print(f"  {'configuration':<22} {'step ms':>8} {'best':>7} {'paired':>8} {'best':>7} {'training':>9}"
          f" {'writer':>7} {'ms/ckpt':>8} {'writer':>7} {'waited':>7}")
    print(f"  {'':<22} {'median':>8} {'':>7} {'overhead':>8} {'vs best':>7} {'thread':>9}"
          f" {'CPU':>7} {'training':>8} {'CPU ms':>7}")
    for name, s in summary.items():
        per = "" if s["checkpoint_ms_median"] is None else f"{s['checkpoint_ms_median']:.2f}"
        cpu = "" if s["writer_cpu_ms_median"] is None else f"{s['writer_cpu_ms_median']:.2f}"
        print(f"  {name:<22} {s['step_ms_median']:>8.3f} {s['step_ms_best']:>7.3f}"
              f" {100 * s['overhead_paired_median']:>7.2f}% {100 * s['overhead_best']:>6.2f}%"
              f" {100 * s['training_thread_share']:>8.3f}% {100 * s['writer_cpu_share']:>6.3f}%"
              f" {per:>8} {cpu:>7} {s['waited_per_run']:>7g}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="1,2", help="ranks per run, comma-separated")
    parser.add_argument("--batch-size", type=int, default=512, help="per rank")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--intervals", default="100,10", help="checkpoint_every values, comma-separated")
    parser.add_argument("--hidden-sizes", default="[256, 256]")
    parser.add_argument("--optimizer", default="sgd")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    rank_counts = [int(r) for r in args.ranks.split(",") if r]
    intervals = [int(i) for i in args.intervals.split(",") if i]
    if not rank_counts or min(rank_counts) < 1 or not intervals or min(intervals) < 1:
        parser.error("--ranks and --intervals: positive integers, e.g. 1,2")
    configs = build_configs(intervals)
    root = tempfile.mkdtemp(prefix="byoc-bench-checkpoint-")
    results: dict = {"args": vars(args), "cpu_count": os.cpu_count(), "ranks": {}}
    try:
        split = build_tiled_split(load_digits_split(), max(rank_counts) * args.batch_size * (args.steps + 1))
        write_job(root, build_job_files("ddp", split=split))
        common = ["--batch_size", str(args.batch_size), "--max_steps", str(args.steps), "--epochs", "1",
                  "--log_every", str(args.log_every), "--warmup_epochs", "0", "--hidden_sizes", args.hidden_sizes,
                  "--optimizer", args.optimizer, "--hang_timeout_s", "0"]
        for ranks in rank_counts:
            runs: dict[str, list[dict]] = {name: [] for name in configs}
            for repeat in range(args.repeats):
                for name, extra in configs.items():
                    runs[name].append(parse_run(run_once(ranks, common + extra, root), ranks * args.batch_size))
                    print(f"{ranks} rank(s), repeat {repeat + 1}/{args.repeats}, {name}: "
                          f"{runs[name][-1]['step_ms']:.3f} ms/step", flush=True)
            summary = summarize(runs)
            results["ranks"][str(ranks)] = {"runs": runs, "summary": summary}
            print_summary(f"{ranks} rank(s), per-rank batch {args.batch_size}, hidden {args.hidden_sizes},"
                          f" median of {args.repeats} (overhead paired by repeat):", summary)
        checkpoint = os.path.join(root, "checkpoints", "checkpoint.pt")
        results["checkpoint_bytes"] = os.path.getsize(checkpoint) if os.path.exists(checkpoint) else None
    finally:
        shutil.rmtree(root, ignore_errors=True)
    results["load_average_1min_at_end"] = os.getloadavg()[0]
    print(f"\ncheckpoint file: {results['checkpoint_bytes']} bytes; load average (1 min) at the end:"
          f" {results['load_average_1min_at_end']:.2f} on {os.cpu_count()} cores")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Scaling of the trainers on this machine, with the default model (the digits MLP).

Measures, one thread per rank, for each per-rank batch size:
  - data-parallel scaling efficiency: DDP throughput with 2 ranks / (2 x throughput with 1 rank),
    the per-rank batch fixed (weak scaling, as in the large-minibatch recipe); goal >= 0.90;
  - the step time of the mpi4py and Horovod trainers relative to DDP with 2 ranks
    (goals <= 1.10x and <= 1.25x);
  - with --compare-unbound, DDP with 2 ranks and --cpu_binding none (what the trainers did
    before ranks were bound to their own cores).

    .venv/bin/python benchmarks/training_scaling.py [--batch-sizes 512,1024,2048] [--steps 200]
        [--repeats 3] [--compare-unbound] [--json out.json]

The training channel is the 1,437 digits training images repeated (in a shuffled order) until
two ranks have at least four global batches of the largest size: the model and the arithmetic
are the main job's, and per-rank batches are not capped by the size of the data set. Each
configuration runs --repeats times, interleaved; the median and the best run are reported. A
run's throughput is the median of its [metrics] windows, leaving out the first (start-up)
and the last (often a shorter window).
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

import numpy as np

from jobs.main_job import DigitsSplit, build_job_files, load_digits_split, write_job
from train.records import Table

PYTHON = sys.executable
THROUGHPUT = re.compile(r"\[metrics\] .*samples_per_sec=([0-9.eE+]+)")
RANKS = {"ddp-1": 1, "ddp-2": 2, "ddp-2-unbound": 2, "mpi4py-2": 2, "horovod-2": 2}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_runs(args_common: list[str], compare_unbound: bool) -> dict[str, list[str]]:
    mpirun = [shutil.which("mpirun") or "mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
              "-np", "2", "-x", "PATH", "-x", "SAGEMAKER_BASE_DIR", "-x", "OMP_NUM_THREADS"]
    torchrun = [PYTHON, "-m", "torch.distributed.run", "--master_addr", "127.0.0.1", "--master_port", "{port}"]
    runs = {
        "ddp-1": [*torchrun, "--nproc_per_node", "1", "-m", "train.ddp_train", *args_common],
        "ddp-2": [*torchrun, "--nproc_per_node", "2", "-m", "train.ddp_train", *args_common],
    }
    if compare_unbound:
        runs["ddp-2-unbound"] = [*runs["ddp-2"], "--cpu_binding", "none"]
    if shutil.which("mpirun") is None:
        print("mpirun is not installed: skipping mpi4py and Horovod (apt-get install openmpi-bin)", file=sys.stderr)
        return runs
    runs["mpi4py-2"] = [*mpirun, PYTHON, "-m", "train.mpi_train", *args_common]
    try:
        import horovod  # noqa: F401

        runs["horovod-2"] = [*mpirun, PYTHON, "-m", "train.horovod_train", *args_common]
    except ImportError:
        print("horovod is not installed: skipping it (see scripts/build-horovod-wheel.sh)", file=sys.stderr)
    return runs


def build_tiled_split(split: DigitsSplit, min_records: int, seed: int = 0) -> DigitsSplit:
    """The training images repeated until there are at least `min_records` of them."""
    copies = max(1, -(-min_records // len(split.train)))
    order = np.random.default_rng(seed).permutation(copies * len(split.train)) % len(split.train)
    return DigitsSplit(Table(split.train.x[order], split.train.y[order]), split.validation)


def run_once(argv: list[str], root: str) -> float:
    shutil.rmtree(os.path.join(root, "checkpoints"), ignore_errors=True)
    env = {**os.environ, "SAGEMAKER_BASE_DIR": root, "OMP_NUM_THREADS": "1"}
    argv = [a.replace("{port}", str(free_port())) for a in argv]
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    if result.returncode:
        raise RuntimeError(f"{argv} failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
    windows = [float(m.group(1)) for m in THROUGHPUT.finditer(result.stdout)]
    if len(windows) < 3:
        raise RuntimeError(f"too few metric windows in:\n{result.stdout}")
    return statistics.median(windows[1:-1] if len(windows) > 3 else windows[1:])


def build_paired_efficiency(samples: dict[str, list[float]], name: str) -> float:
    """The median over repeats of (2-rank run) / (2 x the 1-rank run of the same repeat): runs
    of one repeat are back to back, so a machine that drifts between repeats (a shared host)
    moves both sides of each ratio alike."""
    return statistics.median(two / (2 * one) for two, one in zip(samples[name], samples["ddp-1"]))


def summarize(samples: dict[str, list[float]], batch_size: int, pick) -> dict:
    throughput = {name: pick(values) for name, values in samples.items()}
    step_ms = {name: 1000 * batch_size * RANKS[name] / throughput[name] for name in samples}
    # One rank does the same arithmetic whatever the trainer: ddp-1 is every trainer's base.
    efficiency = {name: throughput[name] / (2 * throughput["ddp-1"]) for name in samples if RANKS[name] == 2}
    summary = {"throughput_samples_per_s": throughput, "step_ms": step_ms, "scaling_efficiency": efficiency}
    for trainer in ("mpi4py", "horovod"):
        if f"{trainer}-2" in step_ms:
            summary[f"{trainer}_step_vs_ddp"] = step_ms[f"{trainer}-2"] / step_ms["ddp-2"]
    return summary


def print_summary(label: str, summary: dict) -> None:
    print(f"\n{label}")
    print(f"  {'run':<14} {'samples/s':>10} {'step ms':>8} {'scaling':>8}")
    for name, value in summary["throughput_samples_per_s"].items():
        efficiency = summary["scaling_efficiency"].get(name)
        print(f"  {name:<14} {value:>10,.0f} {summary['step_ms'][name]:>8.2f} "
              f"{'' if efficiency is None else f'{efficiency:.3f}':>8}")
    print(f"  DDP scaling efficiency (2 ranks vs 1): {summary['scaling_efficiency']['ddp-2']:.3f}  (goal >= 0.90)")
    if "mpi4py_step_vs_ddp" in summary:
        print(f"  mpi4py step / DDP step:             {summary['mpi4py_step_vs_ddp']:.3f}  (goal <= 1.10)")
    if "horovod_step_vs_ddp" in summary:
        print(f"  Horovod step / DDP step:            {summary['horovod_step_vs_ddp']:.3f}  (goal <= 1.25)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-sizes", default="512,1024,2048", help="per rank, comma-separated")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compare-unbound", action="store_true",
                        help="also run DDP with 2 ranks and --cpu_binding none")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b]
    if not batch_sizes or min(batch_sizes) < 1:
        parser.error("--batch-sizes: positive integers, e.g. 512,1024")
    root = tempfile.mkdtemp(prefix="byoc-bench-")
    results: dict = {"steps": args.steps, "repeats": args.repeats, "cpu_count": os.cpu_count(), "batch_sizes": {}}
    try:
        split = build_tiled_split(load_digits_split(), 2 * 4 * max(batch_sizes))
        write_job(root, build_job_files("ddp", split=split))
        print(f"training records: {len(split.train):,} (the digits training set repeated)", flush=True)
        for batch_size in batch_sizes:
            common = ["--batch_size", str(batch_size), "--max_steps", str(args.steps), "--epochs", "100000",
                      "--log_every", str(max(1, args.steps // 10)), "--checkpoint_every", "0",
                      "--warmup_epochs", "0"]
            runs = build_runs(common, args.compare_unbound)
            samples: dict[str, list[float]] = {name: [] for name in runs}
            for repeat in range(args.repeats):
                for name, run_argv in runs.items():
                    samples[name].append(run_once(run_argv, root))
                    print(f"batch {batch_size} repeat {repeat + 1}/{args.repeats} {name}: "
                          f"{samples[name][-1]:,.0f} samples/s", flush=True)
            entry = {"samples": samples}
            # "median" is the typical run; "best" the least disturbed one (on a shared machine a
            # 2-rank run needs both cores while a 1-rank run needs one).
            for label, pick in (("median", statistics.median), ("best", max)):
                entry[label] = summarize(samples, batch_size, pick)
                print_summary(f"per-rank batch {batch_size}, {label} of {args.repeats} runs:", entry[label])
            entry["paired_scaling_efficiency"] = {name: build_paired_efficiency(samples, name)
                                                  for name in samples if RANKS[name] == 2}
            print(f"\nper-rank batch {batch_size}, scaling efficiency paired by repeat (median): " + ", ".join(
                f"{name} {value:.3f}" for name, value in entry["paired_scaling_efficiency"].items()))
            results["batch_sizes"][str(batch_size)] = entry
    finally:
        shutil.rmtree(root, ignore_errors=True)
    results["load_average_1min_at_end"] = os.getloadavg()[0]
    print(f"\nload average (1 min) at the end: {results['load_average_1min_at_end']:.2f} on {os.cpu_count()} cores")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

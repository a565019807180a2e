"""Scaling of the trainers on this machine, with the default model (the digits MLP).

Measures, one thread per rank:
  - data-parallel scaling efficiency: DDP throughput with 2 ranks / (2 x throughput with 1 rank),
    the per-rank batch fixed (weak scaling, as in the large-minibatch recipe); goal >= 0.90;
  - the step time of the mpi4py and Horovod trainers relative to DDP with 2 ranks
    (goals <= 1.10x and <= 1.25x).

    .venv/bin/python benchmarks/training_scaling.py [--batch-size 512] [--steps 200] [--repeats 5] [--json out.json]

Each configuration runs --repeats times, interleaved; the median and the best run are both
reported. A run's throughput is the median of its [metrics] windows, leaving out the first
(start-up) and the last (often a shorter window).
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

from train.main_job import build_job_files, write_job

PYTHON = sys.executable
THROUGHPUT = re.compile(r"\[metrics\] .*samples_per_sec=([0-9.eE+]+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_runs(args_common: list[str]) -> dict[str, list[str]]:
    mpirun = [shutil.which("mpirun") or "mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
              "-np", "2", "-x", "PATH", "-x", "SAGEMAKER_BASE_DIR", "-x", "OMP_NUM_THREADS"]
    torchrun = [PYTHON, "-m", "torch.distributed.run", "--master_addr", "127.0.0.1"]
    runs = {
        "ddp-1": [*torchrun, "--nproc_per_node", "1", "--master_port", "{port}", "-m", "train.ddp_train", *args_common],
        "ddp-2": [*torchrun, "--nproc_per_node", "2", "--master_port", "{port}", "-m", "train.ddp_train", *args_common],
        "mpi4py-2": [*mpirun, PYTHON, "-m", "train.mpi_train", *args_common],
    }
    try:
        import horovod  # noqa: F401

        runs["horovod-2"] = [*mpirun, PYTHON, "-m", "train.horovod_train", *args_common]
    except ImportError:
        print("horovod is not installed: skipping it (see scripts/build-horovod-wheel.sh)", file=sys.stderr)
    return runs


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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=512,
                        help="per rank; at most 718 (two ranks need one full global batch of the 1,437 digits)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    root = tempfile.mkdtemp(prefix="byoc-bench-")
    try:
        write_job(root, build_job_files("ddp"))
        common = ["--batch_size", str(args.batch_size), "--max_steps", str(args.steps), "--epochs", "100000",
                  "--log_every", str(max(1, args.steps // 10)), "--checkpoint_every", "0", "--warmup_epochs", "0"]
        runs = build_runs(common)
        samples: dict[str, list[float]] = {name: [] for name in runs}
        for repeat in range(args.repeats):
            for name, run_argv in runs.items():
                samples[name].append(run_once(run_argv, root))
                print(f"repeat {repeat + 1}/{args.repeats} {name}: {samples[name][-1]:,.0f} samples/s", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    global_batch = {name: args.batch_size * int(name.rsplit("-", 1)[1]) for name in runs}
    results = {"batch_size_per_rank": args.batch_size, "steps": args.steps, "repeats": args.repeats,
               "load_average_1min_at_end": os.getloadavg()[0], "samples": samples}
    # "median" is the typical run; "best" the least disturbed one (this machine is shared, and a
    # 2-rank run needs both cores while a 1-rank run needs one).
    for summary, pick in (("median", statistics.median), ("best", max)):
        throughput = {name: pick(values) for name, values in samples.items()}
        step_ms = {name: 1000 * global_batch[name] / throughput[name] for name in runs}
        # One rank does the same arithmetic whatever the trainer: ddp-1 is every trainer's base.
        ratios = {"scaling_efficiency": throughput["ddp-2"] / (2 * throughput["ddp-1"]),
                  **{f"scaling_efficiency_{name[:-2]}": throughput[name] / (2 * throughput["ddp-1"])
                     for name in runs if name.endswith("-2") and name != "ddp-2"},
                  "mpi4py_step_vs_ddp": step_ms["mpi4py-2"] / step_ms["ddp-2"]}
        if "horovod-2" in step_ms:
            ratios["horovod_step_vs_ddp"] = step_ms["horovod-2"] / step_ms["ddp-2"]
        results[summary] = {"throughput_samples_per_s": throughput, "step_ms": step_ms, **ratios}
        print(f"\n{summary} of {args.repeats} runs, per-rank batch {args.batch_size}:")
        print(f"{'run':<10} {'samples/s':>10} {'step ms':>8}")
        for name in runs:
            print(f"{name:<10} {throughput[name]:>10,.0f} {step_ms[name]:>8.2f}")
        print(f"scaling efficiency (2 ranks vs 1): {ratios['scaling_efficiency']:.3f}  (goal >= 0.90)")
        for name in runs:
            if f"scaling_efficiency_{name[:-2]}" in ratios:
                print(f"  the same for {name[:-2]:<8}            {ratios[f'scaling_efficiency_{name[:-2]}']:.3f}")
        print(f"mpi4py step / DDP step:            {ratios['mpi4py_step_vs_ddp']:.3f}  (goal <= 1.10)")
        if "horovod_step_vs_ddp" in ratios:
            print(f"Horovod step / DDP step:           {ratios['horovod_step_vs_ddp']:.3f}  (goal <= 1.25)")
    print(f"\nload average (1 min) at the end: {results['load_average_1min_at_end']:.2f} on {os.cpu_count()} cores")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

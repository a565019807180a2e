"""Threads per rank (issue 38): the main job's backends in SageMaker local mode, before and
after, in one run; and a plain BYOC script under mpirun with 2 processes on one host.

    .venv/bin/python benchmarks/threads.py [--backends ddp,horovod,mpi4py] [--repeats 1]
        [--epochs 20] [--only localmode|plain] [--configs before,no-budget,after] [--json out.json]

Every configuration is the same image and code; what differs is the job's environment (the
estimator's `environment=`), which the plan never overrides:
- before: OMP_NUM_THREADS=<cores> (torch's own default: every core), GOMP_SPINCOUNT=300000
  (GNU OpenMP's default spin before an idle thread sleeps), OMPI_MCA_mpi_yield_when_idle=0
  (Open MPI's default: spin in every wait): the image as it was before issue 38;
- no-budget: OMP_NUM_THREADS=<cores>: the trainers' own fixes, without the plan's budget;
- after: nothing set: the plan's budget (docs/using.md, "Threads per process") and the fixes.

Local mode: the main job (jobs/main_job.py: the digits MLP, 20 epochs, batch 32) on 2 hosts,
1 process each, through the real SDK v2 fit() (tests/localmode/harness.py) with the image
$BYOC_IMAGE_TAG (default byoc-training:cpu-local; build it first: scripts/build-local-image.sh).
Reported: fit()'s wall seconds and the median of the ranks' [metrics] samples/s (all ranks).

Plain: a user's own mpi4py + torch script (no train/ package: blocking Allreduce of every
gradient, default threads) through `python -m entrypoint train` on this host with
sagemaker_mpi_enabled and 2 processes per host; it prints its steps per second.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from jobs.main_job import BACKENDS, DEFAULT_HYPERPARAMETERS, build_job_files, write_job  # noqa: E402
from support.jobtree import entrypoint_env, write_tree  # noqa: E402

CORES = len(os.sched_getaffinity(0))
CONFIGS = {
    "before": {"OMP_NUM_THREADS": str(CORES), "GOMP_SPINCOUNT": "300000", "OMPI_MCA_mpi_yield_when_idle": "0"},
    "no-budget": {"OMP_NUM_THREADS": str(CORES)},
    "after": {},
}
THROUGHPUT = re.compile(r"\[metrics\] .*samples_per_sec=([0-9.eE+]+)")
STEPS = re.compile(r"\[bench\] steps_per_sec=([0-9.]+)")

PLAIN_SCRIPT = """\
import os, sys, time
import torch
from mpi4py import MPI

comm = MPI.COMM_WORLD
steps = int(sys.argv[sys.argv.index("--steps") + 1])
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                            torch.nn.ReLU(), torch.nn.Linear(256, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
for step in range(steps + 50):
    if step == 50:
        comm.Barrier()
        start = time.perf_counter()
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    for p in model.parameters():
        comm.Allreduce(MPI.IN_PLACE, p.grad.numpy())
        p.grad /= comm.Get_size()
    optimizer.step()
elapsed = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
if comm.Get_rank() == 0:
    print(f"[bench] steps_per_sec={steps / elapsed:.1f} threads={torch.get_num_threads()}", flush=True)
"""


def run_localmode(backend: str, config: str, epochs: int, work: Path) -> dict:
    from localmode.harness import run_v2_job

    files = build_job_files(backend, 1, overrides={"epochs": epochs})
    root = work / f"{backend}-{config}"
    write_job(str(root), files)
    result = run_v2_job(
        root, source_files={"train_digits.py": files["code/train_digits.py"]}, entry_point="train_digits.py",
        instance_count=2, distribution={"mpi": {"enabled": True, "processes_per_host": 1}} if backend != "ddp"
        else {"torch_distributed": {"enabled": True}},
        hyperparameters={**DEFAULT_HYPERPARAMETERS, "epochs": epochs},
        channels={"train": root / "input/data/train", "validation": root / "input/data/validation"},
        environment=CONFIGS[config], name="job",
    )
    windows = [float(m.group(1)) for m in THROUGHPUT.finditer(result.log)]
    if not result.ok:
        raise RuntimeError(f"{backend} {config} failed: {result.error}\n{result.log[-3000:]}")
    return {"fit_s": result.fit_seconds, "samples_per_s": statistics.median(windows) if windows else None}


def run_plain(config: str, steps: int, work: Path) -> dict:
    host = socket.gethostname()  # mpirun starts both ranks here, without SSH
    root = write_tree(work / f"plain-{config}", script=PLAIN_SCRIPT, program="bench.py", hosts=(host,),
                      current_host=host, resource_extra={"current_instance_type": "ml.c5.xlarge"},
                      hyperparameters={"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2,
                                       "steps": steps})
    done = subprocess.run([sys.executable, "-m", "entrypoint", "train"], capture_output=True, text=True,
                          env=entrypoint_env(root, BYOC_REPORT="0", **CONFIGS[config]), cwd=str(REPO), timeout=900)
    found = STEPS.search(done.stdout)
    if done.returncode or not found:
        raise RuntimeError(f"plain {config} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return {"steps_per_s": float(found.group(1))}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="ddp,horovod,mpi4py")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=DEFAULT_HYPERPARAMETERS["epochs"])
    parser.add_argument("--plain-steps", type=int, default=2000)
    parser.add_argument("--only", choices=("localmode", "plain"))
    parser.add_argument("--configs", default=",".join(CONFIGS), help="a subset of " + ", ".join(CONFIGS))
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    backends = [b for b in args.backends.split(",") if b]
    unknown = [b for b in backends if b not in BACKENDS]
    configs = [c for c in args.configs.split(",") if c]
    if unknown or set(configs) - set(CONFIGS):
        parser.error(f"unknown backend(s) or configuration(s): {unknown or sorted(set(configs) - set(CONFIGS))}")
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="byoc-threads-") as tmp:
        for repeat in range(args.repeats):  # configurations interleaved, so drift touches each alike
            for config in configs:
                if args.only != "plain":
                    for backend in backends:
                        key = f"localmode {backend} {config}"
                        results.setdefault(key, []).append(run_localmode(backend, config, args.epochs,
                                                                         Path(tmp) / str(repeat)))
                        print(key, results[key][-1], flush=True)
                if args.only != "localmode":
                    key = f"plain mpirun x2 {config}"
                    results.setdefault(key, []).append(run_plain(config, args.plain_steps, Path(tmp) / str(repeat)))
                    print(key, results[key][-1], flush=True)
    print(f"\n{CORES} cores; median of {args.repeats} run(s)\n| run | fit() s | samples/s or steps/s |\n|---|---|---|")
    for key, runs in results.items():
        fit = [r["fit_s"] for r in runs if r.get("fit_s") is not None]
        rate = [r.get("samples_per_s") or r.get("steps_per_s") for r in runs]
        print(f"| {key} | {statistics.median(fit) if fit else '-'} | {statistics.median(rate):,.0f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

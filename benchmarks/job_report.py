"""What the job report costs: the same jobs with it (the default) and without (BYOC_REPORT=0),
interleaved in one run on one machine.

    .venv/bin/python benchmarks/job_report.py [--repeats 3] [--seconds 60] [--only long|fit] [--tensorboard]

- long: a 1-host job through the entrypoint on this machine (no container): a training loop
  (2 ranks under mpirun, gloo all-reduce of the gradients, a small MLP) that runs for
  --seconds; measured: its steps a second (from the ranks' own count) and, with the report,
  the sampler's CPU (report.json: sampler_cpu_s) as a share of one core;
- --tensorboard: the long job a third way, the report with the job watched live
  (BYOC_TENSORBOARD=1: TensorBoard events every 10 s, the default, and the status line at its
  default); the sampler's CPU then includes the live thread's;
- fit: the README's main job (DDP on 2 SDK v2 local-mode hosts, the CPU image), fit()'s wall
  time through the tests' harness.
Prints a Markdown table of medians.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from support.jobtree import run_entrypoint, write_tree  # noqa: E402

LONG_JOB = """
import json, os, time, torch, torch.distributed as dist
rank, world = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
dist.init_process_group("gloo", rank=rank, world_size=world)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
steps, t0 = 0, time.perf_counter()
while True:
    loss = torch.nn.functional.cross_entropy(model(torch.randn(64, 256)), torch.randint(0, 10, (64,)))
    opt.zero_grad(); loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step(); steps += 1
    done = torch.tensor([float(time.perf_counter() - t0 >= SECONDS)])
    dist.all_reduce(done)
    if done.item() > 0:
        break
if rank == 0:
    json.dump({"steps": steps, "seconds": time.perf_counter() - t0}, open(os.environ["SM_MODEL_DIR"] + "/steps.json", "w"))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_long(seconds: float, report: bool, tensorboard: bool = False) -> dict:
    host = socket.gethostname()
    with tempfile.TemporaryDirectory() as tmp:
        root = write_tree(Path(tmp), script=LONG_JOB.replace("SECONDS", str(seconds)), hosts=(host,), current_host=host,
                          hyperparameters={"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2})
        started = time.monotonic()
        # a free port: another job on this machine may hold the default 7777
        done = run_entrypoint(root, timeout=seconds + 300, BYOC_REPORT="1" if report else "0", OMP_NUM_THREADS="1",
                              BYOC_TENSORBOARD="1" if tensorboard else "0", BYOC_MASTER_PORT=str(free_port()))
        wall = time.monotonic() - started
        if done.returncode != 0:
            raise RuntimeError(done.stderr[-3000:])
        steps = json.loads((root / "model" / "steps.json").read_text())
        result = {"steps_per_s": steps["steps"] / steps["seconds"], "wall_s": wall}
        if report:
            data = json.loads((root / "output/data/report/report.json").read_text())
            sampled = data["job"]["ended"] - data["job"]["started"]
            result["sampler_pct_of_core"] = 100 * data["hosts"][host]["sampler_cpu_s"] / sampled
        if tensorboard and not any((root / "output/tensorboard/byoc-job").iterdir()):
            raise RuntimeError("no TensorBoard events were written")
        return result


def run_fit(tmp: Path, report: bool, index: int) -> float:
    from jobs.run_main_job import DEFAULT_HYPERPARAMETERS, ENTRY_SCRIPT, write_inputs
    from localmode.harness import run_v2_job

    work = tmp / f"fit-{index}-{int(report)}"
    code, channels = write_inputs(str(work), "ddp")
    files = {name: Path(code, name).read_text() for name in os.listdir(code)}
    result = run_v2_job(work, source_files=files, entry_point=ENTRY_SCRIPT, instance_count=2,
                        distribution={"torch_distributed": {"enabled": True}}, hyperparameters=DEFAULT_HYPERPARAMETERS,
                        channels=channels, environment={"BYOC_REPORT": "1" if report else "0"})
    if not result.ok:
        raise RuntimeError(result.log_tail())
    return result.fit_seconds


def median(values) -> float:
    return statistics.median(values) if values else float("nan")


def print_live_table(args) -> int:
    """The long job three ways, interleaved: the report with TensorBoard, the report alone, none."""
    ways = {"with TensorBoard": (True, True), "the report alone": (True, False), "BYOC_REPORT=0": (False, False)}
    runs = {name: [] for name in ways}
    for _ in range(args.repeats):
        for name, (report, tensorboard) in ways.items():
            runs[name].append(run_long(args.seconds, report, tensorboard))
    for name, results in runs.items():
        print(f"each run, {name}:", [round(r["steps_per_s"], 1) for r in results], "steps/s;",
              [round(r.get("sampler_pct_of_core", 0), 2) for r in results], "% of a core", flush=True)
    print(f"\n| median of {args.repeats}, {args.seconds:g} s loop | " + " | ".join(ways) + " |\n|---|---|---|---|")
    print("| steps/s | " + " | ".join(f"{median(r['steps_per_s'] for r in runs[n]):.1f}" for n in ways) + " |")
    print("| the report's CPU (sampler + live thread), % of one core | " + " | ".join(
        f"{median(r['sampler_pct_of_core'] for r in runs[n]):.2f}" if ways[n][0] else "-" for n in ways) + " |")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--only", choices=["long", "fit"])
    parser.add_argument("--tensorboard", action="store_true", help="the long job with TensorBoard on too")
    args = parser.parse_args()
    rows = []
    if args.tensorboard and args.only != "fit":
        return print_live_table(args)
    if args.only != "fit":
        runs = {True: [], False: []}
        for _ in range(args.repeats):
            for report in (True, False):
                runs[report].append(run_long(args.seconds, report))
        on, off = runs[True], runs[False]
        print("each run, with the report:", [round(r["steps_per_s"], 1) for r in on], "steps/s;",
              "without:", [round(r["steps_per_s"], 1) for r in off], flush=True)
        rows.append((f"1 host, {args.seconds:g} s training loop: steps/s",
                     f"{median(r['steps_per_s'] for r in on):.1f}", f"{median(r['steps_per_s'] for r in off):.1f}"))
        rows.append(("  entrypoint wall time, s", f"{median(r['wall_s'] for r in on):.1f}",
                     f"{median(r['wall_s'] for r in off):.1f}"))
        rows.append(("  sampler CPU, % of one core", f"{median(r['sampler_pct_of_core'] for r in on):.2f}", "-"))
    if args.only != "long":
        with tempfile.TemporaryDirectory() as tmp:
            fits = {True: [], False: []}
            for i in range(args.repeats):
                for report in (True, False):
                    fits[report].append(run_fit(Path(tmp), report, i))
        print("each fit(), s, with the report:", [round(f, 1) for f in fits[True]], "without:",
              [round(f, 1) for f in fits[False]], flush=True)
        rows.append(("main job fit() (DDP, 2 local-mode hosts), s", f"{median(fits[True]):.1f}",
                     f"{median(fits[False]):.1f}"))
    print(f"\n| median of {args.repeats} | with the report | BYOC_REPORT=0 |\n|---|---|---|")
    for row in rows:
        print(f"| {row[0]} | {row[1]} | {row[2]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

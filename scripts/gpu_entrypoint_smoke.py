#!/usr/bin/env python3
"""The entrypoint itself on a GPU machine: `python -m entrypoint train` on an /opt/ml tree of
its own (in a temporary folder), a 1-host torch_distributed job whose ranks run a DDP step
and an all-reduce over NCCL, with BYOC_HEALTH_CHECK=deep before it. Run on a machine with
NVIDIA GPUs and torch with CUDA (the GPU image, or a GPU machine's own python3):

    python3 scripts/gpu_entrypoint_smoke.py [--json]

Checks: the job succeeds (exit 0, output/success); every rank saw its own GPU and the
all-reduce's sum; the plan's NCCL line and the health check's figure are in the log; the job
report (output/data/report/) has every GPU's use, memory and power from nvidia-smi and every
rank's steps (copied to $BYOC_SMOKE_OUT when set). Exit
status 0 all passed, 1 a check failed (printed), 2 no GPU here.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

RANK_SCRIPT = r"""
import json, os, torch, torch.distributed as dist
dist.init_process_group("nccl")
rank, local = dist.get_rank(), int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2).cuda(), device_ids=[local])
model(torch.randn(4, 8, device="cuda")).sum().backward()
# Steps for the job report (its GPU series and step figures): an optimizer loop for ~4 s.
import time
opt = torch.optim.SGD(model.parameters(), lr=0.01)
big = torch.randn(4096, 4096, device="cuda")
started = time.time()
while True:
    opt.zero_grad()
    (model(torch.randn(64, 8, device="cuda")).sum() + (big @ big).mean() * 0).backward()
    opt.step()
    done = torch.tensor([float(time.time() - started > 4)], device="cuda")
    dist.all_reduce(done)
    if done.item() > 0:
        break
value = torch.tensor([float(rank + 1)], device="cuda")
dist.all_reduce(value)
record = {"rank": rank, "device": torch.cuda.get_device_name(local), "sum": value.item(),
          "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
with open(os.path.join(os.environ["SM_MODEL_DIR"], f"rank-{rank}.json"), "w") as f:
    json.dump(record, f)
dist.destroy_process_group()
"""


def write_tree(root: Path, gpus: int) -> None:
    for sub in ("input/config", "input/data/train", "code", "model", "output"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "input/config/resourceconfig.json").write_text(json.dumps({"current_host": "algo-1", "hosts": ["algo-1"]}))
    hps = {"sagemaker_program": "train.py", "sagemaker_torch_distributed_enabled": True}
    (root / "input/config/hyperparameters.json").write_text(json.dumps({k: json.dumps(v) for k, v in hps.items()}))
    (root / "input/config/inputdataconfig.json").write_text(json.dumps({"train": {"TrainingInputMode": "File"}}))
    (root / "code/train.py").write_text(RANK_SCRIPT)


def check_report(folder: Path, gpus: int) -> list[str]:
    """The job report's GPU series and ranks; its files copied to $BYOC_SMOKE_OUT when set."""
    if os.environ.get("BYOC_SMOKE_OUT"):
        shutil.copytree(folder, os.environ["BYOC_SMOKE_OUT"], dirs_exist_ok=True)
    try:
        report = json.loads((folder / "report.json").read_text())
    except (OSError, ValueError) as exc:
        return [f"no job report: {exc}"]
    series = report["hosts"]["algo-1"]["series"]
    problems = []
    for name in ("gpu_util_pct", "gpu_mem_mb", "gpu_power_w"):
        readings = [r for r in series.get(name) or [] if r]
        if not readings or len(readings[-1]) != gpus or all(v in (None, 0) for r in readings for v in r):
            problems.append(f"the report's {name}: {readings[-3:]}")
    steps = [(r["rank"], r["steps"]) for r in report["ranks"]]
    if len(steps) != gpus or any(n < 10 for _, n in steps):
        problems.append(f"the report's ranks: {steps}")
    print("job report:", {"samples": len(series.get("time") or []), "ranks": steps,
                          "stragglers": [s["line"] for s in report["stragglers"]],
                          "sampler_cpu_s": report["hosts"]["algo-1"]["sampler_cpu_s"]})
    return problems


def count_gpus() -> int:
    if not shutil.which("nvidia-smi"):
        return 0
    done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return sum(1 for line in done.stdout.splitlines() if line.startswith("GPU "))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    gpus = count_gpus()
    if not gpus:
        print("no NVIDIA GPU here: nothing was tested")
        return 2
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gpu-entrypoint-") as tmp:
        root = Path(tmp) / "ml"
        write_tree(root, gpus)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "SAGEMAKER_", "BYOC_"))}
        env.update(SAGEMAKER_BASE_DIR=str(root), PYTHONPATH=str(REPO), BYOC_HEALTH_CHECK="deep",
                   BYOC_RUNTIME_DIR=str(Path(tmp) / "run"), BYOC_HEALTH_CHECK_MIB="256")
        done = subprocess.run([sys.executable, "-m", "entrypoint", "train"], env=env, capture_output=True, text=True,
                              timeout=args.timeout, cwd=tmp)
        log = done.stdout + done.stderr
        ranks = sorted((json.loads(p.read_text()) for p in (root / "model").glob("rank-*.json")), key=lambda r: r["rank"])
        if done.returncode != 0 or not (root / "output/success").exists():
            problems.append(f"the job failed with exit code {done.returncode}: "
                            + ((root / "output/failure").read_text()[:2000] if (root / "output/failure").exists() else ""))
        want = float(gpus * (gpus + 1) // 2)
        if [r["rank"] for r in ranks] != list(range(gpus)) or any(r["sum"] != want for r in ranks):
            problems.append(f"ranks' records {ranks}, expected {gpus} ranks whose all-reduce gave {want}")
        for needle in ("NCCL network:", "BYOC_HEALTH_CHECK=deep"):
            if needle not in log:
                problems.append(f"{needle!r} not in the entrypoint's log")
        problems.extend(check_report(root / "output/data/report", gpus))
    summary = {"gpus": gpus, "exit_code": done.returncode, "ranks": ranks, "problems": problems,
               "log_tail": log[-6000:]}
    print(json.dumps(summary, indent=2) if args.json else "\n".join([log[-6000:], *problems, "OK" if not problems else "FAILED"]))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

"""Time to the first training step of a torch.compile job, cold against warm, through the
entrypoint (`python -m entrypoint train`) with a checkpoint folder. Goal: warm <= 30% of cold.

    .venv/bin/python benchmarks/compile_cache.py [--runs 3] [--blocks 12] [--width 256] [--bytecode]

Each round runs two jobs, each as on a new instance (an empty host-local cache folder and an
empty temporary folder, TMPDIR, where torch would keep what is not in the cache folder):
  cold: an empty checkpoint folder: Inductor compiles everything;
  warm: the checkpoint folder the cold job left (its byoc-compile-cache/host-0.tar.gz), as
        SageMaker puts it back for the next job with the same checkpoint_s3_uri.
Time to first step: from the entrypoint's start to the end of the first optimizer step
(the script writes the time). Also shown: where that time went (the entrypoint until the
script starts, `import torch`, torch.compile's own imports, the first step) and Inductor's
and AOTAutograd's cache counters of each job, which say cold or warm (not the clock). Medians
of --runs rounds; cold and warm alternate, so a load change on the machine hits both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GOAL = 0.30  # warm / cold
BLOCKS = 12  # cold compile >= 20 s on this machine, quiet, with margin (docs/compile-cache.md)

SCRIPT = r"""
import json, os, sys, time
script_start = time.time()
import torch
torch_imported = time.time()
blocks, width = int(sys.argv[2]), int(sys.argv[4])  # --blocks B --width W
torch.manual_seed(0)
layers = []
for _ in range(blocks):
    layers += [torch.nn.Linear(width, width), torch.nn.LayerNorm(width), torch.nn.GELU()]
model = torch.nn.Sequential(*layers, torch.nn.Linear(width, 10))
optimizer = torch.optim.AdamW(model.parameters())
compiled = torch.compile(model)
x, y = torch.randn(32, width), torch.randint(0, 10, (32,))
started = time.time()
loss = torch.nn.functional.cross_entropy(compiled(x), y)
forward_done = time.time()
loss.backward()
optimizer.step()
done = time.time()
from torch._dynamo.utils import counters
with open(os.path.join(os.environ["SM_MODEL_DIR"], "first-step.json"), "w") as f:
    json.dump({"script_start": script_start, "torch_imported": torch_imported, "step_start": started,
               "forward_done": forward_done, "first_step_done": done, "first_step_s": done - started,
               "inductor": {k: v for k, v in counters["inductor"].items() if "cache" in k},
               "aot_autograd": {k: v for k, v in counters["aot_autograd"].items() if "cache" in k}}, f)
"""
# (label, from, to) of the script's time stamps; "start" is the entrypoint's start.
PHASES = (("entrypoint until the script", "start", "script_start"), ("import torch", "script_start", "torch_imported"),
          ("the model, torch.compile's imports", "torch_imported", "step_start"),
          ("first forward (compile or cache)", "step_start", "forward_done"),
          ("first backward + step", "forward_done", "first_step_done"))


def write_tree(root: Path, checkpoints: Path, blocks: int, width: int) -> None:
    for sub in ("input/config", "code", "model", "output"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    config = root / "input/config"
    (config / "resourceconfig.json").write_text(json.dumps({"current_host": "algo-1", "hosts": ["algo-1"]}))
    hps = {"sagemaker_program": "train.py", "blocks": blocks, "width": width}
    (config / "hyperparameters.json").write_text(json.dumps({k: json.dumps(v) for k, v in hps.items()}))
    (config / "inputdataconfig.json").write_text("{}")
    (config / "checkpointconfig.json").write_text(json.dumps({"LocalPath": str(checkpoints)}))
    (root / "code/train.py").write_text(SCRIPT)


def run_job(work: Path, name: str, checkpoints: Path, blocks: int, width: int, bytecode: Path | None = None) -> dict:
    root = work / name
    write_tree(root, checkpoints, blocks, width)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "SAGEMAKER_", "BYOC_", "TORCHINDUCTOR_"))}
    env.update(SAGEMAKER_BASE_DIR=str(root), PYTHONPATH=str(REPO), BYOC_REPORT="0",
               BYOC_RUNTIME_DIR=str(work / f"run-{name}"), BYOC_COMPILE_CACHE_DIR=str(work / f"local-{name}"),
               TMPDIR=str(work / f"tmp-{name}"))
    (work / f"tmp-{name}").mkdir()
    if bytecode is not None:  # Python's bytecode kept, as the image ships it (docs/compile-cache.md)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(bytecode)
    started = time.time()
    done = subprocess.run([sys.executable, "-m", "entrypoint", "train"], env=env, cwd=str(REPO),
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{name} failed:\n{done.stderr[-3000:]}")
    result = json.loads((root / "model/first-step.json").read_text())
    result["to_first_step_s"] = result["first_step_done"] - started
    result["start"] = started
    result["phases"] = {label: result[end] - result[begin] for label, begin, end in PHASES}
    result["archive_line"] = next((line for line in done.stderr.splitlines() if "written (the end)" in line), "")
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--blocks", type=int, default=BLOCKS)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--bytecode", action="store_true",
                        help="keep Python's bytecode between the jobs (an untimed job first writes it), as the "
                             "image's venv has it; without it, a venv installed --no-compile under "
                             "PYTHONDONTWRITEBYTECODE=1 recompiles torch's sources in every process")
    args = parser.parse_args()
    rows: dict[str, list[dict]] = {"cold": [], "warm": []}
    print(f"load average at the start: {os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        bytecode = work / "bytecode" if args.bytecode else None
        if bytecode is not None:
            run_job(work, "bytecode", work / "checkpoints-bytecode", args.blocks, args.width, bytecode)
        for i in range(args.runs):
            checkpoints = work / f"checkpoints-{i}"
            rows["cold"].append(run_job(work, f"cold-{i}", checkpoints, args.blocks, args.width, bytecode))
            rows["warm"].append(run_job(work, f"warm-{i}", checkpoints, args.blocks, args.width, bytecode))
            archive = checkpoints / "byoc-compile-cache" / "host-0.tar.gz"
            # What a loose-file cache in the checkpoint folder would be: one S3 object (one PUT
            # when written, one GET at the next start) per file, against one for the archive.
            files = [p for p in (work / f"local-cold-{i}").rglob("*") if p.is_file()]
            print(f"round {i + 1}: the cold job's cache: {len(files)} files, "
                  f"{sum(p.stat().st_size for p in files) / 1e6:.2f} MB", flush=True)
            for kind in ("cold", "warm"):
                row = rows[kind][-1]
                print(f"round {i + 1}: {kind} {row['to_first_step_s']:.1f} s {row['inductor']} {row['aot_autograd']}: "
                      + ", ".join(f"{label} {s:.1f}" for label, s in row["phases"].items()), flush=True)
            print(f"  archive {archive.stat().st_size / 1e6:.2f} MB; cold job: "
                  f"{rows['cold'][-1]['archive_line'].split('cache: ', 1)[-1]}", flush=True)
            for name in (f"cold-{i}", f"warm-{i}"):
                shutil.rmtree(work / f"local-{name}", ignore_errors=True)
                shutil.rmtree(work / f"tmp-{name}", ignore_errors=True)
    medians = {kind: statistics.median(r["to_first_step_s"] for r in runs) for kind, runs in rows.items()}
    steps = {kind: statistics.median(r["first_step_s"] for r in runs) for kind, runs in rows.items()}
    ratio = medians["warm"] / medians["cold"]
    print(f"time to first step, median of {args.runs}: cold {medians['cold']:.1f} s, warm {medians['warm']:.1f} s, "
          f"ratio {ratio:.2f} (goal <= {GOAL}: {'met' if ratio <= GOAL else 'NOT met'})")
    print(f"the first step alone (compile included): cold {steps['cold']:.1f} s, warm {steps['warm']:.1f} s")
    for label, _, _ in PHASES:
        print(f"  {label}: cold {statistics.median(r['phases'][label] for r in rows['cold']):.1f} s, "
              f"warm {statistics.median(r['phases'][label] for r in rows['warm']):.1f} s")
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

"""How often a finished 2-rank DDP job dies at exit (SIGABRT in the interpreter's teardown),
with and without the rank wrapper: the measured rate behind docs/reliability.md's "A rank's end".

    python benchmarks/exit_abort_rate.py [--runs 100] [--mode plain|wrapper|both]

Each run is `torchrun --nproc_per_node 2` of PyTorch's DDP ToyModel example (gloo on the CPU:
one step, then `destroy_process_group()`), run as the user's script (`plain`) or through
entrypoint/rank/record_errors.py as the entrypoint runs every rank (`wrapper`). A run counts
as aborted when torchrun reports a rank's exit code -6 (SIGABRT). Run it where the abort was
seen, inside the image with its own environment:

    docker run --rm -v "$PWD:/src:ro" -w /src byoc-training:cpu-local \\
        python benchmarks/exit_abort_rate.py --runs 100

With 0 aborts in N runs, the rate is below 3/N at 95% confidence (the rule of three).
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECORD_ERRORS = REPO / "entrypoint" / "rank" / "record_errors.py"

TOY = """
import torch, torch.distributed as dist, torch.nn as nn, torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP

class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1, self.relu, self.net2 = nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))

dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(ToyModel())
loss_fn, optimizer = nn.MSELoss(), optim.SGD(model.parameters(), lr=0.001)
optimizer.zero_grad()
loss_fn(model(torch.randn(20, 10)), torch.randn(20, 5)).backward()
optimizer.step()
print(f"rank {rank}: step done", flush=True)
dist.destroy_process_group()
"""


def run_once(script: Path, wrapper: bool, port: int) -> tuple[bool, bool]:
    """(finished ok, aborted)"""
    program = ["--no-python", sys.executable, str(RECORD_ERRORS), str(script)] if wrapper else [str(script)]
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
                           "127.0.0.1", "--master_port", str(port), *program],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    text = done.stdout + done.stderr
    return done.returncode == 0, "exitcode: -6" in text or "SIGABRT" in text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--mode", choices=("plain", "wrapper", "both"), default="both")
    args = parser.parse_args()
    modes = ("plain", "wrapper") if args.mode == "both" else (args.mode,)
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "toy_ddp.py"
        script.write_text(TOY)
        counts = {m: [0, 0, 0] for m in modes}  # runs, failed, aborted
        started = time.monotonic()
        for i in range(args.runs):
            for mode in modes:  # alternating: both see the same machine conditions
                ok, aborted = run_once(script, mode == "wrapper", 29500 + (i * 2 + (mode == "wrapper")) % 2000)
                counts[mode][0] += 1
                counts[mode][1] += not ok
                counts[mode][2] += aborted
            if (i + 1) % 10 == 0:  # progress a person can follow on a long loop
                print(f"after {i + 1} runs each, {time.monotonic() - started:.0f} s: "
                      + ", ".join(f"{m} aborted {c[2]}, failed {c[1]}" for m, c in counts.items()), flush=True)
        for mode, (runs, failed, aborted) in counts.items():
            bound = f"< {3 / runs:.1%} (95%)" if aborted == 0 else f"{aborted / runs:.1%}"
            print(f"{mode:8s} runs {runs}  failed {failed}  aborted (SIGABRT) {aborted}  rate {bound}")
        print(f"{time.monotonic() - started:.0f} s in all, python {sys.version.split()[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

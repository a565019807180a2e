"""Training steps for the live figures' multi-host test: after --hold-at steps each rank waits
for a file the test writes (in the shared model folder), so the test reads the live figures
while the job is still running; then it steps on to --steps."""
import argparse
import os
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--hold-at", type=int, default=3)
args = parser.parse_args()
dist.init_process_group("gloo")
model = torch.nn.Linear(64, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
go = os.path.join(os.environ["SM_MODEL_DIR"], "go")
for step in range(args.steps):
    loss = model(torch.randn(32, 64)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
    if step == args.hold_at:
        while not os.path.exists(go):
            time.sleep(0.05)
    time.sleep(0.01)
dist.destroy_process_group()

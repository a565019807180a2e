"""Training steps for the job report's multi-host tests: an optimizer step at a time, the
gradients all-reduced by hand; --slow-rank computes 3x longer than the others."""
import argparse
import os
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--slow-rank", type=int, default=-1)
args = parser.parse_args()
if "RANK" in os.environ:
    dist.init_process_group("gloo")
else:  # mpirun
    dist.init_process_group("gloo", rank=int(os.environ["OMPI_COMM_WORLD_RANK"]),
                            world_size=int(os.environ["OMPI_COMM_WORLD_SIZE"]))
rank = dist.get_rank()
model = torch.nn.Linear(64, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(args.steps):
    loss = model(torch.randn(32, 64)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    time.sleep(0.03 if rank == args.slow_rank else 0.01)
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
dist.destroy_process_group()

"""Writes nothing on stdout or stderr, as scripts that log only to files or a tracker: gloo, DDP
over a Linear(32, 4), 50 optimizer steps, destroy_process_group(); then a file in the model
folder says what it did. Forked ranks hung after its last line (issue 62: the program's globals
freed while gloo's thread needed the GIL)."""
import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
model = DDP(torch.nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(50):
    opt.zero_grad()
    model(torch.randn(8, 32)).sum().backward()
    opt.step()
rank, world = dist.get_rank(), dist.get_world_size()
dist.destroy_process_group()
with open(os.path.join(os.environ["SM_MODEL_DIR"], f"rank-{rank}.json"), "w") as f:
    json.dump({"rank": rank, "world": world, "steps": step + 1}, f)

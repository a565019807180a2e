"""A torch.distributed (gloo) job for the multi-host tests; --fail picks a fault (faults.py)."""
import argparse
import json
import os
import socket

import torch
import torch.distributed as dist

from faults import add_fault_options, checkpoint_on_sigterm, inject_fault

parser = argparse.ArgumentParser()
add_fault_options(parser)
args = parser.parse_args()
model = os.environ["SM_MODEL_DIR"]
host = socket.gethostname()
dist.init_process_group("gloo")
rank, size = dist.get_rank(), dist.get_world_size()
checkpoint_on_sigterm(args, model, rank, host)
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
inject_fault(args, model, rank, size, host)
dist.barrier()
with open(os.path.join(model, f"rank-{rank}.json"), "w") as f:
    json.dump({"rank": rank, "size": size, "host": host, "sum": t.item(), "sm_current_host": os.environ["SM_CURRENT_HOST"]}, f)
dist.destroy_process_group()

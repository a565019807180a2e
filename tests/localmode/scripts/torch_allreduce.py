"""A cross-host gloo allreduce; every rank writes what it got to SM_MODEL_DIR/rank-<rank>.json
(model/ is one folder shared by every host in SDK v2 local mode).

--mode torchrun:   RANK/WORLD_SIZE/MASTER_* from torchrun (torch_distributed)
--mode any-launcher: RANK/WORLD_SIZE when the launcher set them (torchrun), else Open MPI's
                   (pytorchddp: SDK v2 turns it into smdistributed dataparallel, which the
                   entrypoint runs with torchrun when AWS's SMDDP library is absent)
--mode host-index: no launcher; rank = index of SM_CURRENT_HOST in SM_HOSTS, world = hosts,
                   MASTER_ADDR/MASTER_PORT as the PyTorch DLC sets them for every job
"""
import argparse
import json
import os

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--mode", required=True, choices=["torchrun", "any-launcher", "host-index"])
args = parser.parse_args()

if args.mode == "torchrun":
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
elif args.mode == "any-launcher":
    rank = int(os.environ.get("RANK") or os.environ["OMPI_COMM_WORLD_RANK"])
    world = int(os.environ.get("WORLD_SIZE") or os.environ["OMPI_COMM_WORLD_SIZE"])
else:
    hosts = json.loads(os.environ["SM_HOSTS"])
    rank, world = hosts.index(os.environ["SM_CURRENT_HOST"]), len(hosts)

dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value, op=dist.ReduceOp.SUM)
hosts_seen = [None] * world
dist.all_gather_object(hosts_seen, os.environ["SM_CURRENT_HOST"])
record = {"rank": rank, "world_size": world, "host": os.environ["SM_CURRENT_HOST"], "sum": value.item(),
          "hosts_seen": hosts_seen, "master_addr": os.environ.get("MASTER_ADDR"),
          "master_port": os.environ.get("MASTER_PORT")}
with open(os.path.join(os.environ["SM_MODEL_DIR"], f"rank-{rank}.json"), "w") as f:
    json.dump(record, f)
dist.barrier()
dist.destroy_process_group()
print(f"[test-script] rank {rank}/{world} on {record['host']}: allreduce sum {record['sum']}", flush=True)

"""A torch.distributed (gloo) job for the multi-host tests; --fail picks a fault."""
import argparse
import json
import os
import signal
import socket
import sys
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--fail", default="none")  # none | leader | worker | worker-once (restart tests)
parser.add_argument("--hold", type=float, default=0.0)
parser.add_argument("--save-s", type=float, default=0.0)  # seconds the SIGTERM handler takes
args = parser.parse_args()
model = os.environ["SM_MODEL_DIR"]
host = socket.gethostname()
dist.init_process_group("gloo")
rank, size = dist.get_rank(), dist.get_world_size()


def on_sigterm(*_):
    time.sleep(args.save_s)  # e.g. writing a checkpoint
    with open(os.path.join(model, f"sigterm-{rank}"), "w") as f:
        f.write(host)
    sys.exit(143)


signal.signal(signal.SIGTERM, on_sigterm)
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
with open(os.path.join(model, f"started-{rank}"), "w") as f:
    f.write(host)
if args.fail == "worker" and rank == size - 1:
    raise RuntimeError(f"injected failure on {host}")
if args.fail == "leader" and rank == 0:
    raise RuntimeError(f"injected failure on {host}")
once_marker = os.path.join(model, "failed-once")
if args.fail == "worker-once" and rank == size - 1 and not os.path.exists(once_marker):
    open(once_marker, "w").close()  # the restarted job runs through
    raise RuntimeError(f"injected failure on {host}")
deadline = time.time() + args.hold
while time.time() < deadline:
    time.sleep(0.05)
dist.barrier()
with open(os.path.join(model, f"rank-{rank}.json"), "w") as f:
    json.dump({"rank": rank, "size": size, "host": host, "sum": t.item(), "sm_current_host": os.environ["SM_CURRENT_HOST"]}, f)
dist.destroy_process_group()

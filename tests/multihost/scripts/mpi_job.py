"""An mpi4py job for the multi-host tests: allreduce, ranks report where they ran; --fail
picks a fault."""
import argparse
import json
import os
import signal
import socket
import sys
import time

from mpi4py import MPI

parser = argparse.ArgumentParser()
parser.add_argument("--fail", default="none")  # none | leader | worker | worker-once | hang-worker
parser.add_argument("--hold", type=float, default=0.0)  # seconds to stay in the job
parser.add_argument("--save-s", type=float, default=0.0)  # seconds the SIGTERM handler takes
args = parser.parse_args()
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
model = os.environ["SM_MODEL_DIR"]
host = socket.gethostname()


def on_sigterm(*_):
    time.sleep(args.save_s)  # e.g. writing a checkpoint
    with open(os.path.join(model, f"sigterm-{rank}"), "w") as f:
        f.write(host)
    sys.exit(143)


signal.signal(signal.SIGTERM, on_sigterm)
total = comm.allreduce(rank + 1)
with open(os.path.join(model, f"started-{rank}"), "w") as f:
    f.write(host)
if args.fail == "worker" and rank == size - 1:
    raise RuntimeError(f"injected failure on {host}")
if args.fail == "leader" and rank == 0:
    raise RuntimeError(f"injected failure on {host}")
def stuck_on_the_worker():
    time.sleep(600)  # as if blocked in I/O: silent, never reaching the barrier


if args.fail == "hang-worker" and rank == size - 1:
    stuck_on_the_worker()
once_marker = os.path.join(model, "failed-once")
if args.fail == "worker-once" and rank == size - 1 and not os.path.exists(once_marker):
    open(once_marker, "w").close()  # the restarted job runs through
    raise RuntimeError(f"injected failure on {host}")
deadline = time.time() + args.hold
while time.time() < deadline:
    time.sleep(0.05)
comm.Barrier()
with open(os.path.join(model, f"rank-{rank}.json"), "w") as f:
    json.dump({"rank": rank, "size": size, "host": host, "sum": total, "sm_current_host": os.environ["SM_CURRENT_HOST"]}, f)

"""An mpi4py job for the multi-host tests: allreduce, ranks report where they ran; --fail
picks a fault (faults.py)."""
import argparse
import json
import os
import socket

from mpi4py import MPI

from faults import add_fault_options, checkpoint_on_sigterm, inject_fault

parser = argparse.ArgumentParser()
add_fault_options(parser)
args = parser.parse_args()
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
model = os.environ["SM_MODEL_DIR"]
host = socket.gethostname()
checkpoint_on_sigterm(args, model, rank, host)
total = comm.allreduce(rank + 1)
inject_fault(args, model, rank, size, host)
comm.Barrier()
with open(os.path.join(model, f"rank-{rank}.json"), "w") as f:
    json.dump({"rank": rank, "size": size, "host": host, "sum": total, "sm_current_host": os.environ["SM_CURRENT_HOST"]}, f)

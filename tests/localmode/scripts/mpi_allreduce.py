"""mpi4py across hosts: every rank writes its allreduce result to SM_MODEL_DIR/rank-<rank>.json."""
import json
import os

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, world = comm.Get_rank(), comm.Get_size()
total = comm.allreduce(rank + 1, op=MPI.SUM)
hosts_seen = comm.allgather(os.environ["SM_CURRENT_HOST"])
with open(os.path.join(os.environ["SM_MODEL_DIR"], f"rank-{rank}.json"), "w") as f:
    json.dump({"rank": rank, "world_size": world, "host": os.environ["SM_CURRENT_HOST"], "sum": total,
               "hosts_seen": hosts_seen, "processor": MPI.Get_processor_name(),
               "user_env": os.environ.get("BYOC_TEST_USER_VALUE")}, f)
comm.Barrier()
print(f"[test-script] rank {rank}/{world} on {os.environ['SM_CURRENT_HOST']}: allreduce sum {total}", flush=True)

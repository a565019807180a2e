"""Parameter server (the entrypoint's launch: one train.ps_server shard per host, the workers run
this). Worker 0 puts one parameter on each shard (ps0 on the first host, ps1 on the second);
every worker pushes gradient (worker rank + 1) to both in one synchronous round; SGD with lr 1
from 0 gives -(mean of the gradients) on every shard. Each worker writes what it pulled back
to SM_MODEL_DIR/rank-<worker rank>.json."""
import json
import os

import torch
import torch.distributed.rpc as rpc

from train.ps import JobDirectory, ParameterShard, build_rpc_options, parse_ps_topology

topology = parse_ps_topology(os.environ)
rpc.init_rpc(topology.rpc_name, rank=topology.rank, world_size=topology.world_size,
             rpc_backend_options=build_rpc_options(topology, timeout_s=120))
options = {"lr": 1.0, "momentum": 0.0, "weight_decay": 0.0}
if topology.worker_rank == 0:
    shards = [rpc.remote(server, ParameterShard, args=({f"w{i}": torch.zeros(1)}, "sgd", options, None,
                                                         topology.num_workers, "sync"))
              for i, server in enumerate(topology.servers)]
    rpc.rpc_sync(topology.servers[0], JobDirectory.publish, args=({"shards": shards},))
else:
    shards = rpc.rpc_sync(topology.servers[0], JobDirectory.fetch)["shards"]
grad = float(topology.worker_rank + 1)
futures = [rpc.rpc_async(s.owner(), ParameterShard.push_pull, args=(s, {f"w{i}": torch.tensor([grad])}, 1.0, False))
           for i, s in enumerate(shards)]
pulled = {}
for future in futures:
    values, _ = future.wait()
    pulled.update({k: v.item() for k, v in values.items()})
owners = [s.owner().name for s in shards]
for s in shards:
    rpc.rpc_sync(s.owner(), ParameterShard.leave, args=(s,))
with open(os.path.join(os.environ["SM_MODEL_DIR"], f"rank-{topology.worker_rank}.json"), "w") as f:
    json.dump({"worker_rank": topology.worker_rank, "num_workers": topology.num_workers,
               "host": os.environ["SM_CURRENT_HOST"], "pulled": pulled, "owners": owners}, f)
print(f"[test-script] worker {topology.worker_rank} on {os.environ['SM_CURRENT_HOST']}: {pulled}", flush=True)
rpc.shutdown()

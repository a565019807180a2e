"""A parameter-server shard process: `python -m train.ps_server`, one per host.

It only joins the RPC group under its name (ps{RANK}) and waits: workers create the
parameter objects on it remotely (train.ps.ParameterShard). rpc.shutdown() returns once
every process of the job has called it, then the process exits 0.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed.rpc as rpc

from train.ps import build_rpc_options, parse_ps_topology


def main() -> int:
    topology = parse_ps_topology(os.environ)
    if topology.role != "server":
        print(f"train.ps_server: BYOC_PS_ROLE is {topology.role!r}, expected 'server'", file=sys.stderr)
        return 2
    torch.set_num_threads(1)  # the shard's math is small; leave the cores to the workers
    rpc.init_rpc(topology.rpc_name, rank=topology.rank, world_size=topology.world_size,
                 rpc_backend_options=build_rpc_options(topology))
    print(f"[ps] {topology.rpc_name} serving {topology.num_workers} workers", flush=True)
    rpc.shutdown()  # waits for every worker and shard
    return 0


if __name__ == "__main__":
    sys.exit(main())

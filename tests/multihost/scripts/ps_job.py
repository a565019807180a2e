"""A parameter-server worker for the multi-host tests (the entrypoint starts one train.ps_server
shard per host beside it): join the RPC group, leave it, then the worker on the host named by
--linger-on stays --linger-s seconds longer, writes ended-<worker rank> (the time it ends) and
exits with --exit-code: a host whose part ends after the leader's. --fail-early-on HOST: the
worker there exits 3 before joining the RPC group (everyone else waits for it there);
--abort-early-on HOST: it dies of SIGABRT there instead; --fail-once-on HOST: it exits 3 there
once, the first time (a restarted job runs through). Each worker writes done-<its rank>-<BYOC_ATTEMPT>."""
import argparse
import os
import sys
import time

import torch.distributed.rpc as rpc

from train.ps import build_rpc_options, parse_ps_topology

parser = argparse.ArgumentParser()
parser.add_argument("--linger-on", default="")
parser.add_argument("--linger-s", type=float, default=0.0)
parser.add_argument("--exit-code", type=int, default=0)
parser.add_argument("--fail-early-on", default="")
parser.add_argument("--abort-early-on", default="")  # that host's worker: os.abort() before the RPC group forms
parser.add_argument("--fail-once-on", default="")
args = parser.parse_args()
if os.environ["SM_CURRENT_HOST"] == args.fail_once_on:
    try:
        os.close(os.open(os.path.join(os.environ["SM_MODEL_DIR"], "failed-once"), os.O_CREAT | os.O_EXCL))
        print("[test-script] failing once, before the RPC group forms", flush=True)
        sys.exit(3)
    except FileExistsError:
        pass
if os.environ["SM_CURRENT_HOST"] == args.abort_early_on:
    os.abort()
if os.environ["SM_CURRENT_HOST"] == args.fail_early_on:
    print("[test-script] failing before the RPC group forms", flush=True)
    sys.exit(3)
topology = parse_ps_topology(os.environ)
rpc.init_rpc(topology.rpc_name, rank=topology.rank, world_size=topology.world_size,
             rpc_backend_options=build_rpc_options(topology, timeout_s=60))
rpc.shutdown()
with open(os.path.join(os.environ["SM_MODEL_DIR"], f"done-{topology.worker_rank}-{os.environ.get('BYOC_ATTEMPT')}"), "w"):
    pass
if os.environ["SM_CURRENT_HOST"] == args.linger_on:
    time.sleep(args.linger_s)
    with open(os.path.join(os.environ["SM_MODEL_DIR"], f"ended-{topology.worker_rank}"), "w") as f:
        f.write(repr(time.time()))
    sys.exit(args.exit_code)

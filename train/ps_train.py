"""Parameter-server training worker (torch.distributed.rpc): pushes gradients to the PS
shards and pulls the updated parameters every step. Synchronous by default
(--ps_mode async for asynchronous updates). Worker 0 creates the shards and saves the model.

Launched by the entrypoint's parameter-server mode, or locally by jobs.ps_local:
    python -m jobs.ps_local --hosts 2 --workers-per-host 1 -- python -m train.ps_train --epochs 5
"""

from __future__ import annotations

from typing import Mapping

import torch
import torch.distributed.rpc as rpc

from train.backend import Backend, to_cpu
from train.channels import ShardPlan
from train.config import TrainConfig
from train.devices import probe_device, probe_device_type, setup_cpu
from train.models import unwrap
from train.ps import JobDirectory, ParameterShard, PSTopology, build_rpc_options, build_shard_plan, parse_ps_topology
from train.ranks import parse_rank_info
from train.script import run_script


class PSWorkerBackend(Backend):
    name = "ps"

    def __init__(self, config: TrainConfig, topology: PSTopology, device: torch.device, environ: Mapping[str, str]):
        super().__init__(parse_rank_info(environ), device)
        self.config, self.topology = config, topology
        self.shards: list = []
        self.plan: tuple[tuple[str, ...], ...] = ()
        self.model: torch.nn.Module | None = None
        self.stop_from_servers = False
        self.stop_request = None  # set by the loop: SIGTERM seen here

    # Workers do not talk to each other: no collective, each evaluates the whole validation set.
    def eval_shard(self, shard: ShardPlan) -> ShardPlan:
        return ShardPlan(0, 1, "world")

    def agree_stop(self, local_stop: bool) -> bool:
        # Synchronous rounds hand every worker the same flag, so all stop at the same step.
        if self.config.ps_mode == "sync":
            return self.stop_from_servers
        return local_stop or self.stop_from_servers

    def prepare(self, model, optimizer, start_step, checkpoint):
        self.model = unwrap(model)
        if self.topology.worker_rank == 0:
            sizes = {n: p.numel() for n, p in self.model.named_parameters()}
            self.plan = build_shard_plan(sizes, len(self.topology.servers))
            named = dict(self.model.named_parameters())
            saved_state = (checkpoint or {}).get("ps_optimizer") or {}
            options = {"lr": optimizer.param_groups[0]["lr"], "momentum": self.config.momentum,
                       "weight_decay": self.config.weight_decay}
            self.shards = [
                rpc.remote(server, ParameterShard, args=(
                    {n: named[n].detach().cpu() for n in names}, self.config.optimizer, options,
                    {n: saved_state[n] for n in names if n in saved_state},
                    self.topology.num_workers, self.config.ps_mode))
                for server, names in zip(self.topology.servers, self.plan)]
            entry = {"shards": self.shards, "plan": self.plan, "start_step": start_step}
            rpc.rpc_sync(self.topology.servers[0], JobDirectory.publish, args=(entry,))
        else:
            entry = rpc.rpc_sync(self.topology.servers[0], JobDirectory.fetch)
            self.shards, self.plan, start_step = entry["shards"], entry["plan"], entry["start_step"]
        for shard in self.shards:
            self._load(rpc.rpc_sync(shard.owner(), ParameterShard.pull, args=(shard,)))
        return model, optimizer, start_step

    def _load(self, values: dict[str, torch.Tensor]) -> None:
        named = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, value in values.items():
                named[name].copy_(value)

    def backward_step(self, loss, optimizer, scaler, lr):
        if scaler is not None:
            raise ValueError("the parameter server trains in fp32/bf16; --precision fp16 needs loss scaling")
        self.model.zero_grad(set_to_none=True)
        loss.backward()
        wire = {"none": None, "fp16": torch.float16, "bf16": torch.bfloat16}[self.config.grad_compression]
        named = dict(self.model.named_parameters())
        stop = bool(self.stop_request and self.stop_request.requested)
        futures = []
        for shard, names in zip(self.shards, self.plan):
            grads = {}
            for n in names:
                g = named[n].grad if named[n].grad is not None else torch.zeros_like(named[n])
                grads[n] = g.detach().to("cpu", dtype=wire or g.dtype)
            futures.append(rpc.rpc_async(shard.owner(), ParameterShard.push_pull, args=(shard, grads, lr, stop)))
        for future in futures:
            values, server_stop = future.wait()
            self._load(values)
            self.stop_from_servers = self.stop_from_servers or server_stop

    def checkpoint_state(self, model, optimizer):
        if self.topology.worker_rank != 0:
            return None
        states = {}
        for shard in self.shards:
            states.update(rpc.rpc_sync(shard.owner(), ParameterShard.state, args=(shard,)))
        return {"model": to_cpu(unwrap(model).state_dict()), "optimizer": None, "ps_optimizer": states}

    def finish(self):
        for shard in self.shards:
            rpc.rpc_sync(shard.owner(), ParameterShard.leave, args=(shard,))
        self.shards = []
        rpc.shutdown()

    def abort(self):
        rpc.shutdown(graceful=False)  # the others learn of it as failed RPCs, not a hang


def build_ps_backend(config: TrainConfig, environ: Mapping[str, str]) -> PSWorkerBackend:
    topology = parse_ps_topology(environ)
    if topology.role != "worker":
        raise ValueError("train.ps_train is the worker; PS shards run `python -m train.ps_server`")
    if config.sync_batchnorm:
        raise ValueError("--sync_batchnorm is available with train.ddp_train and train.horovod_train")
    device_type = probe_device_type(environ)
    if device_type == "xla":
        raise RuntimeError("the parameter-server trainer does not run on Trainium; use train.ddp_train")
    backend_ranks = parse_rank_info(environ)
    cpu_plan = setup_cpu(environ, backend_ranks, config.cpu_binding) if device_type == "cpu" else None
    device = probe_device(device_type, topology.local_rank)
    rpc.init_rpc(topology.rpc_name, rank=topology.rank, world_size=topology.world_size,
                 rpc_backend_options=build_rpc_options(topology))
    backend = PSWorkerBackend(config, topology, device, environ)
    backend.cpu_plan = cpu_plan
    return backend


def main(argv=None) -> None:
    run_script(build_ps_backend, argv)


if __name__ == "__main__":
    main()

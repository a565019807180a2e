"""A parameter server on torch.distributed.rpc: the objects that live on the PS processes,
and the launch contract they share with the entrypoint.

Topology (what the entrypoint's parameter-server launch sets, built in one place,
entrypoint.decide.launchers.parameter_server.build_parameter_server_processes, which jobs/ps_local.py
reuses on one machine;
parse_ps_topology reads it back): ranks 0..H-1 are PS shards (`ps{i}`, one per host, each running
`python -m train.ps_server`), ranks H.. are workers (`worker{k}`) running the training script.
Every process has MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK, BYOC_PS_ROLE,
BYOC_PS_SERVERS, BYOC_NUM_WORKERS (and workers BYOC_WORKER_RANK).

Worker 0 creates one ParameterShard per PS process with rpc.remote (the parameters split
by size across shards) and publishes the shard references on ps0's JobDirectory; the other
workers fetch them there. Each step a worker pushes its gradients to every shard and gets
the updated parameters back:
  sync  (default): a shard waits for the gradients of every active worker for the step,
        averages them, takes one optimizer step, and answers all of them with the same
        parameters: the same arithmetic as an allreduce trainer.
  async: a shard applies each worker's gradient (divided by the number of workers) as it
        comes and answers at once; workers never wait for each other.
A worker that finishes calls `leave`, so the others' rounds no longer wait for it.
Only parameters live on the shards; buffers (BatchNorm statistics) stay on each worker.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Mapping

import torch
import torch.distributed.rpc as rpc


@dataclass(frozen=True)
class PSTopology:
    role: str  # "server" | "worker"
    rank: int
    world_size: int
    servers: tuple[str, ...]
    num_workers: int
    worker_rank: int | None
    local_rank: int

    @property
    def rpc_name(self) -> str:
        return f"ps{self.rank}" if self.role == "server" else f"worker{self.worker_rank}"


def parse_ps_topology(environ: Mapping[str, str]) -> PSTopology:
    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "BYOC_PS_ROLE",
                           "BYOC_PS_SERVERS", "BYOC_NUM_WORKERS") if not environ.get(k)]
    if missing:
        raise ValueError(f"parameter-server launch: missing {', '.join(missing)}")
    role = environ["BYOC_PS_ROLE"]
    if role not in ("server", "worker"):
        raise ValueError(f"BYOC_PS_ROLE={role!r}: expected server or worker")
    servers = tuple(s for s in environ["BYOC_PS_SERVERS"].split(",") if s)
    rank, world, workers = int(environ["RANK"]), int(environ["WORLD_SIZE"]), int(environ["BYOC_NUM_WORKERS"])
    if world != len(servers) + workers:
        raise ValueError(f"WORLD_SIZE={world} but {len(servers)} servers + {workers} workers")
    if servers != tuple(f"ps{i}" for i in range(len(servers))):
        raise ValueError(f"BYOC_PS_SERVERS={environ['BYOC_PS_SERVERS']!r}: expected ps0,ps1,...")
    worker_rank = None
    if role == "server" and not 0 <= rank < len(servers):
        raise ValueError(f"a PS shard has RANK 0..{len(servers) - 1}, got {rank}")
    if role == "worker":
        worker_rank = int(environ.get("BYOC_WORKER_RANK", rank - len(servers)))
        if worker_rank != rank - len(servers) or not 0 <= worker_rank < workers:
            raise ValueError(f"worker RANK={rank} does not match BYOC_WORKER_RANK={worker_rank}")
    return PSTopology(role, rank, world, servers, workers, worker_rank, int(environ.get("LOCAL_RANK", "0")))


def build_rpc_options(topology: PSTopology, timeout_s: float = 1800.0) -> rpc.TensorPipeRpcBackendOptions:
    # A synchronous round parks one request per worker on each shard until the last arrives:
    # the shard needs more handler threads than workers (async_execution keeps this small).
    threads = max(16, 2 * topology.num_workers + 4)
    # TCP (uv) works within and across hosts alike; the shared-memory transports busy-poll,
    # which starves the ranks when processes outnumber cores.
    return rpc.TensorPipeRpcBackendOptions(num_worker_threads=threads, rpc_timeout=timeout_s,
                                           init_method="env://", _transports=["uv"], _channels=["basic"])


def build_shard_plan(sizes: Mapping[str, int], num_servers: int) -> tuple[tuple[str, ...], ...]:
    """Parameter names per shard: largest first onto the least loaded shard (ties: lower
    index, then name), so the plan is the same on every worker."""
    loads = [0] * num_servers
    plan: list[list[str]] = [[] for _ in range(num_servers)]
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        target = min(range(num_servers), key=lambda i: (loads[i], i))
        plan[target].append(name)
        loads[target] += sizes[name]
    return tuple(tuple(names) for names in plan)


def build_server_optimizer(kind: str, params: list[torch.Tensor], options: Mapping) -> torch.optim.Optimizer:
    if kind == "adam":
        return torch.optim.Adam(params, lr=options["lr"], weight_decay=options["weight_decay"])
    return torch.optim.SGD(params, lr=options["lr"], momentum=options["momentum"],
                           weight_decay=options["weight_decay"])


class ParameterShard:
    """Some of the model's parameters and their optimizer, on one PS process."""

    def __init__(self, params: dict[str, torch.Tensor], optimizer: str, options: dict,
                 optimizer_state: dict[str, dict] | None, num_workers: int, mode: str):
        if mode not in ("sync", "async"):
            raise ValueError(f"mode {mode!r}: expected sync or async")
        self.names = list(params)
        self.params = {n: torch.nn.Parameter(t.detach().clone().float()) for n, t in params.items()}
        self.optimizer = build_server_optimizer(optimizer, list(self.params.values()), options)
        for name, state in (optimizer_state or {}).items():
            if name in self.params:
                self.optimizer.state[self.params[name]] = {k: (v.clone() if torch.is_tensor(v) else v)
                                                           for k, v in state.items()}
        self.mode, self.active, self.lr = mode, num_workers, float(options["lr"])
        self.lock = threading.Lock()
        self.sums: dict[str, torch.Tensor] | None = None
        self.waiting: list[torch.futures.Future] = []
        self.stop = False
        self.rounds = 0

    def _snapshot(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in self.params.items()}

    def _apply(self, grads: dict[str, torch.Tensor], scale: float, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        for name, p in self.params.items():
            p.grad = grads[name].float().mul_(scale) if scale != 1.0 else grads[name].float()
        self.optimizer.step()
        self.rounds += 1

    def _finish_round(self) -> None:
        # Caller holds the lock; waiting workers all get the same parameters.
        self._apply(self.sums, 1.0 / len(self.waiting), self.lr)
        answer = (self._snapshot(), self.stop)
        waiting, self.waiting, self.sums = self.waiting, [], None
        for future in waiting:
            future.set_result(answer)

    @staticmethod
    @rpc.functions.async_execution
    def push_pull(shard_rref, grads: dict[str, torch.Tensor], lr: float, stop: bool) -> torch.futures.Future:
        self: ParameterShard = shard_rref.local_value()
        future: torch.futures.Future = torch.futures.Future()
        with self.lock:
            self.stop = self.stop or stop
            if self.mode == "async":
                self._apply(grads, 1.0 / self.active, lr)
                future.set_result((self._snapshot(), self.stop))
                return future
            if self.sums is None:
                self.sums = {n: g.detach().float().clone() for n, g in grads.items()}
            else:
                for n, g in grads.items():
                    self.sums[n] += g.float()
            self.lr = lr
            self.waiting.append(future)
            if len(self.waiting) >= self.active:
                self._finish_round()
        return future

    @staticmethod
    def pull(shard_rref) -> dict[str, torch.Tensor]:
        self: ParameterShard = shard_rref.local_value()
        with self.lock:
            return self._snapshot()

    @staticmethod
    def leave(shard_rref) -> None:
        self: ParameterShard = shard_rref.local_value()
        with self.lock:
            self.active -= 1
            if self.waiting and len(self.waiting) >= self.active:
                self._finish_round()

    @staticmethod
    def state(shard_rref) -> dict[str, dict]:
        """{name: optimizer state of that parameter}, for checkpoints."""
        self: ParameterShard = shard_rref.local_value()
        with self.lock:
            return {n: {k: (v.clone() if torch.is_tensor(v) else v) for k, v in self.optimizer.state[p].items()}
                    for n, p in self.params.items() if p in self.optimizer.state}


class JobDirectory:
    """On ps0: where worker 0 publishes the shards (and the step to start at) for the others."""

    _lock = threading.Lock()
    _published: dict | None = None
    _waiting: list[torch.futures.Future] = []

    @staticmethod
    def publish(entry: dict) -> None:
        with JobDirectory._lock:
            JobDirectory._published = entry
            waiting, JobDirectory._waiting = JobDirectory._waiting, []
        for future in waiting:
            future.set_result(entry)

    @staticmethod
    @rpc.functions.async_execution
    def fetch() -> torch.futures.Future:
        future: torch.futures.Future = torch.futures.Future()
        with JobDirectory._lock:
            if JobDirectory._published is None:
                JobDirectory._waiting.append(future)
                return future
        future.set_result(JobDirectory._published)
        return future

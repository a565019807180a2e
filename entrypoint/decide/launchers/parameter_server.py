"""The parameter-server family: a torch.distributed.rpc server shard and the worker processes
on every host. Its plan (the processes), its roles (roles/job_port.py, each host on its job
port), whether it restarts (every host's entrypoint, together: every process is its own), and
its wording."""

from __future__ import annotations

from entrypoint.decide import topology
from entrypoint.decide.distribution import Distribution
from entrypoint.decide.launch_plan import (LaunchPlan, PlanBasis, Role, build_job_port_env, build_plan,
                                           decide_distribution_processes, decide_job_port_role,
                                           describe_job_port_restarts)
from entrypoint.decide.specs import ProcessSpec
from entrypoint.job.probe import MachineFacts
from entrypoint.settings import LaunchSettings

NAME = "parameter-server"
KINDS = ("parameter_server",)
ROLES = (Role.PARAMETER_SERVER,)


def describe(plan: LaunchPlan) -> str:
    return f"the parameter-server job on {len(plan.hosts)} host(s)"


def decide_relaunched(plan: LaunchPlan) -> bool:
    return True


def describe_restart_limits(settings: LaunchSettings, host_count: int) -> list[str]:
    return describe_job_port_restarts(settings, host_count, "the parameter server's processes")


def decide_role(plan: LaunchPlan) -> tuple[str, str, dict]:
    return decide_job_port_role(plan, watch_rendezvous=False)


def decide_host_processes(topo: topology.Topology) -> dict[str, int]:
    return decide_distribution_processes(topo, beside=1)  # each host's PS shard is a process too


def decide_plan(shared: PlanBasis, dist: Distribution, facts: MachineFacts, launcher_kind: str,
                program_argv: tuple[str, ...], launcher_env: dict[str, str]) -> LaunchPlan:
    launcher_env = {**launcher_env, **build_job_port_env(shared.job, shared.topo, shared.settings)}
    processes = build_parameter_server_processes(shared.runtime.python, shared.topo, program_argv)
    return build_plan(shared, Role.PARAMETER_SERVER, processes, launcher_env)


def build_parameter_server_processes(
    python: str,
    topo: topology.Topology,
    program_argv: tuple[str, ...],
) -> tuple[ProcessSpec, ...]:
    """One PS shard per host (torch.distributed.rpc ranks 0..H-1) plus the worker processes
    (ranks H..). Rendezvous: MASTER_ADDR/MASTER_PORT from the plan's env."""
    host_index, workers_per_host = topo.node_rank, topo.processes_per_host
    n_hosts = len(topo.distribution_hosts)
    n_workers = n_hosts * workers_per_host
    common = (
        ("WORLD_SIZE", str(n_hosts + n_workers)),
        ("BYOC_PS_SERVERS", ",".join(f"ps{i}" for i in range(n_hosts))),
        ("BYOC_NUM_WORKERS", str(n_workers)),
    )
    server = ProcessSpec(
        name=f"ps{host_index}",
        argv=(python, "-m", "train.ps_server"),
        env=common + (("RANK", str(host_index)), ("LOCAL_RANK", "0"), ("BYOC_PS_ROLE", "server")),
        # Not the code folder: a user's train.py there would shadow our train package.
        cwd="/",
    )
    workers = []
    for local in range(workers_per_host):
        worker_rank = host_index * workers_per_host + local
        workers.append(
            ProcessSpec(
                name=f"worker{worker_rank}",
                argv=program_argv,
                env=common
                + (
                    ("RANK", str(n_hosts + worker_rank)),
                    ("LOCAL_RANK", str(local)),
                    ("BYOC_PS_ROLE", "worker"),
                    ("BYOC_WORKER_RANK", str(worker_rank)),
                ),
            )
        )
    return (server, *workers)

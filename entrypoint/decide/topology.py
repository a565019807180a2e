"""The job's topology, decided once (pure): which hosts take part in the distribution, who
leads it, this host's place in it, the network interface, processes per host. plan.py,
smenv.py and the launchers' argv all read the one Topology made by decide_topology."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from entrypoint.errors import JobDefinitionError
from entrypoint.job.config import JobConfig

if TYPE_CHECKING:  # sdk_v3_mpirun imports choose_interface alone: keep its start light
    from entrypoint.decide.distribution import Distribution
    from entrypoint.job.probe import MachineFacts

# Framework parameters whose truthiness makes the current group a distribution group when
# sagemaker_distribution_instance_groups is absent (the toolkit's list, kept for parity).
DISTRIBUTION_ENABLED_KEYS = (
    "sagemaker_mpi_enabled",
    "sagemaker_parameter_server_enabled",
    "sagemaker_distributed_dataparallel_enabled",
    "sagemaker_pytorch_ddp_enabled",
    "sagemaker_pytorch_xla_multi_worker_enabled",
    "sagemaker_multi_worker_mirrored_strategy_enabled",
    "sagemaker_torch_distributed_enabled",
)


def distribution_instance_groups(job: JobConfig) -> list[str]:
    if job.sdk_v3 is not None:  # v3's drivers use every host of the job (SM_HOSTS)
        return [g.name for g in job.resource.instance_groups]
    framework = job.hyperparameters.framework
    if "sagemaker_distribution_instance_groups" in framework:
        return framework["sagemaker_distribution_instance_groups"]
    if any(framework.get(k, False) for k in DISTRIBUTION_ENABLED_KEYS):
        return [job.resource.current_group_name]
    return []


def distribution_hosts(job: JobConfig) -> list[str]:
    """Hosts of the distribution groups, in the order SageMaker lists them; every host when
    the resource config has no instance groups (local mode)."""
    groups = job.resource.instance_groups
    if not groups:
        return list(job.resource.hosts)
    wanted = distribution_instance_groups(job)
    hosts: list[str] = []
    for group in groups:
        if group.name in wanted:
            hosts.extend(group.hosts)
    return hosts


def leader_host(job: JobConfig) -> str:
    hosts = distribution_hosts(job)
    return hosts[0] if hosts else job.resource.hosts[0]


def current_group_hosts(job: JobConfig) -> list[str]:
    for group in job.resource.instance_groups:
        if group.name == job.resource.current_group_name:
            return list(group.hosts)
    return []


def choose_interface(configured: str, present: tuple[str, ...]) -> tuple[str, str | None]:
    """The interface to use and, when it is not the configured one, why.

    SDK v3 local mode writes "ethwe", which does not exist in a local container; NCCL and
    Open MPI then fail. Fall back to eth0, then to the first non-loopback interface."""
    if configured in present or not present:
        return configured, None
    if "eth0" in present:
        return "eth0", f'network interface "{configured}" does not exist here; using eth0'
    others = [i for i in present if i != "lo"]
    fallback = others[0] if others else "lo"
    return fallback, (
        f'network interface "{configured}" does not exist here and neither does eth0; '
        f"using {fallback}"
    )


# SageMaker local mode's GPU instance type: every host is a container on this one machine.
LOCAL_GPU_INSTANCE = "local_gpu"


def decide_gpu_share(job: JobConfig, facts: MachineFacts) -> tuple[tuple[str, ...] | None, str | None]:
    """This host's share of the machine's GPUs when local mode runs several hosts on one
    machine (`instance_type="local_gpu"`, `instance_count` > 1): each container sees every GPU,
    and without a share algo-2 would start as many ranks as algo-1 on the same GPUs (NCCL:
    "Duplicate GPU detected"). (the share, a note for the plan), or (None, None) elsewhere."""
    resource = job.resource
    if resource.current_instance_type != LOCAL_GPU_INSTANCE:
        return None, None
    return decide_local_share(tuple(resource.hosts), resource.current_host, facts.gpu_count,
                              job.environ.get("CUDA_VISIBLE_DEVICES"))


def decide_local_share(hosts: tuple[str, ...], current_host: str, gpu_count: int,
                       visible: str | None) -> tuple[tuple[str, ...] | None, str | None]:
    """The GPUs (the CUDA_VISIBLE_DEVICES list when set, else 0..gpu_count-1) cut into equal
    consecutive shares in the hosts' order: the same cut on every host, since each sees the
    same list. One host's share is the whole list: the job's CUDA_VISIBLE_DEVICES counts for its
    processes and SM_NUM_GPUS as it does for several hosts'. (current_host's share, a note), or
    (None, None) for one host without the variable or no GPU."""
    if (len(hosts) < 2 and visible is None) or not gpu_count:
        return None, None
    gpus = tuple(g.strip() for g in visible.split(",") if g.strip()) if visible is not None else tuple(
        str(i) for i in range(gpu_count))
    if not gpus:
        return None, None
    if len(hosts) < 2:
        return gpus, (f"local mode: CUDA_VISIBLE_DEVICES={','.join(gpus)}: this host uses {len(gpus)} of the "
                      f"machine's {gpu_count} GPU(s), one process each (SM_NUM_GPUS={len(gpus)})")
    per = len(gpus) // len(hosts)
    if per == 0:
        raise JobDefinitionError(
            f"Local mode runs the job's {len(hosts)} hosts on this one machine, which has {len(gpus)} GPU(s): not one "
            f"GPU for each host, and ranks of two hosts on one GPU stop NCCL (\"Duplicate GPU detected\"). Use "
            f"instance_count={len(gpus)} or fewer with instance_type=\"local_gpu\", or instance_type=\"local\" (CPU).")
    index = hosts.index(current_host)
    share = gpus[index * per:(index + 1) * per]
    unused = len(gpus) - per * len(hosts)
    note = (f"local mode: the job's {len(hosts)} hosts share this machine's {len(gpus)} GPUs, {per} each; "
            f"{current_host} takes GPU(s) {','.join(share)} (CUDA_VISIBLE_DEVICES)"
            + (f"; {unused} left unused" if unused else ""))
    return share, note


def decide_processes_per_host(dist: Distribution, facts: MachineFacts,
                              gpu_share: tuple[str, ...] | None = None) -> tuple[int, str | None]:
    gpus = len(gpu_share) if gpu_share is not None else facts.gpu_count
    if dist.processes_per_host is not None:
        if gpu_share is not None and dist.processes_per_host > gpus:
            return dist.processes_per_host, (
                f"{dist.processes_per_host} processes per host on this host's {gpus} GPU(s) in local mode: ranks share "
                f"GPUs, which NCCL refuses (\"Duplicate GPU detected\")")
        return dist.processes_per_host, None
    if gpus:
        return gpus, None
    if facts.neuron_core_count:
        return facts.neuron_core_count, None
    from entrypoint.decide.distribution import ONE_PER_GPU  # the SDK's words are distribution.py's

    if dist.launcher in ONE_PER_GPU:
        return 1, f"{dist.launcher} normally runs one process per GPU; no GPU here, so 1 process per host"
    return 1, None


class Topology(NamedTuple):
    hosts: tuple[str, ...]  # every host of the job, in SageMaker's order
    current_host: str
    distribution_hosts: tuple[str, ...]  # the hosts taking part in the distribution
    distribution_groups: tuple[str, ...]  # their instance groups
    current_group_hosts: tuple[str, ...]  # the hosts of this host's instance group
    leader: str  # the first distribution host (every host when there are no groups)
    interface: str  # the network interface the launchers and collectives use
    processes_per_host: int  # of a distributed launch
    interface_note: str | None = None  # why the interface is not the configured one
    processes_per_host_note: str | None = None  # why processes_per_host is not what was asked
    gpu_share: tuple[str, ...] | None = None  # this host's GPUs when local mode shares one machine
    gpu_share_note: str | None = None

    @property
    def in_distribution(self) -> bool:
        return self.current_host in self.distribution_hosts

    @property
    def node_rank(self) -> int:
        """This host's index among the distribution hosts (torchrun's --node_rank)."""
        return self.distribution_hosts.index(self.current_host)

    @property
    def world_size(self) -> int:
        return len(self.distribution_hosts) * self.processes_per_host

    @property
    def is_leader(self) -> bool:
        return self.current_host == self.leader


def decide_topology(job: JobConfig, facts: MachineFacts, dist: Distribution) -> Topology:
    interface, interface_note = choose_interface(job.resource.network_interface_name, facts.interfaces)
    gpu_share, gpu_share_note = decide_gpu_share(job, facts)
    pph, pph_note = decide_processes_per_host(dist, facts, gpu_share)
    return Topology(
        hosts=tuple(job.resource.hosts),
        current_host=job.resource.current_host,
        distribution_hosts=tuple(distribution_hosts(job)),
        distribution_groups=tuple(distribution_instance_groups(job)),
        current_group_hosts=tuple(current_group_hosts(job)),
        leader=leader_host(job),
        interface=interface,
        processes_per_host=pph,
        interface_note=interface_note,
        processes_per_host_note=pph_note,
        gpu_share=gpu_share,
        gpu_share_note=gpu_share_note,
    )


def build_gpu_share_env(topo: Topology) -> dict[str, str]:
    return {"CUDA_VISIBLE_DEVICES": ",".join(topo.gpu_share)} if topo.gpu_share is not None else {}

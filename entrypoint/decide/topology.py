"""The job's topology, decided once (pure): which hosts take part in the distribution, who
leads it, this host's place in it, the network interface, processes per host. plan.py,
smenv.py and the launchers' argv all read the one Topology made by decide_topology."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

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


def decide_processes_per_host(dist: Distribution, facts: MachineFacts) -> tuple[int, str | None]:
    if dist.processes_per_host is not None:
        return dist.processes_per_host, None
    if facts.gpu_count:
        return facts.gpu_count, None
    if facts.neuron_core_count:
        return facts.neuron_core_count, None
    if dist.launcher in ("pytorchddp", "smdataparallel"):
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
    pph, pph_note = decide_processes_per_host(dist, facts)
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
    )

"""Which hosts take part in the distributed job, and who leads it (pure)."""

from __future__ import annotations

from entrypoint.config import JobConfig

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

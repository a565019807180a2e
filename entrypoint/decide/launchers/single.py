"""The one-process family: the script once on this host (no distribution), or on a host
outside the distribution's instance groups (as the toolkit does). Its plan, its role (the one
host's, roles/single.py), whether it restarts (every process is this host's: yes), and its
wording."""

from __future__ import annotations

from entrypoint.decide.distribution import Distribution
from entrypoint.decide.launch_plan import (ONE_HOST_ROLE, LaunchPlan, PlanBasis, Role, build_plan,
                                           build_rendezvous_env)
from entrypoint.decide.specs import ProcessSpec
from entrypoint.decide.topology import Topology
from entrypoint.job.probe import MachineFacts
from entrypoint.settings import LaunchSettings

NAME = "single"
KINDS = ("process",)
ROLES = (Role.SINGLE, Role.OUTSIDE_DISTRIBUTION)


def describe(plan: LaunchPlan) -> str:
    if plan.role == Role.SINGLE:
        return f"{plan.entry.program}"
    return f"{plan.entry.program} ({plan.role})"


def decide_relaunched(plan: LaunchPlan) -> bool:
    return True


def describe_restart_limits(settings: LaunchSettings, host_count: int) -> list[str]:
    return []


def decide_role(plan: LaunchPlan) -> tuple[str, str, dict]:
    return ONE_HOST_ROLE


def decide_host_processes(topo: Topology) -> dict[str, int]:
    """The script once on every host of a one-process job."""
    return {h: 1 for h in topo.hosts}


def decide_takes_host(dist: Distribution, topo) -> bool:
    """This family runs here, whatever the job's launcher: a one-process job, or a host outside
    the distribution's instance groups."""
    return dist.launcher in KINDS or not topo.in_distribution


def decide_plan(shared: PlanBasis, dist: Distribution, facts: MachineFacts, launcher_kind: str,
                program_argv: tuple[str, ...], launcher_env: dict[str, str]) -> LaunchPlan:
    """The script once: the job's one process (launcher "process"), or a host outside the
    distribution, whatever its launcher."""
    job, topo = shared.job, shared.topo
    rendezvous_env = build_rendezvous_env(job, topo, shared.settings)
    script = (ProcessSpec("script", program_argv),)
    if dist.launcher in KINDS:
        return build_plan(shared, Role.SINGLE, script, rendezvous_env, hosts=(job.resource.current_host,))
    shared.notes.append(
        f"{job.resource.current_host} is in instance group \"{job.resource.current_group_name}\", "
        f"outside the distribution's groups ({', '.join(topo.distribution_groups)}); "
        f"running the script once here, as the toolkit does"
    )
    return build_plan(shared, Role.OUTSIDE_DISTRIBUTION, script, rendezvous_env)

"""The one switch on plan.role: this host's role, chosen once from the plan. A 1-host job
imports only single.py; the multi-host roles only when the launch has several hosts."""

from __future__ import annotations

from entrypoint.decide.plan import LaunchPlan, Role
from entrypoint.roles.base import HostRole
from entrypoint.roles.single import SingleHost

# Roles whose entrypoint starts the job's processes again after a failure (restarts.py): one
# whose every process it starts (a relaunch here is a relaunch of the whole job), and every host
# of a job-port launch, on its leader's word (roles/attempts.py). torchrun on one host restarts
# its own ranks; an MPI worker's are mpirun's.
RELAUNCHED_ROLES = (Role.SINGLE, Role.OUTSIDE_DISTRIBUTION, Role.MPI_LEADER, Role.PARAMETER_SERVER)


def decide_relaunched(plan: LaunchPlan) -> bool:
    return plan.role in RELAUNCHED_ROLES or plan.role == Role.TORCHRUN and plan.multi_host


def describe(plan: LaunchPlan) -> str:
    if plan.role == Role.SINGLE:
        return f"{plan.entry.program}"
    if plan.role == Role.MPI_LEADER:
        return f"mpirun on {len(plan.hosts)} host(s)"
    if plan.role == Role.TORCHRUN:
        return f"torchrun on {len(plan.hosts)} host(s)"
    if plan.role == Role.PARAMETER_SERVER:
        return f"the parameter-server job on {len(plan.hosts)} host(s)"
    return f"{plan.entry.program} ({plan.role})"


def choose_role(plan: LaunchPlan, collector, env: dict[str, str], paths, stop) -> HostRole:
    args = (plan, collector, env, paths, stop, describe(plan), decide_relaunched(plan))
    if plan.role != Role.MPI_WORKER and not plan.multi_host:
        return SingleHost(*args)
    if plan.role in (Role.MPI_WORKER, Role.MPI_LEADER):
        from entrypoint.roles import mpi  # multi-host paths only: a 1-host job never imports it

        return mpi.MpiWorker(*args) if plan.role == Role.MPI_WORKER else mpi.MpiLeader(*args)
    from entrypoint.roles import job_port

    if plan.is_leader:
        return job_port.JobPortLeader(*args)
    return job_port.JobPortWorker(*args, watch_rendezvous=plan.role == Role.TORCHRUN)

"""The launcher families, one module each, and the one registry that names them. Each module
holds its family's plan (argv, processes, environment), its role on each host (decide_role:
a class of roles/, chosen by name, imported only where it runs), whether it restarts, and its
wording, under the same names:

    NAME, KINDS (the launchers of decide/distribution.py it runs), ROLES (the plan's roles)
    decide_plan(basis, dist, facts, launcher_kind, program_argv, launcher_env) -> LaunchPlan
    describe(plan)                  the job in a few words, for the log and the outcome
    decide_relaunched(plan)         whether this host's entrypoint starts a crashed attempt again
    describe_restart_limits(settings, host_count)   the plan's note on restarts, or none
    decide_role(plan)               (roles module, class, keyword arguments) for this host
    decide_host_processes(topo)     what each host of the job starts (host -> processes), for
                                    the threads' share of its cores (decide/threads.py)

Adding a family is its module here, its line in FAMILIES, its role in roles/ (or one that
exists), its tests and its docs (ARCHITECTURE.md says where each goes).
"""

from __future__ import annotations

from entrypoint.decide.launch_plan import Role
from entrypoint.decide.launchers import mpirun, parameter_server, single, torchrun

FAMILIES = (single, torchrun, mpirun, parameter_server)  # one line a family


def find_family_of_kind(kind: str):
    """The family that runs a launcher kind (decide/distribution.py's names)."""
    return next(family for family in FAMILIES if kind in family.KINDS)


def find_family_of_role(role: Role):
    """The family a plan's role belongs to."""
    return next(family for family in FAMILIES if role in family.ROLES)

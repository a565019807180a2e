"""The torchrun family (torch_distributed; smdataparallel without AWS's SMDDP library): the same
torchrun on every host, a static rendezvous an attempt. Its plan (the argv), its roles (one
host's; several: roles/job_port.py, each host on its job port), whether it restarts (on one
host torchrun restarts its own ranks; on several, every host's entrypoint, together), and its
wording."""

from __future__ import annotations

from entrypoint.decide import topology
from entrypoint.decide.distribution import Distribution
from entrypoint.decide.launch_plan import (LAUNCH_TORCHRUN, RECORD_ERRORS, LaunchPlan, PlanBasis, Role, build_job_port_env,
                                           build_plan, decide_distribution_processes, decide_job_port_role,
                                           describe_job_port_restarts)
from entrypoint.decide.restarts import build_attempt_rendezvous_id
from entrypoint.decide.specs import ProcessSpec
from entrypoint.job.probe import MachineFacts
from entrypoint.settings import LaunchSettings

NAME = "torchrun"
KINDS = ("torch_distributed",)
ROLES = (Role.TORCHRUN,)


def describe(plan: LaunchPlan) -> str:
    return f"torchrun on {len(plan.hosts)} host(s)"


def decide_relaunched(plan: LaunchPlan) -> bool:
    """On several hosts every host's entrypoint restarts the job together (roles/attempts.py);
    on one, torchrun's own --max_restarts does."""
    return plan.multi_host


def describe_restart_limits(settings: LaunchSettings, host_count: int) -> list[str]:
    return describe_job_port_restarts(settings, host_count, "torchrun")


def decide_role(plan: LaunchPlan) -> tuple[str, str, dict]:
    return decide_job_port_role(plan, watch_rendezvous=True)


def decide_host_processes(topo: topology.Topology) -> dict[str, int]:
    return decide_distribution_processes(topo)


def decide_plan(shared: PlanBasis, dist: Distribution, facts: MachineFacts, launcher_kind: str,
                program_argv: tuple[str, ...], launcher_env: dict[str, str]) -> LaunchPlan:
    launcher_env = {**launcher_env, **build_job_port_env(shared.job, shared.topo, shared.settings)}
    argv = build_torchrun_argv(shared.runtime.python, shared.topo, settings=shared.settings, program_argv=program_argv)
    # On several hosts the entrypoint restarts the job: the next attempt's torchrun may import
    # torch ahead, during this one (run/held.py), off the restart's path. Not under
    # neuron_parallel_compile, whose own run of the command would hold.
    hold_at = 2 if len(shared.topo.distribution_hosts) > 1 and argv[1] == LAUNCH_TORCHRUN else 0
    return build_plan(shared, Role.TORCHRUN, (ProcessSpec("torchrun", argv, hold_at=hold_at),), launcher_env)


def decide_forked_ranks(settings: LaunchSettings, program_argv: tuple[str, ...]) -> bool:
    """Whether torchrun forks its ranks (BYOC_FORK_RANKS): a Python program under the rank
    wrapper, and not under neuron_parallel_compile, whose own runs of the command are its
    business. Python options before the wrapper (`python -X ...`) would be lost in a fork: then
    each rank starts its own interpreter, as without the setting."""
    return (settings.fork_ranks and not settings.neuron_parallel_compile and len(program_argv) > 1
            and program_argv[1] == RECORD_ERRORS)


def build_torchrun_argv(
    python: str,
    topo: topology.Topology,
    settings: LaunchSettings,
    program_argv: tuple[str, ...],
) -> tuple[str, ...]:
    """The same command on every host; node rank from the host order.

    One host: --standalone (a free local port, so two single-host jobs on one machine never
    collide). program_argv's python runs under torchrun's own interpreter."""
    argv = [python, LAUNCH_TORCHRUN]  # `python -m torch.distributed.run`, reporting signal deaths
    hosts, leader = topo.distribution_hosts, topo.leader
    if len(hosts) == 1:
        argv += ["--standalone", "--nnodes", "1"]
    else:
        # The static rendezvous, one per attempt: a restart across hosts is the entrypoint's
        # (roles/attempts.py), which starts every host's torchrun again only once every
        # process of the failed attempt is gone, with the attempt's own --rdzv_id (torchrun
        # keeps its store's keys under it). torch's elastic restarts across hosts handed a
        # restarted rank the failed attempt's peers (gloo: Connection refused / Read error).
        argv += [
            "--nnodes", str(len(hosts)),
            "--node_rank", str(topo.node_rank),
            "--master_addr", leader,
            "--master_port", str(settings.master_port),
            "--rdzv_id", build_attempt_rendezvous_id(1),
        ]
    # One host: torchrun restarts its ranks itself; several: the entrypoint does (0 here).
    restarts = settings.max_restarts if len(hosts) == 1 else 0
    argv += ["--nproc_per_node", str(topo.processes_per_host), "--max_restarts", str(restarts)]
    if program_argv[:1] == (python,) and decide_forked_ranks(settings, program_argv):
        # torchrun's own way to run a script as a function: each rank a fork of torchrun's
        # interpreter, torch already imported; the rank wrapper runs the program as it would in
        # a process of its own (rank/record_errors.is_forked_rank undoes what a fork inherits).
        argv += ["--run-path", "--start-method", "fork", *program_argv[1:]]
    elif program_argv[:1] == (python,):
        argv += list(program_argv[1:])  # torchrun starts the python itself
    else:
        argv += ["--no-python", *program_argv]
    if settings.neuron_parallel_compile:
        argv = ["neuron_parallel_compile", *argv]
    return tuple(argv)

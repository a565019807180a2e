"""Decide how to launch: one pure function from what was read to a LaunchPlan.

The plan holds exact argv tuples and the environment to add; `--dry-run` prints it and
entrypoint.orchestrate runs it. Nothing here touches the machine. What every plan shares is
decided here; the launcher family's part (argv, processes, its role) is its module's
(decide/launchers/), and the record itself is decide/launch_plan.py's.
"""

from __future__ import annotations

import os

from entrypoint.decide import threads, topology
from entrypoint.job.config import JobConfig
from entrypoint.decide.distribution import Distribution, decide_launcher_kind
from entrypoint.decide.launch_plan import (LAUNCH_TORCHRUN, RECORD_ERRORS, DISTRIBUTED_ROLES, JOB_HOST_ROLES,
                                           LaunchPlan, PlanBasis, Role, Runtime, build_hostname_env,
                                           build_launcher_env)
from entrypoint.decide.launchers import find_family_of_kind, single
from entrypoint.decide.settings import decide_capacity_stop_at
from entrypoint.decide.gpu_env import build_gpu_env
from entrypoint.decide.neuron_env import build_neuron_cache_env
from entrypoint.decide.compile_cache import decide_compile_cache
from entrypoint.job.probe import MachineFacts
from entrypoint.job.program import CodeFacts, CodeSource, build_install_steps, build_program_argv, decide_entry_point
from entrypoint.decide.smenv import build_sm_env, build_user_args
from entrypoint.decide.job_report import REPORT_DIR_ENV, decide_report_spec, decide_tensorboard_dir
from entrypoint.settings import LaunchSettings

__all__ = ["LAUNCH_TORCHRUN", "RECORD_ERRORS", "DISTRIBUTED_ROLES", "LaunchPlan", "Role", "Runtime", "decide",
           "describe_capacity_end"]


def describe_capacity_end(settings: LaunchSettings, stop_at: float | None) -> list[str]:
    from entrypoint.decide.capacity import CAPACITY_END_ENV, describe_utc

    if settings.capacity_end_unreadable is not None:
        return [f"{CAPACITY_END_ENV}={settings.capacity_end_unreadable!r} is not a time this image reads (epoch "
                f"seconds, epoch milliseconds or ISO 8601): the job is not stopped before the training plan's "
                f"capacity ends"]
    if stop_at is None:
        return []
    return [f"training plan: the capacity ends at {describe_utc(settings.capacity_ends_at)} and its instances are "
            f"terminated from 30 minutes before; every host stops its processes at {describe_utc(stop_at)} (SIGTERM, "
            f"then {settings.grace_period_s:g} s, BYOC_GRACE_PERIOD_S; BYOC_CAPACITY_STOP_LEAD_S moves it)"]


def decide(
    job: JobConfig,
    dist: Distribution,
    facts: MachineFacts,
    settings: LaunchSettings,
    runtime: Runtime,
    code: CodeSource,
    code_facts: CodeFacts,
    program: str,
) -> LaunchPlan:
    notes = list(dist.notes)
    topo = topology.decide_topology(job, facts, dist)
    if topo.interface_note:
        notes.append(topo.interface_note)
    code_dir = job.paths.code_dir
    if job.sdk_v3 is not None:  # an SDK v3 ModelTrainer job: v3's rules for the program (decide/v3_launch.py)
        from entrypoint.decide import v3_launch

        entry, program_argv, install = v3_launch.decide_v3_program(job, code_facts, runtime.python, RECORD_ERRORS)
    else:
        entry = decide_entry_point(program, code_dir, code_facts)
        program_argv = build_program_argv(entry, runtime.python, code_facts, build_user_args(job.hyperparameters.user),
                                          RECORD_ERRORS)
        install = build_install_steps(runtime.python, code_dir, code_facts)
    gpu_env, gpu_notes = build_gpu_env(job.environ, facts, topo.interface)
    notes.extend(gpu_notes)
    neuron_env, neuron_notes = build_neuron_cache_env(job.environ, facts.neuron_core_count,
                                                      settings.neuron_parallel_compile, job.checkpoint)
    notes.extend(neuron_notes)
    compile_cache, compile_env, compile_notes = decide_compile_cache(
        job.environ, job.checkpoint, job.resource.hosts.index(job.resource.current_host), settings.compile_cache,
        settings.compile_cache_max_mb, settings.compile_cache_save_every_s, settings.compile_cache_dir)
    notes.extend(compile_notes)
    launcher_kind, kind_notes = decide_launcher_kind(dist, facts)
    family = find_family_of_kind(launcher_kind)
    notes.extend(kind_notes)
    notes.extend(n for n in (topo.gpu_share_note, topo.processes_per_host_note) if n)
    notes.extend(family.describe_restart_limits(settings, len(topo.distribution_hosts)))
    capacity_stop_at = decide_capacity_stop_at(settings)
    notes.extend(describe_capacity_end(settings, capacity_stop_at))
    tensorboard_dir = decide_tensorboard_dir(settings.tensorboard, job.tensorboard_path,
                                             os.path.join(job.paths.output_dir, "tensorboard"))
    thread_env, thread_note = threads.build_thread_env(job.environ, facts, topo, job.resource.current_instance_type,
                                                       family.decide_host_processes(topo))
    notes.append(thread_note)
    report = decide_report_spec(settings.report, settings.report_interval_s, runtime.files.folder, facts.gpu_count,
                                facts.neuron_core_count, tensorboard_dir, settings.live_interval_s,
                                settings.status_interval_s)
    report_env = {REPORT_DIR_ENV: report.rank_folder} if report else {}
    sm_env = build_sm_env(job, facts, topo)
    if job.sdk_v3 is not None:
        sm_env.update(v3_launch.build_v3_env(job, topo, sm_env, settings.master_port))
    shared = PlanBasis(job, topo, dist.launcher, code, entry, install,
                     {**sm_env, **gpu_env, **topology.build_gpu_share_env(topo), **neuron_env,
                      **compile_env, **report_env, **thread_env}, settings, runtime, notes, capacity_stop_at)
    plan = decide_role_plan(shared, dist, facts, launcher_kind, program_argv)._replace(report=report,
                                                                                       compile_cache=compile_cache)
    return decide_health_check(plan, job, facts, topo, runtime.python) if settings.health_check else plan


def decide_health_check(plan: LaunchPlan, job: JobConfig, facts: MachineFacts, topo: topology.Topology,
                        python: str) -> LaunchPlan:
    """BYOC_HEALTH_CHECK=deep: the check's processes on this host, in the plan. The hosts of a
    distributed launch check together (across hosts too); any other host checks on its own."""
    from entrypoint.decide import health

    together = plan.role in JOB_HOST_ROLES
    hosts = topo.distribution_hosts if together else (plan.current_host,)
    ranks = (len(topo.gpu_share) if topo.gpu_share else facts.gpu_count) or topo.processes_per_host
    why_not = health.decide_not_run(facts.gpu_count, facts.neuron_core_count, len(hosts), ranks)
    if why_not:
        return plan._replace(notes=plan.notes + (why_not,))
    check = health.build_health_check(plan.settings, python, job.resource.current_instance_type, hosts,
                                      plan.current_host, topo.leader, ranks, bool(facts.gpu_count), plan.files.folder)
    return plan._replace(health_check=check, notes=plan.notes + (health.describe_health_check(check),))


def decide_role_plan(shared: PlanBasis, dist: Distribution, facts: MachineFacts, launcher_kind: str,
                     program_argv: tuple[str, ...]) -> LaunchPlan:
    """The plan's second half, the launcher family's (decide/launchers/): the script once on a
    one-process job or a host outside the distribution; else the family of the launcher."""
    job, topo, settings = shared.job, shared.topo, shared.settings
    if single.decide_takes_host(dist, topo):
        return single.decide_plan(shared, dist, facts, launcher_kind, program_argv, {})
    launcher_env = {**build_launcher_env(job, facts, topo, settings), **build_hostname_env(job, facts)}
    return find_family_of_kind(launcher_kind).decide_plan(shared, dist, facts, launcher_kind, program_argv,
                                                          launcher_env)

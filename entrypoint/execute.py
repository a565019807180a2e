"""Run a LaunchPlan on this host: install steps, then the plan's role, then the outcome.

The one layer that acts, and a thin one: each part it hands off to the module that owns it.
- supervise.py starts and watches the processes (signals, stops, hangs, reaping);
- hosts.py runs what a multi-host launch needs beside them (the MPI leader's SSH to its workers
  through mpi_hosts.py, the job port, the watch on the peers); an MPI worker host's whole part
  is mpi_hosts.run_worker_host;
- restarts.py decides whether a crashed run is started again;
- failure.py words the reason and outcome.py writes output/success or output/failure.
"""

from __future__ import annotations

import time

from entrypoint.failure import (
    build_worker_host_failure_report,
    describe_exit_code,
    describe_root_cause,
    first_root_cause,
    secret_values,
)
from entrypoint.hosts import HostServices, finish_worker_host, host_services, wait_for_hosts
from entrypoint.log import log
from entrypoint.outcome import (
    build_job_failure_text,
    build_run_report,
    clear_previous_outcome,
    load_failure_file,
    write_failure,
    write_outcome,
)
from entrypoint.paths import MlPaths
from entrypoint.plan import LaunchPlan, ProcessSpec, Role
from entrypoint.restarts import RunEnding, build_restart_line, decide_restart
from entrypoint.supervise import OutputCollector, RunResult, mark_training_started, run_processes


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


def run_plan(plan: LaunchPlan, paths: MlPaths, environ: dict[str, str]) -> int:
    """Run the plan on this host and write its outcome here; returns the job's exit code."""
    env = {**environ, **plan.env_dict}
    collector = OutputCollector(secret_values(env))

    def report(what: str, code: int, run: RunResult | None = None, lost: str | None = None,
               peer_failed: str | None = None) -> str:
        return build_run_report(what, code, collector, plan.current_host, env, run, lost, peer_failed)

    for step in plan.install:
        what = "installing requirements.txt" if "-r" in step else "installing the source directory as a package"
        log(what)
        run = run_processes((ProcessSpec("pip", step),), env, plan.cwd, plan.settings.grace_period_s, collector)
        if run.launch_error:
            return write_failure(paths, run.exit_code, f"{what}: {run.launch_error}")
        if run.exit_code != 0:
            return write_failure(paths, run.exit_code, report(what, run.exit_code, run))

    if plan.role == Role.MPI_WORKER:
        from entrypoint import mpi_hosts  # multi-host paths only: a 1-host job never imports it

        mark_training_started()
        code, text = mpi_hosts.run_worker_host(plan, env)
        if code != 0:
            return write_failure(paths, code, text)
        write_outcome(paths, 0, None)
        return 0

    if plan.multi_host:
        unresolved = wait_for_hosts(plan.hosts, plan.settings.host_resolution_timeout_s)
        if unresolved:
            collector.tail.append(
                f"host(s) {', '.join(unresolved)} did not resolve within "
                f"{plan.settings.host_resolution_timeout_s:g} s (BYOC_HOST_RESOLUTION_TIMEOUT_S)"
            )
            return write_failure(paths, 1, report("waiting for the other hosts' names to resolve", 1))

    what = describe(plan)
    started = time.monotonic()
    with host_services(plan, collector) as services:
        problem = services.start_problem
        if problem is not None:
            collector.tail.append(str(problem))
            text = report(f"{what}: starting the workers", 1, RunResult(1, problem.stopped_by))
            write_failure(paths, 1, text)
            services.tell_workers(1, text)
            services.tell_leader(1)  # a worker whose job port could not open: the leader need not wait
            return 1
        log(f"{plan.current_host}: running {what} ({plan.role})")
        mark_training_started()
        run, earlier = run_with_restarts(plan, env, collector, services, paths, what)
        if run.launch_error:
            text = f"{what}: {run.launch_error}"
        elif run.exit_code != 0:
            text = build_job_failure_text(report(what, run.exit_code, run, services.lost, services.peer_failed),
                                          run.hang, earlier)
        # The outcome is written here before the workers are told it and before this
        # host's job port closes: a worker may exit as soon as either happens, and SDK v2
        # local mode then stops this container.
        if run.exit_code != 0:
            write_failure(paths, run.exit_code, text)
            # Workers are told what this host reports: the script's own failure file if it
            # wrote one (write_outcome keeps it), else ours.
            services.tell_workers(run.exit_code, load_failure_file(paths) or text)
            services.tell_leader(run.exit_code)
            return run.exit_code
        failed_worker = services.wait_for_workers(run.stopped_by)
        if failed_worker is not None:
            host, code = failed_worker
            write_failure(paths, code, build_worker_host_failure_report(
                what=what, host=host, exit_code=code, root_cause=first_root_cause(collector.root_causes),
                current_host=plan.current_host, environ=env))
            return code
        write_outcome(paths, 0, None)
        log(f"{plan.current_host}: {what} succeeded in {time.monotonic() - started:.1f} s")
        services.tell_workers(0, None)
        finish_worker_host(plan, services)
        return 0


def run_with_restarts(plan: LaunchPlan, env: dict[str, str], collector: OutputCollector, services: HostServices,
                      paths: MlPaths, what: str) -> tuple[RunResult, list[str]]:
    """Run the plan's processes; after a crash, again, as long as decide_restart allows
    (restarts.py). Returns the last run and one line for each failure that was restarted."""
    earlier: list[str] = []
    while True:
        run = run_processes(plan.processes, env, plan.cwd, plan.settings.grace_period_s, collector,
                            on_started=services.watch_peers, hang_timeout_s=plan.settings.hang_timeout_s,
                            host=plan.current_host, ask_other_hosts=services.ask_other_hosts_for_stacks())
        ending = RunEnding(run.exit_code, run.stopped_by, run.launch_error, services.lost or services.peer_failed)
        if decide_restart(plan.role, plan.settings.max_restarts, len(earlier), ending) is not None:
            return run, earlier
        cause = first_root_cause(collector.root_causes)
        summary = describe_root_cause(cause) if cause else describe_exit_code(run.exit_code, run.oom_kills)
        log(build_restart_line(len(earlier), plan.settings.max_restarts, what, run.exit_code, summary))
        earlier.append(summary)
        # The next attempt's failure, if any, is reported on its own: what this one printed
        # stays in the log, and a failure file the script wrote is not the job's outcome.
        collector.reset()
        clear_previous_outcome(paths)

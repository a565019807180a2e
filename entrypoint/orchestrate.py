"""The orchestrator: run a LaunchPlan on this host, one straight line: install steps, then this
host's role (roles/: start, run with restarts, settle); the Outcome goes back to cli.main, which
writes it (the one writer of output/) and then closes the role and the job's folders (Launch).

It sits above the roles and drives only their lifecycle (roles/base.py): run/supervise.py
starts and watches the processes, the role owns what runs beside them and its ordering rules,
decide/restarts.py decides whether a crashed run is started again, and outcome/ words the
outcome. From the role's start to its outcome, every wait is on the host's loop
(entrypoint/loop/), where a stop is an event like the others.
"""

from __future__ import annotations

import time

from entrypoint.decide.plan import LaunchPlan
from entrypoint.decide.specs import ProcessSpec
from entrypoint.decide.restarts import build_restart_line, decide_restart
from entrypoint.job.paths import MlPaths
from entrypoint.log import log
from entrypoint.loop import StopRequested
from entrypoint.outcome.failure import (describe_exit_code, describe_job_failure, describe_root_cause,
                                        first_root_cause, secret_values)
from entrypoint.outcome.records import SUCCESS, Outcome
from entrypoint.outcome.stops import (decide_stop_exit_code, describe_capacity_over, describe_capacity_stop, describe_startup_stop,
                                      describe_stop_before_restart)
from entrypoint.outcome.writer import clear_previous_outcome
from entrypoint.run import runtime_dirs
from entrypoint.roles.base import HostRole
from entrypoint.roles.choose import choose_role
from entrypoint.run.stop import SayStop, Stop
from entrypoint.run.supervise import OutputCollector, RunHooks, RunResult, run_processes


class Launch:
    """What cli.main closes once the outcome is written, whatever happened before: this
    host's role, once chosen, and the job's runtime folders, once made."""

    def __init__(self, stop: Stop, secrets: tuple[str, ...] = ()) -> None:
        self.stop = stop  # the job's one stop token (run/stop.py)
        self.role: HostRole | None = None
        self.folders: tuple[str, ...] = ()
        # What writer.render_reason masks in the outcome: the environment's secrets, then
        # (cli.run, once the plan exists) those of the environment the plan built too.
        self.secrets = secrets

    def report(self, outcome: Outcome) -> None:
        """The job report (jobreport/), after the outcome is written: a report that cannot be
        made is logged, never the job's failure."""
        if self.role is None:
            return
        try:
            self.role.job_report(outcome)
        except Exception as exc:  # noqa: BLE001 - the report is a bonus (a stop while finishing cuts it: finishing.py)
            log(f"job report: not written: {type(exc).__name__}: {exc}")

    def close(self, outcome: Outcome) -> None:
        try:
            self.close_role(outcome)
        finally:
            self.remove_folders()

    def close_role(self, outcome: Outcome) -> None:
        if self.role is not None:
            self.role.close(outcome)

    def remove_folders(self) -> None:
        for folder in self.folders:
            runtime_dirs.remove_job_folder(folder)


def run_plan(plan: LaunchPlan, paths: MlPaths, environ: dict[str, str], launch: Launch) -> Outcome:
    """This host's part of the job; returns its outcome, written by the caller."""
    env = {**environ, **plan.env_dict}
    collector = OutputCollector(secret_values(env))
    stop = launch.stop
    role = launch.role = choose_role(plan, collector, env, paths, stop)
    role.start_report()
    # Start-up: a stop is posted, never raised; each step looks at the loop before the next.
    outcome = build_stopped_at_start(stop) or build_capacity_over(plan) or run_install_steps(plan, env, role) \
        or check_health(plan, env, stop)
    keeper = start_compile_cache(plan, role, env) if outcome is None else None
    plan = role.plan  # the cache's folder may have changed in it (start_compile_cache)
    outcome = outcome or build_stopped_at_start(stop)
    if outcome is None:
        # From the role's start to its outcome a stop is an event on the host's loop: every
        # wait of the role's ends on it, a run forwards it to its processes (entrypoint/loop/).
        stop.loop.on({StopRequested: SayStop(stop.loop)})
        outcome = role.start() or build_stopped_at_start(stop)
    if outcome is not None:
        if keeper is not None:
            keeper.close()  # no rank ran: nothing new to keep
        return outcome
    try:
        outcome = role.settle(role.run(lambda: run_with_restarts(plan, env, role, paths, keeper)))
    finally:
        if keeper is not None:
            keeper.end(plan.settings.thread_join_s)
            role.add_report_notes(keeper.lines)
    if outcome.exit_code == 0 and role.started_at is not None:
        log(f"{plan.current_host}: {role.what} succeeded in {time.monotonic() - role.started_at:.1f} s")
    return outcome


def start_compile_cache(plan: LaunchPlan, role: HostRole, env: dict[str, str]):
    """torch.compile's caches (run/compile_cache.py), restored before the role starts the ranks
    (an MPI worker before it lets the leader in); the keeper writes them back meanwhile and at
    the end. A folder it could not use is replaced (or left out) in the processes' environment
    and the role's plan (whose environment an MPI host's ranks get: roles/mpi.write_host_env),
    so no rank is handed a folder torch cannot write."""
    if plan.compile_cache is None:
        return None
    from entrypoint.decide.compile_cache import decide_folder_env
    from entrypoint.run.compile_cache import CacheKeeper

    keeper = CacheKeeper(plan.compile_cache, plan.settings.stop_check_s)
    keeper.stop_asked = role.stop.loop.stopped  # a stop posted while restoring ends the restore
    keeper.start()
    if keeper.folder != plan.compile_cache.folder:
        plan_env = decide_folder_env(plan.env_dict, plan.compile_cache.folder, keeper.folder)
        for name in set(plan.env_dict) - set(plan_env):
            env.pop(name, None)
        env.update(plan_env)
        role.use_plan(plan._replace(env=tuple(plan_env.items()), compile_cache=keeper.cache))
    if plan.compile_cache.archive is not None:  # a phase of its own only where archives are unpacked
        role.mark("compile cache restored")
    return keeper


def build_stopped_at_start(stop: Stop) -> Outcome | None:
    """A stop the role's start took while it waited for the other hosts, and did not report."""
    stop.loop.handle_pending()
    if not stop.loop.stopped():
        return None
    code = decide_stop_exit_code(stop.loop.stop_signum)
    return Outcome(code, describe_startup_stop(stop.loop.stop_name, code))


def check_health(plan: LaunchPlan, env: dict[str, str], stop: Stop) -> Outcome | None:
    """BYOC_HEALTH_CHECK=deep: the all-reduce check on every host before its role starts (before
    the SSH and job-port waits, which a host stopped by the check would leave to time out); the
    verdict is the same on every host, so all of them stop together."""
    if plan.health_check is None:
        return None
    from entrypoint.run.health_check import run_health_check  # only when the job asks for the check

    return run_health_check(plan, env, stop)


def run_install_steps(plan: LaunchPlan, env: dict[str, str], role: HostRole) -> Outcome | None:
    """requirements.txt and a source directory that is a package, before the role starts;
    an Outcome when one fails."""
    for step in plan.install:
        what = "installing requirements.txt" if "-r" in step else "installing the source directory as a package"
        log(what)
        run = run_processes((ProcessSpec("pip", step),), env, plan.cwd, role.collector, role.stop,
                            RunHooks(plan.settings, plan.current_host))
        if run.stopped_by:  # before pip started, or forwarded to it: nothing was trained, a start-up stop
            code = decide_stop_exit_code(run.stopped_by)
            return Outcome(code, describe_startup_stop(run.stopped_by, code))
        if run.launch_error:
            return Outcome(run.exit_code, f"{what}: {run.launch_error}")
        if run.exit_code != 0:
            return Outcome(run.exit_code, role.describe_failure(what, run))
    return None


def run_with_restarts(plan: LaunchPlan, env: dict[str, str], role: HostRole, paths: MlPaths, keeper=None) -> Outcome:
    """Run the plan's processes; after a crash, again, as long as decide_restart allows
    (restarts.py) and the role's part of the restart succeeds (a job-port host waits for the
    leader's word: roles/attempts.py). The last run's outcome, its report naming the failures
    restarted before it."""
    earlier: list[str] = []
    collector = role.collector
    while True:
        hooks = role.build_run_hooks(plan.settings.hang_timeout_s, build_stop_at(plan),
                                     keeper.note_stop if keeper is not None else None)
        run = run_processes(role.attempt_processes(), env, plan.cwd, collector, role.stop, hooks)
        why_not = decide_restart(role.relaunchable, plan.settings.max_restarts, len(earlier), role.build_ending(run))
        if why_not is None:
            cause = first_root_cause(collector.root_causes)
            summary = describe_root_cause(cause) if cause else describe_exit_code(run.exit_code, run.oom_kills,
                                                                                   signaled=run.signaled)
            why_not = role.restart(build_restart_line(len(earlier), plan.settings.max_restarts, role.what,
                                                      run.exit_code, summary), run.exit_code, summary,
                                   cause.time if cause else time.time())
            if why_not is not None and role.stop.loop.stopped():
                return build_stopped_while_restarting(role, earlier + [summary])
            if why_not is not None:
                log(f"{plan.current_host}: not started again: {why_not}")
        if why_not is not None:
            role.end_attempts()
            return build_run_outcome(role, run, earlier)
        earlier.append(summary)
        # The next attempt's failure, if any, is reported on its own: what this one printed
        # stays in the log, and a failure file the script wrote is not the job's outcome.
        collector.reset()
        clear_previous_outcome(paths)


def build_stopped_while_restarting(role: HostRole, earlier: list[str]) -> Outcome:
    """A stop that came while the hosts were starting the job again: it is not restarted, and
    the outcome is the stop's, naming the failures before it."""
    role.end_attempts()
    code = decide_stop_exit_code(role.stop.loop.stop_signum)
    return Outcome(code, describe_stop_before_restart(role.stop.loop.stop_name, code, earlier))


def build_capacity_over(plan: LaunchPlan) -> Outcome | None:
    """A job that begins after its stop time (a training plan's capacity is ending) stops now."""
    stop_at, now = plan.capacity_stop_at, time.time()
    if stop_at is None or now < stop_at:
        return None
    return Outcome(143, describe_capacity_over(plan.settings.capacity_ends_at, stop_at, now) + "\n")


def build_stop_at(plan: LaunchPlan) -> tuple[float, str] | None:
    """When and why this host stops its processes itself: before a training plan's capacity ends."""
    settings = plan.settings
    if plan.capacity_stop_at is None:
        return None
    return plan.capacity_stop_at, describe_capacity_stop(settings.capacity_ends_at, plan.capacity_stop_at,
                                                         settings.grace_period_s)


def build_stopped_before_start(run: RunResult, earlier: list[str]) -> Outcome:
    """A stop that came before the run's first process started: none ran, so the outcome is the
    stop's, never a failure of a script that never started."""
    if not earlier:
        return Outcome(run.exit_code, describe_startup_stop(run.stopped_by, run.exit_code))
    return Outcome(run.exit_code, describe_stop_before_restart(run.stopped_by, run.exit_code, earlier))


def build_run_outcome(role: HostRole, run: RunResult, earlier: list[str]) -> Outcome:
    if run.stopped_by and not run.started:
        return build_stopped_before_start(run, earlier)
    if run.stop_reason and not run.launch_error:
        # A stop this host made itself (the capacity is ending) is reported as the platform's
        # stop is (SIGTERM to the entrypoint): by what the script did. One that saved and exited
        # 0 succeeded (output/success, its checkpoint kept); the reason stays in the log.
        if run.exit_code == 0:
            log(f"{run.stop_reason.splitlines()[0]} The processes ended with exit code 0 after the stop.")
            return SUCCESS
        return Outcome(run.exit_code, f"{run.stop_reason}\n\n{role.describe_failure(role.what, run)}")
    if run.launch_error:
        return Outcome(run.exit_code, f"{role.what}: {run.launch_error}")
    if run.exit_code != 0:
        return Outcome(run.exit_code, describe_job_failure(role.describe_failure(role.what, run), run.hang, earlier))
    return SUCCESS

"""The orchestrator: this host's one state machine (torch's elastic agent, _invoke_run over
WorkerState, is the model). One value, Host, carries the state and what the steps made; run_host
walks it from STARTING to DONE, one step a state, each step returning the next one:

    STARTING ──► INSTALLING ──► CHECKING ──► RESTORING ──► WAITING ──► RUNNING ◄──► RESTARTING
       │             │              │             │            │           │              │
       └─────────────┴── a stop, or a step that failed: the outcome ──► DONE            │
                                                                           └──► SETTLING ◄┘ ──► DONE

    STARTING    the plan is decided, nothing started: a stop, a capacity already over
    INSTALLING  requirements.txt, a source directory that is a package (pip)
    CHECKING    BYOC_HEALTH_CHECK=deep: the all-reduce check on every host
    RESTORING   torch.compile's caches, restored before any rank runs
    WAITING     the role's start: the other hosts' names, sshd, the job port, the peers
    RUNNING     one attempt's processes, to their end (run/supervise.py; an MPI worker serves
                mpirun until the leader's word)
    RESTARTING  an attempt failed and may be started again (restarts.py): the role's part (a
                job-port leader stops every host's attempt and waits until all are gone)
    SETTLING    the role's last word before the outcome is written (a leader waits for its workers)

A stop is an event on the host's loop (entrypoint/loop/) in every state, never an exception:
each step before the role's start looks at the loop first, and from the role's start every
wait ends on it and a run forwards it. The exit code of a stop comes from one function of the
state and the stop (build_stop_outcome); what run_host started is ended in one `finally`
(end_host). The outcome goes back to cli.main, which writes it (the one writer of output/) and
then closes the role and the job's folders (Launch).

It drives the role through its lifecycle only (roles/base.py): run/supervise.py starts and
watches the processes, the role owns what runs beside them and its ordering rules,
decide/restarts.py decides whether a crashed attempt is started again, and outcome/ words it.
"""

from __future__ import annotations

import enum
import time

from entrypoint.decide.plan import LaunchPlan
from entrypoint.decide.specs import ProcessSpec
from entrypoint.decide.restarts import RunEnding, build_attempt_processes, build_restart_line, decide_restart
from entrypoint.job.paths import MlPaths
from entrypoint.log import log
from entrypoint.loop import StopRequested
from entrypoint.outcome.failure import (describe_exit_code, describe_job_failure, describe_root_cause,
                                        first_root_cause, secret_values)
from entrypoint.outcome.records import SUCCESS, Outcome
from entrypoint.outcome.stops import (decide_stop_exit_code, describe_capacity_over, describe_capacity_stop,
                                      describe_startup_stop, describe_stop_before_restart)
from entrypoint.outcome.writer import clear_previous_outcome
from entrypoint.run import runtime_dirs
from entrypoint.run.held import HeldProcesses, Next
from entrypoint.roles.base import HostRole, describe_host_failure
from entrypoint.roles.choose import choose_role
from entrypoint.run.stop import SayStop, Stop
from entrypoint.run.supervise import OutputCollector, RunHooks, RunResult, run_processes


class HostState(enum.Enum):
    STARTING = "starting"
    INSTALLING = "installing"
    CHECKING = "checking"
    RESTORING = "restoring"
    WAITING = "waiting"
    RUNNING = "running"
    RESTARTING = "restarting"
    SETTLING = "settling"
    DONE = "done"


# The states before the role's start: a stop there ends start-up, before anything ran.
BEFORE_THE_ROLE = (HostState.STARTING, HostState.INSTALLING, HostState.CHECKING, HostState.RESTORING)


class Host:
    """The state machine's one value, and the one owner of this host's state: the plan and the
    processes' environment, the stop, the output, the attempt (one number), the current run's
    supervisor, the report's parts. The role (roles/) holds only what its own launch family adds
    (its peers, its words) and is handed this value by every lifecycle method, as torch's agent
    hands its methods the worker group."""

    def __init__(self, plan: LaunchPlan, env: dict[str, str], role: HostRole, paths: MlPaths, stop: Stop,
                 collector: OutputCollector, what: str = "the job", relaunchable: bool = False) -> None:
        self.state = HostState.STARTING
        self.plan = plan
        self.env = env  # the processes' environment (the container's and the plan's)
        self.role = role
        self.what = what  # the job in a few words, for the log and the outcome
        self.relaunchable = relaunchable  # a crash may be restarted in place here (restarts.py)
        self.paths = paths
        self.stop = stop  # the job's one stop token (run/stop.py)
        self.collector = collector  # the processes' output: the tail and root causes, for the failure's words
        self.keeper = None  # run/compile_cache.CacheKeeper, once RESTORING made one
        self.ran = False  # RUNNING was reached: the ranks ran (the keeper writes the caches back)
        self.started_at: float | None = None  # when this host's processes began (None: they are not its own)
        self.attempt = 1  # the attempt this host's processes belong to: the one place it is kept
        self.supervisor = None  # the current run's (run/supervise.Supervisor), once its processes started
        self.run: RunResult | Outcome | None = None  # the last attempt's
        self.earlier: list[str] = []  # the failures of the attempts restarted so far, in order
        self.restarts: list[dict] = []  # each failed attempt that was restarted, for the job report
        self.lost: str | None = None  # why another host was lost during the run
        self.peer_failed: str | None = None  # a worker host's part failed while this host's ran
        self.report = None  # this host's part of the job report (jobreport/host.HostReport), when on
        self.report_notes: list[str] = []  # lines for the job report's notes (the compile cache's)
        self.resolved = False  # every host's name resolved: from then on the others may wait on this one
        self.outcome: Outcome | None = None
        self.say_stop = SayStop(stop.loop)  # WAITING on: a stop said without "during start-up"
        self.held = HeldProcesses()  # the next attempt's launchers, started ahead (run/held.py)

    @property
    def loop(self):
        return self.stop.loop

    def mark(self, phase: str, when: float | None = None) -> None:
        """A phase of this host's start, run or restart, in the report's timeline."""
        if self.report is not None:
            self.report.mark(phase, when)

    def next_attempt(self) -> int:
        """The next attempt begins: its number, from here on this host's."""
        self.attempt += 1
        return self.attempt

    def processes_of(self, attempt: int) -> tuple:
        """What attempt starts on this host: the plan's processes, each with that attempt's number."""
        return build_attempt_processes(self.plan.processes, attempt)


class Launch:
    """What cli.main closes once the outcome is written, whatever happened before: this
    host (its role's last steps), once made, and the job's runtime folders, once made."""

    def __init__(self, stop: Stop, secrets: tuple[str, ...] = ()) -> None:
        self.stop = stop  # the job's one stop token (run/stop.py)
        self.host: Host | None = None
        self.folders: tuple[str, ...] = ()
        # What writer.render_reason masks in the outcome: the environment's secrets, then
        # (cli.run, once the plan exists) those of the environment the plan built too.
        self.secrets = secrets

    def report(self, outcome: Outcome) -> None:
        """The job report (jobreport/), after the outcome is written: a report that cannot be
        made is logged, never the job's failure."""
        if self.host is None:
            return
        try:
            self.host.role.job_report(self.host, outcome)
        except Exception as exc:  # noqa: BLE001 - the report is a bonus (a stop while finishing cuts it: finishing.py)
            log(f"job report: not written: {type(exc).__name__}: {exc}")

    def close(self, outcome: Outcome) -> None:
        try:
            self.close_role(outcome)
        finally:
            self.remove_folders()

    def close_role(self, outcome: Outcome) -> None:
        if self.host is not None:
            self.host.role.close(self.host, outcome)

    def remove_folders(self) -> None:
        for folder in self.folders:
            runtime_dirs.remove_job_folder(folder)


def build_host(plan: LaunchPlan, paths: MlPaths, environ: dict[str, str], stop: Stop) -> Host:
    """This host's one value, with the role its launch family names (roles/choose.py)."""
    env = {**environ, **plan.env_dict}
    role, what, relaunchable = choose_role(plan)
    return Host(plan, env, role, paths, stop, OutputCollector(secret_values(env)), what, relaunchable)


def run_plan(plan: LaunchPlan, paths: MlPaths, environ: dict[str, str], launch: Launch) -> Outcome:
    """This host's part of the job; returns its outcome, written by the caller."""
    host = launch.host = build_host(plan, paths, environ, launch.stop)
    start_report(host)
    return run_host(host)


def start_report(host: Host) -> None:
    """Sampling starts as soon as the plan is decided, so the report shows the start-up too."""
    if host.plan.report is None:
        return
    from entrypoint.jobreport.host import HostReport  # only when the report is on

    try:
        host.report = HostReport(host.plan.report, host.plan.current_host)
    except Exception as exc:  # noqa: BLE001 - no report, never a failed job
        log(f"job report: not started: {type(exc).__name__}: {exc}")
        return
    host.collector.on_line = host.report.throughput.take
    host.role.start_live(host)


def run_host(host: Host) -> Outcome:
    """The walk from STARTING to DONE: each state's step, then the next state it names."""
    try:
        while host.state is not HostState.DONE:
            host.state = STEPS[host.state](host)
    finally:
        end_host(host)
    if host.outcome.exit_code == 0 and host.started_at is not None:
        log(f"{host.plan.current_host}: {host.what} succeeded in {time.monotonic() - host.started_at:.1f} s")
    return host.outcome


def end_host(host: Host) -> None:
    """What run_host started, ended: the next attempt's held processes (none follows), then the
    compile cache's keeper writes back what the ranks made (or, when none ran, lets go), and
    its lines go in the report's notes."""
    host.held.stop()
    keeper = host.keeper
    if keeper is None:
        return
    if not host.ran:
        keeper.close()  # no rank ran: nothing new to keep
        return
    keeper.end(host.plan.settings.thread_join_s)
    host.report_notes.extend(keeper.lines)


def end_with(host: Host, outcome: Outcome, then: HostState = HostState.DONE) -> HostState:
    host.outcome = outcome
    return then


def stopped(host: Host) -> HostState | None:
    """A stop the loop took (it is looked at before every step up to the role's start): the
    outcome in the current state's words, and the walk ends."""
    host.loop.handle_pending()
    if not host.loop.stopped():
        return None
    return end_with(host, build_stop_outcome(host.state, host.loop.stop_signum, host.earlier))


def build_stop_outcome(state: HostState, stopped_by: int | str, earlier: list[str]) -> Outcome:
    """The outcome of a stop that came before the processes of the current attempt started:
    none ran, so it is the stop's, never a failure of a script that never started. Between two
    attempts it names the failures before it (the one function of the state and the stop)."""
    import signal

    name = stopped_by if isinstance(stopped_by, str) else signal.Signals(stopped_by).name
    code = decide_stop_exit_code(stopped_by)
    if earlier or state is HostState.RESTARTING:
        return Outcome(code, describe_stop_before_restart(name, code, earlier))
    return Outcome(code, describe_startup_stop(name, code))


def step_starting(host: Host) -> HostState:
    done = stopped(host)
    if done is not None:
        return done
    capacity_over = build_capacity_over(host.plan)
    return end_with(host, capacity_over) if capacity_over is not None else HostState.INSTALLING


def step_installing(host: Host) -> HostState:
    if not host.plan.install:
        return HostState.CHECKING  # nothing ran: no stop to look for that STARTING did not see
    failed = run_install_steps(host)
    if failed is not None:
        return end_with(host, failed)
    return stopped(host) or HostState.CHECKING


def step_checking(host: Host) -> HostState:
    if host.plan.health_check is None:
        return HostState.RESTORING
    failed = check_health(host.plan, host.env, host.stop)
    if failed is not None:
        return end_with(host, failed)
    return stopped(host) or HostState.RESTORING


def step_restoring(host: Host) -> HostState:
    if host.plan.compile_cache is None:
        return HostState.WAITING
    host.keeper = start_compile_cache(host)
    return HostState.WAITING  # a stop while it restored: WAITING looks first


def step_waiting(host: Host) -> HostState:
    """The role's start. From here to the outcome a stop is an event on the host's loop: every
    wait of the role's ends on it, a run forwards it to its processes (entrypoint/loop/)."""
    done = stopped(host)  # one that came before: said as start-up's, and nothing starts
    if done is not None:
        return done
    host.loop.on({StopRequested: host.say_stop})
    failed = host.role.start(host)
    if failed is not None:
        return end_with(host, failed)
    done = stopped(host)
    if done is not None:
        return done
    host.started_at = host.role.begin_running(host)
    host.ran = True
    return HostState.RUNNING


def step_running(host: Host) -> HostState:
    """One attempt, to its end; then whether the job starts again (the role's decide_restart)."""
    run = host.run = run_attempt(host)
    if isinstance(run, Outcome):  # a part that is not this host's processes (an MPI worker's)
        return end_with(host, run, HostState.SETTLING)
    why_not = decide_restart(host.relaunchable, host.plan.settings.max_restarts, host.attempt - 1,
                             build_ending(host, run))
    if why_not is None:
        return HostState.RESTARTING
    host.role.end_attempts(host)
    return end_with(host, build_run_outcome(host, run), HostState.SETTLING)


def build_ending(host: Host, run: RunResult) -> RunEnding:
    """How a run ended, as decide_restart reads it: with another host lost or failed, too."""
    return RunEnding(run.exit_code, run.stopped_by, run.launch_error, host.lost or host.peer_failed)


def run_attempt(host: Host) -> RunResult | Outcome:
    """One attempt: the role runs it (roles/base.py) with the run's settings made here."""
    keeper, plan, restarted = host.keeper, host.plan, host.attempt - 1
    # What the next attempt would start, while a restart is left: its launchers may be started
    # ahead during this one (run/held.py).
    host.held.expect(Next(host.processes_of(host.attempt + 1), host.env, plan.cwd)
                     if restarted < plan.settings.max_restarts else None)
    hooks = RunHooks(plan.settings, plan.current_host, plan.settings.hang_timeout_s, stop_at=build_stop_at(plan),
                     on_stopping=keeper.note_stop if keeper is not None else None, held=host.held, periodic=keeper)
    return host.role.run_attempt(host, hooks)


def step_restarting(host: Host) -> HostState:
    """The role's part of a restart (a job-port host waits for the leader's word:
    roles/attempts.py); then the next attempt, or why not."""
    plan, role, run = host.plan, host.role, host.run
    cause = first_root_cause(host.collector.root_causes)
    summary = describe_root_cause(cause) if cause else describe_exit_code(run.exit_code, run.oom_kills,
                                                                           signaled=run.signaled)
    note_restart(host, run.exit_code, summary, cause.time if cause else time.time())
    why_not = role.restart(host, build_restart_line(host.attempt - 1, plan.settings.max_restarts, host.what,
                                                    run.exit_code, summary))
    if why_not is not None and host.loop.stopped():
        role.end_attempts(host)
        return end_with(host, build_stop_outcome(host.state, host.loop.stop_signum, host.earlier + [summary]),
                        HostState.SETTLING)
    if why_not is not None:
        log(f"{plan.current_host}: not started again: {why_not}")
        role.end_attempts(host)
        return end_with(host, build_run_outcome(host, run), HostState.SETTLING)
    host.earlier.append(summary)
    # The next attempt's failure, if any, is reported on its own: what this one printed
    # stays in the log, and a failure file the script wrote is not the job's outcome.
    host.collector.reset()
    clear_previous_outcome(host.paths)
    return HostState.RUNNING


def note_restart(host: Host, exit_code: int, cause: str, failed_at: float) -> None:
    """A failed attempt that may be started again: its end in the report's timeline and its cost
    (failed_at, epoch s: its first root cause, or its processes' end) in report.json."""
    host.mark(f"attempt {host.attempt} failed (exit code {exit_code})", failed_at)
    host.restarts.append({"attempt": host.attempt, "exit_code": exit_code, "cause": cause, "failed": failed_at,
                          "next_started": None})


def step_settling(host: Host) -> HostState:
    return end_with(host, host.role.settle(host, host.outcome))


STEPS = {HostState.STARTING: step_starting, HostState.INSTALLING: step_installing,
         HostState.CHECKING: step_checking, HostState.RESTORING: step_restoring, HostState.WAITING: step_waiting,
         HostState.RUNNING: step_running, HostState.RESTARTING: step_restarting,
         HostState.SETTLING: step_settling}


def start_compile_cache(host: Host):
    """torch.compile's caches (run/compile_cache.py), restored before the role starts the ranks
    (an MPI worker before it lets the leader in); the keeper writes them back meanwhile and at
    the end. A folder it could not use is replaced (or left out) in the processes' environment
    and the host's plan (whose environment an MPI host's ranks get: roles/mpi.write_host_env),
    so no rank is handed a folder torch cannot write."""
    plan, env = host.plan, host.env
    from entrypoint.decide.compile_cache import decide_folder_env
    from entrypoint.run.compile_cache import CacheKeeper

    keeper = CacheKeeper(plan.compile_cache)
    keeper.stop_asked = host.loop.stopped  # a stop posted while restoring ends the restore
    keeper.start()
    if keeper.folder != plan.compile_cache.folder:
        plan_env = decide_folder_env(plan.env_dict, plan.compile_cache.folder, keeper.folder)
        for name in set(plan.env_dict) - set(plan_env):
            env.pop(name, None)
        env.update(plan_env)
        host.plan = plan._replace(env=tuple(plan_env.items()), compile_cache=keeper.cache)
    if plan.compile_cache.archive is not None:  # a phase of its own only where archives are unpacked
        host.mark("compile cache restored")
    return keeper


def check_health(plan: LaunchPlan, env: dict[str, str], stop: Stop) -> Outcome | None:
    """BYOC_HEALTH_CHECK=deep: the all-reduce check on every host before its role starts (before
    the SSH and job-port waits, which a host stopped by the check would leave to time out); the
    verdict is the same on every host, so all of them stop together."""
    if plan.health_check is None:
        return None
    from entrypoint.run.health_check import run_health_check  # only when the job asks for the check

    return run_health_check(plan, env, stop)


def run_install_steps(host: Host) -> Outcome | None:
    """requirements.txt and a source directory that is a package, before the role starts;
    an Outcome when one fails."""
    plan = host.plan
    for step in plan.install:
        what = "installing requirements.txt" if "-r" in step else "installing the source directory as a package"
        log(what)
        run = run_processes((ProcessSpec("pip", step),), host.env, plan.cwd, host.collector, host.stop,
                            RunHooks(plan.settings, plan.current_host))
        if run.stopped_by:  # before pip started, or forwarded to it: nothing was trained, a start-up stop
            return build_stop_outcome(HostState.INSTALLING, run.stopped_by, [])
        if run.launch_error:
            return Outcome(run.exit_code, f"{what}: {run.launch_error}")
        if run.exit_code != 0:
            return Outcome(run.exit_code, describe_host_failure(host, what, run))
    return None


def build_capacity_over(plan: LaunchPlan) -> Outcome | None:
    """A job that begins after its stop time (a training plan's capacity is ending) stops now."""
    stop_at, now = plan.capacity_stop_at, time.time()
    if stop_at is None or now < stop_at:
        return None
    # Stopped as the platform stops a job (SIGTERM): the one rule's exit code.
    return Outcome(decide_stop_exit_code("SIGTERM"), describe_capacity_over(plan.settings.capacity_ends_at, stop_at,
                                                                             now) + "\n")


def build_stop_at(plan: LaunchPlan) -> tuple[float, str] | None:
    """When and why this host stops its processes itself: before a training plan's capacity ends."""
    settings = plan.settings
    if plan.capacity_stop_at is None:
        return None
    return plan.capacity_stop_at, describe_capacity_stop(settings.capacity_ends_at, plan.capacity_stop_at,
                                                         settings.grace_period_s)


def build_run_outcome(host: Host, run: RunResult) -> Outcome:
    what, earlier = host.what, host.earlier
    if run.stopped_by and not run.started:  # none of this attempt's processes ran: the stop's outcome
        return build_stop_outcome(HostState.RUNNING, run.stopped_by, earlier)
    if run.stop_reason and not run.launch_error:
        # A stop this host made itself (the capacity is ending) is reported as the platform's
        # stop is (SIGTERM to the entrypoint): by what the script did. One that saved and exited
        # 0 succeeded (output/success, its checkpoint kept); the reason stays in the log.
        if run.exit_code == 0:
            log(f"{run.stop_reason.splitlines()[0]} The processes ended with exit code 0 after the stop.")
            return SUCCESS
        return Outcome(run.exit_code, f"{run.stop_reason}\n\n{describe_host_failure(host, what, run)}")
    if run.launch_error:
        return Outcome(run.exit_code, f"{what}: {run.launch_error}")
    if run.exit_code != 0:
        return Outcome(run.exit_code, describe_job_failure(describe_host_failure(host, what, run), run.hang, earlier))
    return SUCCESS

"""Every host role's lifecycle, which orchestrate.py drives and cli.main ends:

    start()          before the processes: what the launch needs beside them (the other hosts'
                     names, sshd, the job port); an Outcome when the launch cannot start
    begin_running()  the role started: the job's processes are next
    run_attempt(env, stop_at, on_stopping, held)  one attempt's processes, to their end (a
                     RunResult); an Outcome where this host's part is not its own processes (an
                     MPI worker); held: the next attempt's launchers started ahead (run/held.py)
    decide_restart(run, restarted)  why the attempt is not started again (None: it is)
    attempt_processes()  the processes of the attempt this host is in (the plan's, stamped)
    restart(line, exit_code, cause, failed_at)  the job restarts after a failed attempt: this
                     host's part before the next one (None when it may start; why not, else)
    end_attempts()   no attempt follows the last one
    settle(outcome)  after them, before anything is written: a leader may wait for its workers
    job_report(outcome)  after the outcome is written (cli.main): the job report (jobreport/):
                     the leader, or the one host, writes it; a worker hands the leader its figures
    close(outcome)   after that: tell the other hosts, release what start() started

and the hooks a run calls: before_processes_start (None, or a callable given the supervisor),
on_processes_started(supervisor), on_rank_killed(env, signum), ask_other_hosts (None, or a
callable). Every wait of a role is on the host's loop (entrypoint/loop/), where its handlers
take what the other hosts say and a stop ends the wait. One module per launch family: single.py, mpi.py, job_port.py; choose.py is the
one switch on plan.role.
"""

from __future__ import annotations

import time

from entrypoint.decide.plan import LaunchPlan
from entrypoint.log import log
from entrypoint.outcome.failure import build_step_ending, describe_run_failure
from entrypoint.outcome.records import Outcome
from entrypoint.hosts.job_port import PeerLost
from entrypoint.hosts.net import wait_for_hosts
from entrypoint.decide.restarts import RunEnding
from entrypoint.run.supervise import RunHooks, RunResult, run_processes


class HostRole:
    """A role with nothing beside its processes: one host (or a host outside the
    distribution). The base of every other role."""

    ask_other_hosts = None  # a callable that asks the other hosts' ranks for their stacks
    before_processes_start = None  # a callable given each run's supervisor before its processes start

    def __init__(self, plan: LaunchPlan, collector, env: dict[str, str], paths, stop, what: str, relaunchable: bool):
        self.plan = plan
        self.stop = stop  # the job's one stop token (run/stop.py)
        self.loop = stop.loop  # the host's loop (entrypoint/loop/): every wait here is on it
        self.collector = collector  # supervise.OutputCollector: the tail and root causes, for the failure's words
        self.env = env  # the processes' environment (the container's and the plan's)
        self.paths = paths
        self.what = what  # the job in a few words, for the log and the outcome
        self.relaunchable = relaunchable  # a crash may be restarted in place here (restarts.py)
        self.supervisor = None  # the current run's (supervise.Supervisor)
        self.started_at: float | None = None  # time.monotonic() when the job's processes first started
        self.lost: str | None = None  # why another host was lost during the run
        self.peer_failed: str | None = None  # a worker host's part failed while this host's ran
        self.report_part = None  # this host's part of the job report (jobreport/host.HostReport), when on
        self.report_notes: list[str] = []  # lines for the job report's notes (the compile cache's)
        self.attempt = 1  # the attempt this host's processes belong to (restarts.py)
        self.restarts: list[dict] = []  # each failed attempt that was restarted, for the job report

    def start_report(self) -> None:
        """Sampling starts as soon as the plan is decided, so the report shows the start-up too."""
        if self.plan.report is None:
            return
        from entrypoint.jobreport.host import HostReport  # only when the report is on

        try:
            self.report_part = HostReport(self.plan.report, self.plan.current_host)
        except Exception as exc:  # noqa: BLE001 - no report, never a failed job
            log(f"job report: not started: {type(exc).__name__}: {exc}")
            return
        self.collector.on_line = self.report_part.throughput.take
        self.start_live()

    def start_live(self) -> None:
        """The leader's (or the one host's) live view: TensorBoard events, the status line."""
        self.report_part.start_live(log, None, self.plan.settings.capacity_ends_at)

    def mark(self, phase: str, when: float | None = None) -> None:
        if self.report_part is not None:
            self.report_part.mark(phase, when)

    def start(self) -> Outcome | None:
        return None

    def begin_running(self) -> float | None:
        """The role started: the job's processes are next (orchestrate.py's RUNNING). When they
        started (time.monotonic()), for the success's line; None where they are not this host's."""
        log(f"{self.plan.current_host}: running {self.what} ({self.plan.role})")
        self.started_at = time.monotonic()
        return self.started_at

    def run_attempt(self, env: dict[str, str], stop_at, on_stopping, held=None) -> RunResult | Outcome:
        """One attempt: this host's processes of it, run to their end (a RunResult, which the
        orchestrator decides a restart on); an Outcome where this host's part is not its own
        processes (an MPI worker serves mpirun until the leader's word). stop_at: when and why
        this host stops them itself (a training plan's capacity); on_stopping: called as it does;
        held: the host's held processes (run/held.py), which the run takes and starts ahead."""
        hooks = self.build_run_hooks(self.plan.settings.hang_timeout_s, stop_at, on_stopping)._replace(held=held)
        return run_processes(self.attempt_processes(), env, self.plan.cwd, self.collector, self.stop, hooks)

    def decide_restart(self, run: RunResult, restarted: int) -> str | None:
        """Why the failed attempt is not started again (a success is not); None when it is
        (decide/restarts.py: this role relaunches, BYOC_MAX_RESTARTS allows another)."""
        from entrypoint.decide.restarts import decide_restart

        return decide_restart(self.relaunchable, self.plan.settings.max_restarts, restarted, self.build_ending(run))

    def attempt_processes(self):
        from entrypoint.decide.restarts import build_attempt_processes

        return build_attempt_processes(self.plan.processes, self.attempt)

    def build_run_hooks(self, hang_timeout_s: float, stop_at, on_stopping) -> RunHooks:
        """What a run of this role's processes calls back (run/supervise.RunHooks)."""
        return RunHooks(self.plan.settings, self.plan.current_host, hang_timeout_s, self.on_processes_started,
                        self.ask_other_hosts, self.on_rank_killed, stop_at, self.before_processes_start, on_stopping)

    def build_ending(self, run: RunResult) -> RunEnding:
        """How a run ended, as decide_restart reads it: with another host lost or failed, too."""
        return RunEnding(run.exit_code, run.stopped_by, run.launch_error, self.lost or self.peer_failed)

    def restart(self, line: str, exit_code: int, cause: str, failed_at: float) -> str | None:
        """The attempt this host is in failed and may be started again: its end goes in the
        report (note_restart), then this role's part of the restart. None when the next attempt
        may start; why not, else. Here every process of the job is this host's: its own to make."""
        self.note_restart(exit_code, cause, failed_at)
        log(line)
        self.attempt += 1
        return None

    def end_attempts(self) -> None:
        return None

    def note_restart(self, exit_code: int, cause: str, failed_at: float) -> None:
        """A failed attempt that is started again: its end in the report's timeline and its cost
        (failed_at, epoch s: its first root cause, or its processes' end) in report.json."""
        self.mark(f"attempt {self.attempt} failed (exit code {exit_code})", failed_at)
        self.restarts.append({"attempt": self.attempt, "exit_code": exit_code, "cause": cause, "failed": failed_at,
                              "next_started": None})

    def use_plan(self, plan: LaunchPlan) -> None:
        """The plan as the compile cache left it (a folder replaced in the ranks' environment)."""
        self.plan = plan

    def add_report_notes(self, lines: list[str]) -> None:
        self.report_notes.extend(lines)

    def on_processes_started(self, supervisor) -> None:
        self.supervisor = supervisor
        self.mark("processes started")
        if self.attempt > 1:
            self.mark(f"attempt {self.attempt} started")
            if self.restarts and self.restarts[-1]["next_started"] is None:
                self.restarts[-1]["next_started"] = time.time()

    def on_rank_killed(self, env: dict[str, str], signum: int):
        """A rank this host started itself died of a signal: on one host, its exit code says it."""
        return None

    def settle(self, outcome: Outcome) -> Outcome:
        return outcome

    def job_report(self, outcome: Outcome) -> None:
        """This host's figures are the whole report."""
        if self.report_part is not None:
            self.write_job_report(outcome, {})

    def write_job_report(self, outcome: Outcome, others: dict[str, dict]) -> None:
        """The report of this host's figures and others' (host -> figures; a host of the job
        without any is reported missing)."""
        from entrypoint.jobreport.host import write_job_report

        if self.loop.walked_away_from_here():  # cut short while it read the others' figures: said so
            return
        figures, _ = self.report_part.end(self.plan.settings.report_figures_bytes)
        live = self.report_part.live
        notes = [f"live figures: {n}" for n in live.notes.seen] if live is not None else []
        write_job_report(self.paths.output_data_dir, self.what, self.plan.current_host,
                         self.plan.hosts or (self.plan.current_host,), outcome.exit_code,
                         {**others, self.plan.current_host: figures},
                         [f"{self.plan.current_host}: {n}" for n in self.report_notes] + notes, self.restarts)

    def close(self, outcome: Outcome) -> None:
        return None

    def describe_failure(self, what: str, run=None) -> str:
        """The failure's words for one step of this host's part (supervise.RunResult run)."""
        return describe_run_failure(what, self.collector, self.plan.current_host,
                                    build_step_ending(run, self.lost, self.peer_failed))


class MultiHostRole(HostRole):
    """What the roles of a multi-host launch share: the other hosts' names resolved first, a
    watch on the peers from the first run on (it spans the restarts of a job), and a lost
    host ending the current run."""

    def __init__(self, *args):
        super().__init__(*args)
        self.watches: list | None = None  # hosts/job_port.PeerWatch
        self.resolved = False  # every host's name resolved: from then on the others may wait on this one

    def start(self) -> Outcome | None:
        settings = self.plan.settings
        self.loop.on({PeerLost: self.on_peer_lost})
        unresolved = wait_for_hosts(self.plan.hosts, settings.host_resolution_timeout_s, self.loop)
        if self.loop.stopped():
            return None  # the orchestrator words a stop during start-up
        if not unresolved:
            self.resolved = True
            self.mark("hosts resolved")
            outcome = self.start_beside()
            if outcome is None:
                self.mark("peers ready")
            return outcome
        self.collector.tail.append(f"host(s) {', '.join(unresolved)} did not resolve within "
                                   f"{settings.host_resolution_timeout_s:g} s (BYOC_HOST_RESOLUTION_TIMEOUT_S)")
        return Outcome(1, self.describe_failure("waiting for the other hosts' names to resolve", RunResult(1)))

    def start_beside(self) -> Outcome | None:
        """What runs beside the processes; an Outcome when the launch cannot start."""
        return None

    def start_problem(self, problem: str, stopped_by: str | None) -> Outcome:
        self.collector.tail.append(problem)
        return Outcome(1, self.describe_failure(f"{self.what}: starting the workers", RunResult(1, stopped_by)))

    def on_processes_started(self, supervisor) -> None:
        super().on_processes_started(supervisor)  # the base's part: the "processes started" phase
        if self.watches is None:
            self.watches = self.start_watches()
        if self.lost is not None:  # lost while this run's processes started (a restart's): it ends too
            supervisor.stop_after_failure(f"{self.lost}: the job cannot go on")

    def start_watches(self) -> list:
        return []

    def on_peer_lost(self, lost: PeerLost) -> None:
        if self.lost is not None or not self.watches:
            return  # the first lost host is the one named; none is once the watches closed
        self.lost = lost.reason
        self.supervisor.stop_after_failure(f"{lost.reason}: the job cannot go on")

    def close_watches(self) -> None:
        for watch in self.watches or ():
            watch.close()  # this host's part is over: a peer leaving now is not a lost host
        self.watches = []

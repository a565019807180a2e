"""Every host role's lifecycle, which orchestrate.py drives and cli.main ends. Each method is
handed the host (orchestrate.Host), the one owner of the host's state; a role keeps only what
its own launch family adds beside it (its peers: roles/peers.py; its words):

    start(host)        before the processes: what the launch needs beside them (the other
                       hosts' names, sshd, the job port); an Outcome when the launch cannot start
    start_live(host)   the job report's live view, when the report is on
    begin_running(host)  the role started: the job's processes are next
    run_attempt(host, hooks)  one attempt's processes, to their end (a RunResult); an Outcome
                       where this host's part is not its own processes (an MPI worker)
    restart(host, line)  the job restarts after a failed attempt: this host's part before the
                       next one (None when it may start; why not, else)
    end_attempts(host) no attempt follows the last one
    settle(host, outcome)  after them, before anything is written: a leader may wait for its workers
    job_report(host, outcome)  after the outcome is written (cli.main): the leader, or the one
                       host, writes it; a worker hands the leader its figures
    close(host, outcome)  after that: tell the other hosts, release what start() started

and what a run calls back: on_processes_started(host, supervisor), on_rank_killed(host, env,
signum). Every wait of a role is on the host's loop (entrypoint/loop/), where its handlers take
what the other hosts say and a stop ends the wait. One module per launch family: single.py,
job_port.py, mpi.py; peers.py is what the multi-host ones share; choose.py is the one switch
on plan.role. Every role subclasses HostRole directly.
"""

from __future__ import annotations

import functools
import time

from entrypoint.log import log
from entrypoint.outcome.failure import build_step_ending, describe_run_failure
from entrypoint.outcome.records import Outcome
from entrypoint.run.supervise import RunHooks, RunResult, run_processes


class HostRole:
    """A role with nothing beside its processes: one host (or a host outside the distribution).
    The base of every role, and its defaults."""

    def start(self, host) -> Outcome | None:
        return None

    def start_live(self, host) -> None:
        """The leader's (or the one host's) live view: TensorBoard events, the status line."""
        host.report.start_live(log, None, host.plan.settings.capacity_ends_at)

    def begin_running(self, host) -> float | None:
        """The role started: the job's processes are next (orchestrate.py's RUNNING). When they
        started (time.monotonic()), for the success's line; None where they are not this host's."""
        log(f"{host.plan.current_host}: running {host.what} ({host.plan.role})")
        return time.monotonic()

    def run_attempt(self, host, hooks: RunHooks) -> RunResult | Outcome:
        """One attempt: this host's processes of it, run to their end (a RunResult, which the
        orchestrator decides a restart on); an Outcome where this host's part is not its own
        processes (an MPI worker serves mpirun until the leader's word). hooks: the run's
        settings, which the role adds its callbacks to (build_run_hooks)."""
        return run_processes(host.processes_of(host.attempt), host.env, host.plan.cwd,
                             host.collector, host.stop, self.build_run_hooks(host, hooks))

    def build_run_hooks(self, host, hooks: RunHooks) -> RunHooks:
        """What a run of this role's processes calls back (run/supervise.RunHooks)."""
        return hooks._replace(on_started=functools.partial(self.on_processes_started, host),
                              on_rank_killed=functools.partial(self.on_rank_killed, host))

    def restart(self, host, line: str) -> str | None:
        """The attempt this host is in failed and may be started again: this role's part of the
        restart. None when the next attempt may start; why not, else. host.restarts[-1] is this
        restart's record (orchestrate.note_restart), line its log line. Here every process of the
        job is this host's: its own to make."""
        log(line)
        host.next_attempt()
        return None

    def end_attempts(self, host) -> None:
        return None

    def on_processes_started(self, host, supervisor) -> None:
        begin_run(host, supervisor)

    def on_rank_killed(self, host, env: dict[str, str], signum: int):
        """A rank this host started itself died of a signal: on one host, its exit code says it."""
        return None

    def settle(self, host, outcome: Outcome) -> Outcome:
        return outcome

    def job_report(self, host, outcome: Outcome) -> None:
        """This host's figures are the whole report."""
        if host.report is not None:
            write_job_report(host, outcome, {})

    def close(self, host, outcome: Outcome) -> None:
        return None


def begin_run(host, supervisor) -> None:
    """A run's processes started: it is the host's current run, and its phases are marked."""
    host.supervisor = supervisor
    host.mark("processes started")
    if host.attempt > 1:
        host.mark(f"attempt {host.attempt} started")
        if host.restarts and host.restarts[-1]["next_started"] is None:
            host.restarts[-1]["next_started"] = time.time()


def write_job_report(host, outcome: Outcome, others: dict[str, dict]) -> None:
    """The report of this host's figures and others' (host -> figures; a host of the job without
    any is reported missing)."""
    from entrypoint.jobreport.host import write_job_report as write_report

    if host.loop.walked_away_from_here():  # cut short while it read the others' figures: said so
        return
    plan = host.plan
    figures, _ = host.report.end(plan.settings.report_figures_bytes)
    live = host.report.live
    notes = [f"live figures: {n}" for n in live.notes.seen] if live is not None else []
    write_report(host.paths.output_data_dir, host.what, plan.current_host, plan.hosts or (plan.current_host,),
                 outcome.exit_code, {**others, plan.current_host: figures},
                 [f"{plan.current_host}: {n}" for n in host.report_notes] + notes, host.restarts)


def describe_host_failure(host, what: str, run=None) -> str:
    """The failure's words for one step of this host's part (supervise.RunResult run)."""
    return describe_run_failure(what, host.collector, host.plan.current_host,
                                build_step_ending(run, host.lost, host.peer_failed))

"""The end of a job on this host, after its outcome is decided: bounded, and cut short by a stop.

cli.main writes the outcome, then runs the role's last steps here: the job report (a leader
reads its workers' figures, a worker sends its own) and closing (an MPI leader tells its
workers the outcome, a torchrun/PS worker tells its leader and waits for it to end). Then the
job's runtime folders are removed, whatever happened.

- Each step has a deadline (settings.finish_report_s, and for closing settings.finish_close_s
  beyond the role's own wait for its peers, BYOC_PEER_WAIT_TIMEOUT_S). Each runs beside the
  host's loop (HostLoop.run_beside): a step that blocks — a FIFO a script left where we read,
  a peer that accepts and never answers — is walked away from at its deadline, and ends at
  its next wait on the loop (StepCut, its `finally` blocks run); it is given
  settings.finish_after_stop_s to end before the next step (one blocked in the kernel is left
  then, and what it holds ends with the process). No signal handler raises: the stop token only
  posts, and no timer signal is armed (a timer of 1e10 s overflowed time_t).
- A stop (SIGTERM: StopTrainingJob, `docker stop`; SIGINT; SIGHUP) cuts the current step; after
  it the report is skipped and closing gets settings.finish_after_stop_s (what it releases
  here, sshd and the job port, is released in its `finally` blocks, given the same time).
  Before the steps (while the outcome is written) a stop is only noted, so the outcome is
  written whole. The job's one stop token (run/stop.py) carries it: a stop before the outcome
  was the run's to answer; from start_finish on, one counts here.
Either way the outcome already decided stands: output/ as written, the exit code its own.
"""

from __future__ import annotations

import signal
import time

from entrypoint.log import log
from entrypoint.loop import StacksRequested, StopRequested, Waited
from entrypoint.run.stop import NoRanksToAsk, Stop
from entrypoint.settings import DEFAULTS


class Finish:
    """This host's finishing steps, one after the other, each beside the loop (the main thread
    takes the events and the handlers run there, so its fields have one writer)."""

    def __init__(self, stop: Stop) -> None:
        self.stop = stop  # the job's one token: its stops from begin_finishing on are this phase's
        self.stopped_by: str | None = None  # the first stop while finishing (on_stop)
        # How long a step walked away from is given to end before the next (its loop waits end
        # at once with StepCut and its `finally` blocks run: sshd stopped, the port closed,
        # before the folders they use are removed); one blocked in the kernel is left then.
        self.grace_s = DEFAULTS.finish_after_stop_s

    def on_stop(self, event: StopRequested) -> None:
        """The loop's handler of a stop while finishing: said once; the step's wait ends on it."""
        if self.stopped_by is None:
            self.stopped_by = signal.Signals(event.signum).name
            log(f"received {self.stopped_by} while finishing: the outcome already decided stands; ending now")

    def stopped(self) -> bool:
        """A stop came since begin_finishing."""
        return self.stopped_by is not None or self.stop.loop.stopped()

    def step(self, what: str, limit_s: float, action, *args, after_stop_s: float | None = None) -> None:
        """action(*args), cut at limit_s or by a stop; after a stop, skipped, or given
        after_stop_s when set (and then not cut by that stop)."""
        self.stop.loop.handle_pending()  # a stop while the outcome was written is said first
        stopped = self.stopped()
        if stopped:
            if after_stop_s is None:
                log(f"{what}: skipped (the job was stopped while finishing)")
                return
            limit_s = after_stop_s
        loop = self.stop.loop
        waited, _ = loop.run_beside(action, *args, deadline=time.monotonic() + limit_s, stop_ends=not stopped)
        if waited is Waited.DONE:
            return
        if waited is Waited.TIMEOUT:
            log(f"{what}: cut short: it took longer than {limit_s:g} s")
        else:
            log(f"{what}: cut short: stopped by {loop.stop_name}")
        step = loop.walked_away
        loop.wait(lambda: step is None or not step.is_alive(), time.monotonic() + self.grace_s, stop_ends=False)


def start_finish(stop: Stop) -> Finish:
    """Stops count from now on (cli.main calls this before it writes the outcome)."""
    finish = Finish(stop)
    stop.begin_finishing()  # first: a stop from here on counts, and cuts the step under way
    stop.loop.on({StopRequested: finish.on_stop, StacksRequested: NoRanksToAsk()})
    return finish


def end_finish(finish: Finish) -> None:
    """A stop that came as the last steps ended, with nothing left to cut, is still said."""
    if finish.stopped_by is None and finish.stop.loop.stopped():
        log(f"received {finish.stop.loop.stop_name} as the job ended")


def run_finish(finish: Finish, launch, outcome) -> None:
    """The role's report and close (orchestrate.Launch), each bounded; the folders removed last;
    then a stop that came as they ended is said (end_finish)."""
    host = launch.host
    settings = host.plan.settings if host is not None else DEFAULTS
    finish.grace_s = settings.finish_after_stop_s
    try:
        finish.step("job report", settings.finish_report_s, launch.report, outcome)
        finish.step("closing", settings.finish_close_s + settings.peer_wait_timeout_s, launch.close_role, outcome,
                    after_stop_s=settings.finish_after_stop_s)
    finally:
        launch.remove_folders()
        finish.stop.loop.handle_pending()  # a stop that came as the last steps ended is said
    end_finish(finish)

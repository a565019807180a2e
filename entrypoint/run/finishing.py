"""The end of a job on this host, after its outcome is decided: bounded, and cut short by a stop.

cli.main writes the outcome, then runs the role's last steps here: the job report (a leader
reads its workers' figures, a worker sends its own) and closing (an MPI leader tells its
workers the outcome, a torchrun/PS worker tells its leader and waits for it to end). Then the
job's runtime folders are removed, whatever happened.

- Each step has a deadline (SIGALRM; settings.finish_report_s, and for closing
  settings.finish_close_s beyond the role's own wait for its peers, BYOC_PEER_WAIT_TIMEOUT_S).
  A step that blocks — a FIFO a script left where we read, a peer that accepts and never
  answers — is cut there: the signal's handler raises, which ends any blocking call.
- A stop (SIGTERM: StopTrainingJob, `docker stop`; SIGINT) cuts the current step; after it the
  report is skipped and closing gets settings.finish_after_stop_s (what it releases here, sshd
  and the job port, is released in its `finally` blocks even when cut). Before the steps
  (while the outcome is written) a stop is only noted, so the outcome is written whole. The
  job's one stop token (run/stop.py) carries it: a stop before the outcome was the run's to
  answer; from start_finish on, one counts here.
Either way the outcome already decided stands: output/ as written, the exit code its own.
"""

from __future__ import annotations

import signal

from entrypoint.log import log
from entrypoint.run.stop import Stop


class FinishCut(BaseException):  # not caught by a step's `except Exception`
    """A finishing step was cut short: by a stop, or at its deadline."""


class Finish:
    """This host's finishing steps, one after the other (main thread only: the signal
    handlers and the steps run there, so its fields have one writer)."""

    def __init__(self, stop: Stop) -> None:
        self.stop = stop  # the job's one token: its reaction from begin_finishing on is on_stop
        self.stopped_by: str | None = None  # the first stop while finishing (on_stop)
        self.cutting = False  # True while a step runs: a stop or the deadline then raises FinishCut
        self.limit_s = 0.0

    def on_stop(self, signum: int) -> None:
        """The token's reaction while finishing."""
        name = signal.Signals(signum).name
        self.stopped_by = self.stopped_by or name
        log(f"received {name} while finishing: the outcome already decided stands; ending now")
        self.cut(f"stopped by {name}")

    def on_deadline(self, _signum, _frame) -> None:
        self.cut(f"it took longer than {self.limit_s:g} s")

    def cut(self, why: str) -> None:
        if self.cutting:
            self.cutting = False  # once: a second signal must not cut the step's own cleanup
            raise FinishCut(why)

    def stopped(self) -> bool:
        """A stop came since begin_finishing: before on_stop was this phase's reaction too
        (the token posts every stop on the loop, whose stop starts afresh there)."""
        return self.stopped_by is not None or self.stop.loop.stopped()

    def step(self, what: str, limit_s: float, action, *args, after_stop_s: float | None = None) -> None:
        """action(*args), cut at limit_s or by a stop; after a stop, skipped, or given
        after_stop_s when set."""
        if self.stopped():
            if after_stop_s is None:
                log(f"{what}: skipped (the job was stopped while finishing)")
                return
            limit_s = after_stop_s
        self.limit_s = limit_s
        self.cutting = True
        signal.setitimer(signal.ITIMER_REAL, limit_s)
        try:
            action(*args)
        except FinishCut as cut:
            log(f"{what}: cut short: {cut}")
        finally:
            self.cutting = False
            signal.setitimer(signal.ITIMER_REAL, 0)


def start_finish(stop: Stop) -> Finish:
    """Stops count from now on (cli.main calls this before it writes the outcome)."""
    finish = Finish(stop)
    stop.begin_finishing()  # first: a stop from here on counts, and is cut by on_stop
    stop.reaction = finish.on_stop
    signal.signal(signal.SIGALRM, finish.on_deadline)
    return finish


def run_finish(finish: Finish, launch, outcome) -> None:
    """The role's report and close (orchestrate.Launch), each bounded; the folders removed last."""
    from entrypoint.settings import DEFAULTS

    role = launch.role
    settings = role.plan.settings if role is not None else DEFAULTS
    try:
        finish.step("job report", settings.finish_report_s, launch.report, outcome)
        finish.step("closing", settings.finish_close_s + settings.peer_wait_timeout_s, launch.close_role, outcome,
                    after_stop_s=settings.finish_after_stop_s)
    finally:
        launch.remove_folders()

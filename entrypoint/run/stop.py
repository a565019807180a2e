"""The job's one stop token: made once by cli.main, and the process's SIGTERM/SIGINT handler from
then to the end. None makes its own, so a stop taken during one wait is never lost to the next
(the torchrun/PS worker that took a SIGTERM while sending its figures used to wait out
BYOC_PEER_WAIT_TIMEOUT_S in close).

The handler posts StopRequested on the host's loop (entrypoint/loop.py) in every phase, and the
phase's owner may add a reaction that cuts a blocking call (`reacting`):
- start-up (cli.main): StartupStopped is raised, ending whatever step runs;
- from a role's start on (orchestrate.py): no reaction; the loop's waits end on the event, and
  a run forwards it to its processes (run/supervise.Supervisor.on_stop, the run's handler). A
  stop counts from its post: a run started after it starts nothing; one taken while a process
  starts reaches that process once it is started;
- finishing (run/finishing.py): `begin_finishing`, then its steps are cut.
A stop before finishing is the run's to answer (forwarded, then its outcome written); only a
stop after the outcome counts for finishing, so the loop's stop and `requested()` start afresh
at `begin_finishing`. Main thread only: the handler and every writer of its fields run there.
"""

from __future__ import annotations

import contextlib
import signal
import time

from entrypoint.log import log
from entrypoint.loop import HostLoop, StopRequested

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StartupStopped(BaseException):  # not caught by the `except Exception` of a start-up step
    """SIGTERM or SIGINT before the training processes started (the start-up reaction)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Stop:
    """The stop requests this process received, in order, and what the current phase does with one."""

    def __init__(self) -> None:
        self.signals: list[str] = []  # every stop signal's name, in order
        self.at: float | None = None  # time.time() of the first
        self.floor = 0  # requested() counts the signals after this many (begin_finishing)
        self.reaction = None  # the current phase's: called with the signal number; raises
        self.loop = HostLoop()  # where a stop is posted while no reaction raises (the role's phase)

    def install(self) -> None:
        """This token becomes the SIGTERM/SIGINT handler (main thread; idempotent)."""
        for sig in STOP_SIGNALS:
            if signal.getsignal(sig) != self.on_signal:
                signal.signal(sig, self.on_signal)

    def on_signal(self, signum, _frame) -> None:
        name = signal.Signals(signum).name
        self.signals.append(name)
        if self.at is None:
            self.at = time.time()
        self.loop.post(StopRequested(signum))  # every wait on the loop ends on it, in every phase
        if self.reaction is not None:
            self.reaction(signum)  # start-up and finishing also cut the blocking call in progress
        elif not self.loop.handles(StopRequested):
            log(f"received {name}")  # nobody will say it: between the outcome and finishing

    def raise_startup_stopped(self, signum: int) -> None:
        """The start-up reaction: as PID 1 a process gets no default action for SIGTERM, so
        without it a stop while reading /opt/ml, waiting for DNS, fetching code or installing
        requirements was dropped and the container ran on until SIGKILL. cli.main reports it.
        Once: a second stop while the first unwinds is only noted."""
        self.reaction = None
        raise StartupStopped(signum)

    def requested(self) -> bool:
        """A stop came in this phase (since begin_finishing, once finishing began)."""
        return len(self.signals) > self.floor

    @property
    def signal_name(self) -> str | None:
        """The first stop signal of this phase, or None."""
        return self.signals[self.floor] if self.requested() else None

    @property
    def signum(self) -> int:
        return int(signal.Signals[self.signal_name or "SIGTERM"])

    def begin_finishing(self) -> None:
        """The outcome is decided: from here a stop cuts the job's end (run/finishing.py). The
        loop's waits while finishing (a worker's last words to its leader) start afresh: a stop
        the run took already was the run's to answer."""
        self.floor = len(self.signals)
        self.loop.handle_pending()
        self.loop.stop_signum = None
        if self.requested():  # one that came while the queued events were handled: finishing's
            self.loop.stop_signum = self.signum

    @contextlib.contextmanager
    def reacting(self, reaction):
        """reaction(signum) for each stop while inside; None: only noted (the waits poll)."""
        self.install()
        previous, self.reaction = self.reaction, reaction
        try:
            yield self
        finally:
            self.reaction = previous

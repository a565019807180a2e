"""The job's one stop token: made once by cli.main, and the process's SIGTERM/SIGINT/SIGHUP
handler from then to the end. None makes its own, so a stop taken during one wait is never lost
to the next (the torchrun/PS worker that took a SIGTERM while sending its figures used to wait
out BYOC_PEER_WAIT_TIMEOUT_S in close).

Its handler only posts StopRequested on the host's loop (entrypoint/loop/), in every phase:
it writes nothing and raises nothing (a handler that wrote to a slow log pipe nested under a
burst of signals and ended the process). The phase's owner answers it:
- start-up (cli.main, orchestrate.run_plan up to the role's start): each step looks at the loop
  before the next; a step that may block in the kernel (reading the job, fetching the code)
  runs beside the loop (HostLoop.run_beside), which walks away from it on the stop;
- from a role's start on (orchestrate.py): the loop's waits end on the event, and a run
  forwards it to its processes (run/supervise.Supervisor.on_stop, the run's handler). A stop
  counts from its post: a run started after it starts nothing; one taken while a process
  starts reaches that process once it is started;
- finishing (run/finishing.py): `begin_finishing`, then each step runs beside the loop and is
  walked away from on the stop.
A stop before finishing is the run's to answer (forwarded, then its outcome written); only a
stop after the outcome counts for finishing, so the loop's stop and `requested()` start afresh
at `begin_finishing`.

SIGHUP (a closed terminal, `docker run -it` ended) is a stop like SIGTERM: the outcome names
it (exit code 129), and the processes get SIGTERM, the signal a training script saves on.
"""

from __future__ import annotations

import signal
import time

from entrypoint.log import log
from entrypoint.loop import Burst, HostLoop, StacksRequested, StopRequested
from entrypoint.settings import DEFAULTS

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# What a stop is forwarded to the processes as: SIGHUP's default would end a rank without the
# checkpoint its SIGTERM handler writes.
FORWARDED_AS = {signal.SIGHUP: signal.SIGTERM}


def decide_forwarded_signal(signum: int) -> int:
    """The signal the processes get for a stop that came as signum."""
    return int(FORWARDED_AS.get(signum, signum))


class SayStop:
    """A phase's handler of StopRequested that only says it: the first stop, once for all the
    phases before finishing (loop.stop_said: a burst of 3,000 SIGTERM is one line, and a run
    that said it is not followed by another line); the waits end on the loop's stop."""

    def __init__(self, loop: HostLoop, words: str = "") -> None:
        self.loop = loop
        self.words = words  # after the signal's name: " during start-up"

    def __call__(self, event: StopRequested) -> None:
        if not self.loop.stop_said:
            self.loop.stop_said = True
            log(f"received {signal.Signals(event.signum).name}{self.words}")


class NoRanksToAsk:
    """The handler of SIGUSR1 outside a run (start-up, waits, finishing): no rank to ask; it
    must not end the process. Said once per burst."""

    def __init__(self, within_s: float = DEFAULTS.signal_burst_s) -> None:
        self.burst = Burst()
        self.within_s = within_s

    def __call__(self, event: StacksRequested) -> None:
        said = self.burst.take(self.within_s, event.at)
        if said is not None:
            log(f"SIGUSR1{said}: no training process is running on this host yet (or any more)")


class Stop:
    """The stop requests this process received, in order (posted on its loop), and the phase
    that counts them."""

    def __init__(self) -> None:
        self.floor = 0  # requested() counts the stops after this many (begin_finishing)
        self.loop = HostLoop()  # where every stop is posted

    def install(self) -> None:
        """This token becomes the stop signals' handler, and SIGUSR1 posts StacksRequested, for
        the process's life (main thread; idempotent). Each only posts."""
        for sig in STOP_SIGNALS:
            if signal.getsignal(sig) != self.on_signal:
                signal.signal(sig, self.on_signal)
        if signal.getsignal(signal.SIGUSR1) != self.on_stack_request:
            signal.signal(signal.SIGUSR1, self.on_stack_request)

    def on_signal(self, signum, _frame) -> None:
        self.loop.post(StopRequested(signum, time.monotonic()))  # every wait on the loop ends on it

    def on_stack_request(self, _signum, _frame) -> None:
        self.loop.post(StacksRequested(time.monotonic()))  # the phase's handler asks the ranks, or says none

    @property
    def signals(self) -> list[str]:
        """Every stop signal's name, in order."""
        return [signal.Signals(s).name for s in self.loop.stops]

    @property
    def at(self) -> float | None:
        """time.time() of the first stop."""
        return self.loop.stop_at

    def requested(self) -> bool:
        """A stop came in this phase (since begin_finishing, once finishing began)."""
        return len(self.loop.stops) > self.floor

    @property
    def signal_name(self) -> str | None:
        """The first stop signal of this phase, or None."""
        return signal.Signals(self.loop.stops[self.floor]).name if self.requested() else None

    @property
    def signum(self) -> int:
        return int(signal.Signals[self.signal_name or "SIGTERM"])

    def begin_finishing(self) -> None:
        """The outcome is decided: from here a stop cuts the job's end (run/finishing.py). The
        loop's waits while finishing (a worker's last words to its leader) start afresh: a stop
        the run took already was the run's to answer."""
        self.floor = len(self.loop.stops)
        self.loop.handle_pending()
        self.loop.stop_signum = None
        if self.requested():  # one that came while the queued events were handled: finishing's
            self.loop.stop_signum = self.signum

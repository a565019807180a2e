"""This host's one loop: every thread, port reader and signal handler only *posts* a typed event
here; the main thread takes them, one at a time, and hands each to the handler the current
phase registered for its type. So the role's state has one writer (the main thread), no lock
guards it, and every wait is a wait on this queue, with its deadline as the timeout.

    post(event)          any thread, and a signal handler (SimpleQueue.put is reentrant)
    on({Type: handler})  the current phase's handlers, for the events of those types
    wait(until, deadline)  take events until until() is true, a stop came, or the deadline
    handle_pending()     take what is queued now, without waiting

A stop is an event like the others: the stop token (run/stop.py) posts StopRequested from
its signal handler, and it counts from its post: every wait ends on it (Waited.STOPPED), so
a stop cannot fall between two mechanisms. The loop keeps the first stop posted: a wait begun
after it ends at once. torch's elastic agent is the model (_invoke_run: one loop, one state value).

Every signal handler of the entrypoint only posts (tests/entrypoint/test_layout.py reads them
from the code): nothing is written, raised or decided in one, so a burst of signals nests
nothing and a slow log pipe cannot wedge the process. A call that may block in the kernel
(reading a FIFO, fetching the code, a finishing step's peer that never answers) is not cut by
an exception from a handler: it runs beside the loop (run_beside), on a thread of its own,
while the main thread takes the events; the main thread walks away from it on a stop or at
its deadline. Such a step's own waits on the loop (wait, pause) see what the main thread
handled: the handlers still run on the main thread alone, under the loop's lock, and a step's
wait looks at the state under the same lock. A step walked away from ends at its next wait
(StepCut), running its `finally` blocks.

Some conditions post nothing (a process that exits where no SIGCHLD is caught, an orphan an
MPI worker adopts): their owner looks at them between take(interval)s. No wait goes longer than
tick_s without looking at its condition.
"""

from __future__ import annotations

import enum
import queue
import signal
import threading
import time
from typing import Callable, NamedTuple

from entrypoint.log import log
from entrypoint.settings import DEFAULTS


class StopRequested(NamedTuple):
    """SIGTERM or SIGINT reached this process (posted by the stop token's handler)."""

    signum: int


class StacksRequested(NamedTuple):
    """SIGUSR1: every rank on this host prints its Python stack (the run's handler asks them;
    outside a run there is none to ask, and the phase says so)."""

    at: float = 0.0  # time.monotonic() of its post: a burst is told by when the signals came


class ChildExited(NamedTuple):
    """SIGCHLD: a process below this one ended (posted while a run is on)."""


class StepEnded(NamedTuple):
    """A step run beside the loop returned or raised (run_beside)."""


class StepCut(BaseException):  # not caught by a step's `except Exception`
    """Raised in a step run beside the loop, at its next wait, once the main thread walked away
    from it (a stop, or its deadline): what it holds is released in its `finally` blocks."""


class Burst:
    """Signals that come in a burst (3,000 SIGUSR1 from a script's loop) are said once: take()
    answers the first of a burst, and the next after within_s of quiet, with how many it kept
    quiet about ("" when none); None for the rest. A signal's time is its post's (at), not its
    handling's: behind a log write that blocks, a whole burst is handled late, and still one.
    Main thread only (a loop handler)."""

    def __init__(self) -> None:
        self.last: float | None = None  # when the last one came (monotonic)
        self.quiet = 0  # taken since the last one said

    def take(self, within_s: float, at: float | None = None) -> str | None:
        now = time.monotonic() if not at else at
        in_burst = self.last is not None and now - self.last < within_s
        self.last = now
        if in_burst:
            self.quiet += 1
            return None
        said, self.quiet = self.quiet, 0
        return f" (and {said} more before, not said)" if said else ""


class Waited(enum.Enum):
    DONE = "done"  # until() turned true
    STOPPED = "stopped"  # a stop came (now, or before the wait began)
    TIMEOUT = "timeout"  # the deadline passed first


class HostLoop:
    def __init__(self, tick_s: float = DEFAULTS.stop_check_s) -> None:
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        # The longest any wait goes without looking: a signal the kernel hands another thread
        # runs its Python handler (which posts) only once the main thread runs again.
        self.tick_s = tick_s
        self._handlers: dict[type, Callable] = {}
        self.stop_signum: int | None = None  # the first StopRequested posted (since begin_finishing)
        self.stops: list[int] = []  # every stop posted, in order (the stop token reads them)
        self.stop_at: float | None = None  # time.time() of the first
        self.stop_said = False  # a phase said the stop (run/stop.SayStop, the run): once is enough
        # Held by the main thread while it handles an event, and by a step run beside the loop
        # while it looks at its wait's condition: the role's state has one writer at a time.
        self._lock = threading.Condition(threading.RLock())
        # The threads of steps walked away from (StepCut at their next wait): the Thread objects,
        # not their idents, which the kernel hands to a later thread once one has ended.
        self._cut: set = set()
        self.walked_away: threading.Thread | None = None  # the last step run_beside walked away from

    def post(self, event) -> None:
        """Any thread, or a signal handler on the main thread: never blocks, never raises. A
        stop counts from its post (its handler runs on the main thread, between two lines of
        whatever runs there): a check just before an act sees it, queued or not."""
        if isinstance(event, StopRequested):
            self.stops.append(event.signum)  # list.append: atomic, no lock (a handler may post)
            if self.stop_at is None:
                self.stop_at = time.time()
            if self.stop_signum is None:
                self.stop_signum = event.signum
        self._events.put(event)

    def on(self, handlers: dict[type, Callable]) -> dict[type, Callable]:
        """Register handlers (type -> callable(event)); returns those they replaced, for off()."""
        with self._lock:
            previous = {kind: self._handlers.get(kind) for kind in handlers}
            self._handlers.update(handlers)
        return previous

    def off(self, previous: dict[type, Callable]) -> None:
        with self._lock:
            for kind, handler in previous.items():
                if handler is None:
                    self._handlers.pop(kind, None)
                else:
                    self._handlers[kind] = handler

    @property
    def stop_name(self) -> str | None:
        """The first stop's signal name (SIGTERM), or None."""
        return None if self.stop_signum is None else signal.Signals(self.stop_signum).name

    def handles(self, kind: type) -> bool:
        return kind in self._handlers

    def stopped(self) -> bool:
        """A stop was posted (the stop token's handler)."""
        return self.stop_signum is not None

    def dispatch(self, event) -> None:
        """The event to its handler. A handler that raises is a defect of ours: said with its
        traceback, and the loop goes on (the wait that took it must still reach its deadline)."""
        with self._lock:
            handler = self._handlers.get(type(event))
            try:
                if handler is not None:
                    handler(event)
            except Exception as exc:  # noqa: BLE001 - a wait's decision must not die of one event
                import traceback

                log(f"internal error while handling {type(event).__name__}: {type(exc).__name__}: {exc}")
                traceback.print_exc()
            finally:
                self._lock.notify_all()  # a step's wait beside the loop looks again

    def handle_pending(self) -> None:
        """Every event queued now, handled here (main thread). From a step run beside the loop:
        nothing to do, the main thread takes the events as they come."""
        if threading.current_thread() is not threading.main_thread():
            return
        while True:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                return
            self.dispatch(event)

    def wait(self, until: Callable[[], bool] = lambda: False, deadline: float | None = None,
             stop_ends: bool = True) -> Waited:
        """Take events, each handled here, until until() is true (checked after each event and
        each tick), a stop came (unless stop_ends is False: a run that forwards the stop waits
        on for its processes), or time.monotonic() reaches deadline (None: no deadline). From a
        step run beside the loop (run_beside), the same answers, from what the main thread handles."""
        if threading.current_thread() is not threading.main_thread():
            return self._wait_beside(until, deadline, stop_ends)
        while True:
            self.handle_pending()  # what is queued is taken first, even by a wait whose deadline passed
            seen = self._look(until, deadline, stop_ends)
            if isinstance(seen, Waited):
                return seen
            try:
                event = self._events.get(timeout=seen)
            except queue.Empty:
                with self._lock:
                    self._lock.notify_all()  # a tick, beside the loop too
                continue  # a tick: until() and the deadline are looked at again
            self.dispatch(event)

    def _wait_beside(self, until: Callable[[], bool], deadline: float | None, stop_ends: bool) -> Waited:
        """wait(), on a step's own thread: the main thread takes the events and wakes this at
        each one it handled and at each tick."""
        me = threading.current_thread()
        with self._lock:
            while True:
                if me in self._cut:
                    raise StepCut()
                seen = self._look(until, deadline, stop_ends)
                if isinstance(seen, Waited):
                    return seen
                self._lock.wait(seen)

    def walked_away_from_here(self) -> bool:
        """This thread runs a step the main thread walked away from (run_beside): what it was
        to write is not written any more (a job report said cut short appears after all)."""
        with self._lock:
            return threading.current_thread() in self._cut

    def _look(self, until: Callable[[], bool], deadline: float | None, stop_ends: bool) -> Waited | float:
        """What a wait sees now: its answer, or how long it may wait before it looks again."""
        if until():
            return Waited.DONE
        if stop_ends and self.stop_signum is not None:
            return Waited.STOPPED
        timeout = None if deadline is None else deadline - time.monotonic()
        if timeout is not None and timeout <= 0:
            return Waited.TIMEOUT
        return self.tick_s if timeout is None else min(timeout, self.tick_s)

    def run_beside(self, action: Callable, *args, deadline: float | None = None,
                   stop_ends: bool = True) -> tuple[Waited, object]:
        """action(*args) on a thread of its own, while this (the main) thread takes the events:
        (DONE, what it returned) once it returned; an exception it raised is raised here.
        (STOPPED, None) when a stop came first (unless stop_ends is False), (TIMEOUT, None) at
        deadline: the thread is left where it is (a daemon; blocked in the kernel, it ends with
        the process), and its next wait on this loop raises StepCut. A stop posted before the
        call starts nothing."""
        if stop_ends and self.stop_signum is not None:
            return Waited.STOPPED, None
        box: dict[str, object] = {}

        def body() -> None:
            try:
                box["value"] = action(*args)
            except StepCut:
                pass  # walked away from: nobody reads its value
            except BaseException as exc:  # noqa: BLE001 - raised again on the main thread
                box["error"] = exc
            finally:
                box["ended"] = True
                self.post(StepEnded())

        step = threading.Thread(target=body, daemon=True, name=getattr(action, "__name__", "step"))
        step.start()
        waited = self.wait(lambda: "ended" in box, deadline, stop_ends)
        if waited is not Waited.DONE:
            with self._lock:
                self._cut.add(step)
                self._lock.notify_all()
            self.walked_away = step  # finishing gives it a moment to end (its finally blocks) before going on
            return waited, None
        if "error" in box:
            raise box["error"]
        return Waited.DONE, box.get("value")

    def take(self, timeout_s: float) -> bool:
        """Wait at most timeout_s for an event; handle it and every one queued behind it. True
        when one came. (A run's wait: it looks at its processes after each.)"""
        assert threading.current_thread() is threading.main_thread(), "a run's wait is the main thread's"
        try:
            event = self._events.get(timeout=max(0.0, min(timeout_s, self.tick_s)))
        except queue.Empty:
            return False
        self.dispatch(event)
        self.handle_pending()
        return True

    def pause(self, seconds: float) -> bool:
        """Wait seconds, handling what comes meanwhile; False when a stop ended it."""
        return self.wait(deadline=time.monotonic() + seconds) is not Waited.STOPPED

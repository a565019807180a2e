"""This host's one loop: every thread, port reader and signal handler only *posts* a typed event
here (the events and who takes each: events.py); the main thread takes them, one at a time,
and hands each to the handlers the current phase registered for its type. So the role's state
has one writer (the main thread), no lock guards it, and every wait is a wait on this queue,
with its deadline as the timeout.

    post(event)          any thread, and a signal handler (SimpleQueue.put is reentrant)
    on({Type: handler})  the current phase's handlers (one or several a type), in place of an
                         earlier phase's for those types, until off()
    also({Type: handler})  handlers beside the current phase's (a step that must see a stop the
                         run answers too), until off()
    wait(until, deadline)  take events until until() is true, a stop came, or the deadline
    handle_pending()     take what is queued now, without waiting

An event no handler takes is said once for its type (a phase that forgot it), never dropped
without a word; events.WAKE_UPS only wake a wait and need none.

A stop is an event like the others: the stop token (run/stop.py) posts StopRequested from
its signal handler, and it counts from its post: every wait ends on it (Waited.STOPPED), so
a stop cannot fall between two mechanisms. The loop keeps the first stop posted: a wait begun
after it ends at once. torch's elastic agent is the model (_invoke_run: one loop, one state value).

Every signal handler of the entrypoint only posts (tests/entrypoint/test_signal_handlers.py reads them
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
from typing import Callable

from entrypoint.log import log
from entrypoint.loop.events import WAKE_UPS, StepEnded, StopRequested
from entrypoint.settings import DEFAULTS


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
        self._layers: list[Handlers] = []  # the phases' handlers, oldest first (on, also)
        self._unhandled: set[type] = set()  # the types said once as taken by no handler
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

    def on(self, handlers: dict[type, Callable | tuple[Callable, ...]]) -> "Handlers":
        """A phase's handlers (type -> a callable(event), or several, called in order): from now
        on they take the events of those types, in place of those an earlier phase registered
        for the same types, until off(the returned Handlers)."""
        return self._register(handlers, beside=False)

    def also(self, handlers: dict[type, Callable | tuple[Callable, ...]]) -> "Handlers":
        """Handlers that take their types' events beside the current phase's (after them), until
        off(): a step within a phase that must see a stop the phase also answers."""
        return self._register(handlers, beside=True)

    def _register(self, handlers: dict, beside: bool) -> "Handlers":
        layer = Handlers({kind: tuple(h) if isinstance(h, tuple) else (h,) for kind, h in handlers.items()}, beside)
        with self._lock:
            self._layers.append(layer)
        return layer

    def off(self, layer: "Handlers") -> None:
        """Those handlers take nothing more (whatever was registered after them stays)."""
        with self._lock:
            if layer in self._layers:
                self._layers.remove(layer)

    def handlers_of(self, kind: type) -> tuple[Callable, ...]:
        """What takes an event of this type now, in the order it is called: the innermost phase
        that registered the type, then every `also` registered after it."""
        found: list[tuple[Callable, ...]] = []
        for layer in reversed(self._layers):
            if kind in layer.kinds:
                found.append(layer.kinds[kind])
                if not layer.beside:
                    break
        return tuple(h for handlers in reversed(found) for h in handlers)

    @property
    def stop_name(self) -> str | None:
        """The first stop's signal name (SIGTERM), or None."""
        return None if self.stop_signum is None else signal.Signals(self.stop_signum).name

    def stopped(self) -> bool:
        """A stop was posted (the stop token's handler)."""
        return self.stop_signum is not None

    def dispatch(self, event) -> None:
        """The event to its handlers. One that none takes is said once for its type (a phase
        that forgot it), a wake-up aside. A handler that raises is a defect of ours: said with
        its traceback, and the loop goes on (the wait that took it must still reach its deadline)."""
        with self._lock:
            try:
                handlers = self.handlers_of(type(event))
                if not handlers and type(event) not in WAKE_UPS and type(event) not in self._unhandled:
                    self._unhandled.add(type(event))
                    log(f"internal: no phase takes {type(event).__name__} events now: dropped (said once)")
                for handler in handlers:
                    self._call(handler, event)
            finally:
                self._lock.notify_all()  # a step's wait beside the loop looks again

    @staticmethod
    def _call(handler: Callable, event) -> None:
        try:
            handler(event)
        except Exception as exc:  # noqa: BLE001 - a wait's decision must not die of one event
            import traceback

            log(f"internal error while handling {type(event).__name__}: {type(exc).__name__}: {exc}")
            traceback.print_exc()

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
            self._take_one(seen)  # then until() and the deadline are looked at again

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
        if not self._take_one(max(0.0, min(timeout_s, self.tick_s))):
            return False
        self.handle_pending()
        return True

    def _take_one(self, timeout_s: float) -> bool:
        """The one dequeue step of every wait: the next event, handled, within timeout_s; a
        tick (nothing came) wakes the steps beside the loop to look again. True when one came."""
        try:
            event = self._events.get(timeout=timeout_s)
        except queue.Empty:
            with self._lock:
                self._lock.notify_all()
            return False
        self.dispatch(event)
        return True

    def pause(self, seconds: float, stop_ends: bool = True) -> bool:
        """Wait seconds, handling what comes meanwhile; False when a stop ended it (stop_ends
        False: a sender's pause between tries, whose deadline is its own, goes on)."""
        return self.wait(deadline=time.monotonic() + seconds, stop_ends=stop_ends) is not Waited.STOPPED


class Handlers:
    """One registration on the loop (HostLoop.on, HostLoop.also): type -> its handlers, and
    whether they run beside the phase's own (also) or in place of an earlier phase's (on)."""

    __slots__ = ("kinds", "beside")

    def __init__(self, kinds: dict[type, tuple[Callable, ...]], beside: bool) -> None:
        self.kinds, self.beside = kinds, beside

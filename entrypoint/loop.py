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

Some conditions post nothing (a process that exits where no SIGCHLD is caught, a file a peer
writes over SSH): their owner looks at them between take(interval)s. No wait goes longer than
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
        self.stop_signum: int | None = None  # the first StopRequested posted

    def post(self, event) -> None:
        """Any thread, or a signal handler on the main thread: never blocks, never raises. A
        stop counts from its post (its handler runs on the main thread, between two lines of
        whatever runs there): a check just before an act sees it, queued or not."""
        if isinstance(event, StopRequested) and self.stop_signum is None:
            self.stop_signum = event.signum
        self._events.put(event)

    def on(self, handlers: dict[type, Callable]) -> dict[type, Callable]:
        """Register handlers (type -> callable(event)); returns those they replaced, for off()."""
        previous = {kind: self._handlers.get(kind) for kind in handlers}
        self._handlers.update(handlers)
        return previous

    def off(self, previous: dict[type, Callable]) -> None:
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
        handler = self._handlers.get(type(event))
        if handler is None:
            return
        try:
            handler(event)
        except Exception as exc:  # noqa: BLE001 - a wait's decision must not die of one event
            import traceback

            log(f"internal error while handling {type(event).__name__}: {type(exc).__name__}: {exc}")
            traceback.print_exc()

    def handle_pending(self) -> None:
        """Every event queued now, handled here (main thread)."""
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
        on for its processes), or time.monotonic() reaches deadline (None: no deadline)."""
        assert threading.current_thread() is threading.main_thread(), "the loop runs on the main thread"
        while True:
            self.handle_pending()  # what is queued is taken first, even by a wait whose deadline passed
            if until():
                return Waited.DONE
            if stop_ends and self.stop_signum is not None:
                return Waited.STOPPED
            timeout = None if deadline is None else deadline - time.monotonic()
            if timeout is not None and timeout <= 0:
                return Waited.TIMEOUT
            timeout = self.tick_s if timeout is None else min(timeout, self.tick_s)
            try:
                event = self._events.get(timeout=timeout)
            except queue.Empty:
                continue  # a tick: until() and the deadline are looked at again
            self.dispatch(event)

    def take(self, timeout_s: float) -> bool:
        """Wait at most timeout_s for an event; handle it and every one queued behind it. True
        when one came. (A run's wait: it looks at its processes after each.)"""
        assert threading.current_thread() is threading.main_thread(), "the loop runs on the main thread"
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

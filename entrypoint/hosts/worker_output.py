"""The MPI leader's view of its workers' rank output: one SSH session per worker for each run,
in which the worker follows the files its Open MPI daemon writes for its ranks
(`--output-filename DIR:nocopy`, decide/plan.py; run/rank_output.run_for_leader) and streams
back every line, whole, under the rank's tag.

Why not mpirun's forwarding (--tag-output): its tags cannot be told from the same text inside a
rank's line, and a burst of short lines loses some (run/tagged_lines.py). Here the framing is
ours: a line from the follower is whole, its first tag is the follower's, and everything after
it is the rank's text, tag-shaped or not. So no rejoiner: each line goes as it is to this
host's stdout or stderr (by its tag's stream) and to the collector, like a line of any process
here: root causes, the failure's tail, the silence of BYOC_HANG_TIMEOUT_S, the stacks of a hang,
the live view's metric lines.

Order (run/supervise.py, through the role's RunHooks.before_start): every session is open and
has said READY_LINE (it cleared the worker's folder) before mpirun starts; after mpirun ends,
the leader closes each session's stdin, the follower reads its files to the end and exits, and
the leader waits for it (bounded, a stop cuts it) before the outcome is decided. A session that
cannot start or ends early loses that worker's lines: said once in the log, never a failure.

A session's threads only pump lines to the collector and post what happened to the session
(SessionReady, SessionEnded) on the host's loop (entrypoint/loop.py); the session's state is
the main thread's, and the waits for it are the loop's.
"""

from __future__ import annotations

import re
import threading
import time
from typing import NamedTuple

from entrypoint.hosts import mpi_wire
from entrypoint.loop import StopRequested, Waited
from entrypoint.settings import DEFAULTS

# The follower's first line, once it follows (run/rank_output.py keeps its copy: it runs by path,
# standard library only); every later line starts with a rank's tag, this one never.
READY_LINE = b"byoc-rank-output: following\n"
# The longest line the follower writes: a tag and run/rank_output.MAX_PENDING_BYTES (64 KiB).
MAX_LINE_BYTES = 2 * 65536

_LEADING_TAG = re.compile(rb"\[\d+,\d+\]<(stdout|stderr|stddiag)>:")
_ERROR_TAIL_BYTES = 2000  # of a session's stderr, for the one line that says it was lost


def parse_worker_line(line: bytes) -> str:
    """Which of our streams a follower's line goes to, by its first tag only (the follower's:
    what follows is the rank's text, whatever it holds). A line without one is not a rank's:
    stderr."""
    match = _LEADING_TAG.match(line)
    return "stdout" if match is not None and match.group(1) == b"stdout" else "stderr"


def build_worker_lines(pending: bytes, data: bytes) -> tuple[list[bytes], bytes]:
    """The whole lines of pending + data and what waits for its end (the follower writes only
    whole lines; a wait past MAX_LINE_BYTES is not one of its lines: passed on)."""
    *lines, rest = (pending + data).split(b"\n")
    if len(rest) > MAX_LINE_BYTES:
        lines.append(rest)
        rest = b""
    return lines, rest


class SessionReady(NamedTuple):
    """A worker's follower said READY_LINE: it follows its folder."""

    session: object  # the WorkerSession (one per worker and run: an earlier run's is not this one's)


class SessionEnded(NamedTuple):
    """A worker's session's stdout reached its end."""

    session: object


class WorkerSession:
    """One worker's session: its ssh process, whose two pipes the run's one OutputPump reads,
    posting SessionReady and SessionEnded (post: the host loop's)."""

    def __init__(self, host: str, proc, collector, sinks: dict, log, post=lambda event: None) -> None:
        self.host, self.proc, self.collector, self.sinks, self.log, self.post = host, proc, collector, sinks, log, post
        self.ready = False  # (main thread) its follower said READY_LINE
        self.ended = False  # (main thread) its stdout reached its end
        self.closing = False  # the leader closed its stdin: its end is expected now
        self.lost_said = False
        self.errors = b""  # the end of its stderr (ssh's and the follower's own words)
        self.streams: dict[bytes, object] = {}  # tag -> the collector's masking state of that rank stream
        # The pump's own: what its stdout said so far, and whether the first line was READY_LINE.
        self.pending, self.following, self.pipes_open = b"", None, 2

    def take_output(self, chunk: bytes) -> bool:
        """(the pump) A piece of its stdout; False once the pump should read no more of it."""
        if self.following is None:
            head, newline, rest = (self.pending + chunk).partition(b"\n")
            if not newline and len(head) < len(READY_LINE):
                self.pending = head
                return True
            self.following = head + newline == READY_LINE
            self.pending = b""
            if not self.following:  # not our follower: its session is over for this log
                self.post(SessionEnded(self))
                return False
            self.post(SessionReady(self))
            chunk = rest
        lines, self.pending = build_worker_lines(self.pending, chunk)
        self._deliver(lines)
        return True

    def take_errors(self, chunk: bytes) -> None:
        self.errors = (self.errors + chunk)[-_ERROR_TAIL_BYTES:]

    def pipe_ended(self) -> None:
        """(the pump) One of its pipes ended; once both have, the session has."""
        self.pipes_open -= 1
        if self.pipes_open == 0 and self.following is not False:
            if self.following and self.pending:
                self._deliver([self.pending])
            self.pending = b""
            self.post(SessionEnded(self))


    def on_ready(self) -> None:
        self.ready = True

    def on_ended(self) -> None:
        self.ended = True
        if self.ready and not self.closing:
            self.say_lost("its session ended before mpirun did")

    def _deliver(self, lines: list[bytes]) -> None:
        by_sink: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
        for line in lines:
            by_sink[parse_worker_line(line)].append(line + b"\n")
        for name, batch in by_sink.items():
            if batch:
                try:
                    self.sinks[name].write(b"".join(batch))  # one write: the lines stay whole among the others'
                    self.sinks[name].flush()
                except (OSError, ValueError):
                    pass  # our own stdout is gone: the lines still reach the collector
        for line in lines:
            match = _LEADING_TAG.match(line)
            tag = match.group() if match is not None else b""
            if tag not in self.streams:
                self.streams[tag] = self.collector.open_stream()
            self.collector.add_line(line, self.streams[tag])

    def say_lost(self, why: str) -> None:
        """Once per session: this worker's ranks' lines (from here on) are not in this log."""
        if self.lost_said:
            return
        self.lost_said = True
        detail = self.errors.decode("utf-8", "replace").strip().splitlines()
        self.log(f"{self.host}: its ranks' output cannot reach this log: {why}"
                 + (f" ({detail[-1]})" if detail else "") + "; the job goes on")

    def close(self) -> None:
        """mpirun ended: the follower reads its files to the end, then ends the session."""
        self.closing = True
        try:
            self.proc.stdin.close()
        except (OSError, ValueError):
            pass

    def end(self) -> None:
        """Cut the session (SIGKILL to its ssh) and collect it."""
        self.closing = True
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class OutputPump:
    """Every session's two pipes, read by one thread (a selector): at 256 hosts, two threads a
    session were 510 of the leader's. Ends once every pipe has."""

    def __init__(self, sessions: list[WorkerSession]) -> None:
        import os
        import selectors

        self._selector = selectors.DefaultSelector()
        for session in sessions:
            for pipe, kind in ((session.proc.stdout, "out"), (session.proc.stderr, "err")):
                os.set_blocking(pipe.fileno(), False)
                self._selector.register(pipe.fileno(), selectors.EVENT_READ, (session, kind))
        self.thread = threading.Thread(target=self._run, daemon=True, name="byoc-worker-output")
        self.thread.start()

    def _run(self) -> None:
        import os

        try:
            while self._selector.get_map():
                for key, _ in self._selector.select():
                    session, kind = key.data
                    try:
                        chunk = os.read(key.fd, 65536)
                    except BlockingIOError:
                        continue
                    except OSError:
                        chunk = b""
                    keep = bool(chunk) and (session.take_output(chunk) if kind == "out" else
                                            session.take_errors(chunk) is None)
                    if not keep:
                        self._selector.unregister(key.fd)
                        session.pipe_ended()
        finally:
            self._selector.close()


class WorkerOutput:
    """Every worker's session of one run; stop() is the Supervisor's end of a follower. Its
    sessions' events are handled on the loop from start_worker_output to stop()."""

    def __init__(self, sessions: list[WorkerSession], loop, pump: OutputPump | None = None) -> None:
        self.sessions = sessions
        self.loop = loop
        self.pump = pump
        mine = list(sessions)  # a late event of another run's session is not this run's
        self.handlers = loop.on({SessionReady: lambda event: event.session in mine and event.session.on_ready(),
                                 SessionEnded: lambda event: event.session in mine and event.session.on_ended()})

    def stop(self, join_s: float) -> None:
        """Every session's lines to their end, within join_s (a stop that comes meanwhile cuts
        the wait; one that came during the run does not: its ranks' last words count most).
        A stop here is still the run's too (its handler before this one's)."""
        for session in self.sessions:
            session.close()
        self.loop.handle_pending()  # what came before this wait is the run's alone
        cut: list = []

        def on_stop(event) -> None:
            cut.append(event)
            if previous.get(StopRequested) is not None:
                previous[StopRequested](event)  # the run's: it forwards and notes the stop

        previous = self.loop.on({StopRequested: on_stop})
        try:
            self.loop.wait(lambda: bool(cut) or all(s.ended for s in self.sessions), time.monotonic() + join_s,
                           stop_ends=False)
        finally:
            self.loop.off(previous)
        for session in self.sessions:
            if not session.ended:
                session.say_lost(f"its last lines did not arrive within {join_s:g} s")
            session.end()
        if self.pump is not None:
            self.pump.thread.join(timeout=DEFAULTS.thread_join_s)  # every pipe ended with its ssh
        self.loop.off(self.handlers)


def start_worker_output(plan, folder: str, python: str, collector, loop, sinks: dict, log) -> WorkerOutput:
    """Open every worker's session and wait until each follows its folder (at most
    settings.ssh_session_timeout_s; a stop ends the wait): mpirun may start then. A worker that
    is not ready by then is cut, and said so."""
    settings = plan.settings
    command = mpi_wire.build_follow_command(python, folder, settings.quiet_line_s, settings.wait_poll_s)
    sessions, started = [], time.monotonic()
    for host in plan.peers:
        try:
            sessions.append(WorkerSession(host, mpi_wire.start_follow_session(plan, host, command), collector, sinks,
                                          log, loop.post))
        except OSError as error:
            log(f"{host}: its ranks' output cannot reach this log: ssh did not start ({error}); the job goes on")
    output = WorkerOutput(sessions, loop, OutputPump(sessions))
    waited = loop.wait(lambda: all(s.ready or s.ended for s in sessions),
                       time.monotonic() + settings.ssh_session_timeout_s)
    for session in sessions:
        if not session.ready:
            # Cut now: a follower that started after mpirun would clear the files it writes.
            why = ("its session ended before it was ready" if session.ended
                   else f"its session was not ready within {settings.ssh_session_timeout_s:g} s")
            session.end()
            if waited is not Waited.STOPPED:  # stopped: no run starts, nothing of it is lost
                session.say_lost(why)
    output.sessions = [s for s in sessions if s.ready]
    if output.sessions:
        log(f"{len(output.sessions)} worker(s) stream their ranks' output here over SSH (ready in "
            f"{time.monotonic() - started:.2f} s)")
    return output

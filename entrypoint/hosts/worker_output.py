"""The MPI workers' rank output, streamed to the leader: for each run, one TCP connection a
worker, on which the worker follows the files its Open MPI daemon writes for its ranks
(`--output-filename DIR:nocopy`, decide/plan.py; run/rank_output.RankOutputFollower) and sends
every line, whole, under the rank's tag. Until 2026-12-02 this was an SSH session a worker,
which cost the leader an ssh client and a fork each (5–6 ms of its CPU a worker and run) and
each worker an sshd session and a Python interpreter (docs/benchmarks-multihost.md).

Why not mpirun's forwarding (--tag-output): its tags cannot be told from the same text inside a
rank's line, and a burst of short lines loses some (run/tagged_lines.py). Here the framing is
ours: a line from the follower is whole, its first tag is the follower's, and everything after
it is the rank's text, tag-shaped or not. So no rejoiner: each line goes as it is to this
host's stdout or stderr (by its tag's stream) and to the collector, like a line of any process
here: root causes, the failure's tail, the silence of BYOC_HANG_TIMEOUT_S, the stacks of a hang,
the live view's metric lines.

The protocol, for each run (run/supervise.py, through the role's RunHooks.before_start):
- the leader listens on a port the kernel picks (every port between the job's hosts is open to
  them: Open MPI's daemons use such ports already), and asks every worker at once on its job
  port: BYOC-FOLLOW-RANKS {port, nonce} (hosts/job_port.py), the nonce fresh each run;
- the worker (run/rank_stream.RankStream) ends an earlier run's stream, clears its folder (what an earlier run
  left), connects to that port on the address the ask came from, and sends one signed line,
  BYOC-RANK-OUTPUT {host, nonce, time}, then its ranks' lines;
- the leader takes a stream only when its line is signed with the job's key, names one of its
  workers, comes from that worker's own addresses and carries this run's nonce, once a worker;
- mpirun starts once every worker's stream has opened (at most settings.rank_stream_timeout_s,
  30 s; a worker not ready by then is named once in the log: its ranks' lines are missing, the
  job goes on);
- after mpirun ends, the leader shuts its side of each stream; the worker reads its files to
  the end, sends the rest and closes; the leader waits for that (bounded, a stop cuts it)
  before the outcome is decided. A stream that ends early loses that worker's lines: said once
  in the log, never a failure.

The lines are not encrypted (the SSH session was): as mpirun's own forwarding and its daemons'
traffic, they travel in the clear between the job's hosts. SageMaker's inter-container traffic
encryption covers them where a job turns it on.

On the leader, one thread (OutputPump, a selector) accepts and reads every stream, and posts
what happened to a session (SessionReady, SessionEnded) on the host's loop (entrypoint/loop/):
the session's state is the main thread's, and the waits for it are the loop's.
"""

from __future__ import annotations

import re
import threading
import time

from entrypoint.hosts import job_port
from entrypoint.loop import Waited
from entrypoint.loop.events import SessionEnded, SessionReady, StopRequested
from entrypoint.settings import DEFAULTS

# The longest line the follower writes: a tag and run/rank_output.MAX_PENDING_BYTES (64 KiB).
MAX_LINE_BYTES = 2 * 65536

_LEADING_TAG = re.compile(rb"\[\d+,\d+\]<(stdout|stderr|stddiag)>:")


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


def build_opening(key_hex: str, host: str, nonce: str, now: float) -> bytes:
    """A worker's first line on its stream: BYOC-RANK-OUTPUT, signed with the job's key."""
    record = job_port.build_record(job_port.RankOutputOpens(host, nonce), now)
    return job_port.build_signed_line(key_hex, record).encode("ascii")


def parse_opening(line: bytes, key_hex: str, nonce: str, not_before: float, settings=DEFAULTS) -> tuple[str | None, str]:
    """(the worker's host name, "") when line opens one of this run's streams; else (None, why not)."""
    record, why = job_port.parse_signed_line(line.decode("utf-8", "replace").rstrip("\n"), key_hex, not_before,
                                             settings)
    if record is None:
        return None, why
    message = job_port.parse_record(record)
    if not isinstance(message, job_port.RankOutputOpens):
        return None, "not a rank-output stream's opening"
    if message.nonce != nonce:
        return None, "a rank-output stream of another run"
    return message.host, ""


# --- the leader's end --------------------------------------------------------------------------


class WorkerSession:
    """One worker's stream of one run, once it opens (the pump attaches its socket)."""

    def __init__(self, host: str, collector, sinks: dict, log, post=lambda event: None) -> None:
        self.host, self.collector, self.sinks, self.log, self.post = host, collector, sinks, log, post
        self.ready = False  # (main thread) its stream opened
        self.ended = False  # (main thread) its stream reached its end
        self.closing = False  # the leader shut its side: its end is expected now
        self.lost_said = False
        self.streams: dict[bytes, object] = {}  # tag -> the collector's masking state of that rank stream
        # The pump's own: the stream's socket, and what it said so far past its last whole line.
        self.sock = None
        self.pending = b""
        self.cut = False  # no stream is taken any more (mpirun may have started)
        self._admit = threading.Lock()  # attach (the pump) against cut (the main thread)

    def attach(self, sock) -> bool:
        """(the pump) Its stream opened; False when it comes too late (cut)."""
        with self._admit:
            if self.cut or self.sock is not None:
                return False
            self.sock = sock
            self.post(SessionReady(self))  # before a cut's handle_pending can look
        return True

    def cut_off(self) -> None:
        """(main thread) No stream is taken for it from now on."""
        with self._admit:
            self.cut = True

    def take_output(self, chunk: bytes) -> None:
        """(the pump) A piece of its stream."""
        lines, self.pending = build_worker_lines(self.pending, chunk)
        self._deliver(lines)

    def stream_ended(self) -> None:
        """(the pump) Its stream ended: what waits for a line's end is a line of its own."""
        if self.pending:
            self._deliver([self.pending])
        self.pending = b""
        self.post(SessionEnded(self))

    def on_ready(self) -> None:
        self.ready = True

    def on_ended(self) -> None:
        self.ended = True
        if self.ready and not self.closing:
            self.say_lost("its stream ended before mpirun did")

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
        self.log(f"{self.host}: its ranks' output cannot reach this log: {why}; the job goes on")

    def close(self) -> None:
        """mpirun ended: the worker reads its files to the end, then ends the stream."""
        import socket

        self.closing = True
        if self.sock is not None:
            try:
                self.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # it has gone already: its end is posted


class _Opening:
    """An accepted connection before its first line: who it is from, and until when it may say it."""

    __slots__ = ("sock", "sender", "data", "deadline")

    def __init__(self, sock, sender: str, deadline: float) -> None:
        self.sock, self.sender, self.data, self.deadline = sock, sender, b"", deadline


class OutputPump:
    """The run's listening socket and every worker's stream, on one thread (a selector): at 256
    hosts, a thread a stream would be 255 of the leader's. It closes every socket when stopped,
    and only then: a socket the main thread may still shut is never closed under it."""

    def __init__(self, sessions: dict, addresses: dict, key_hex: str, nonce: str, post, settings=DEFAULTS) -> None:
        import selectors
        import socket

        self.sessions, self.addresses, self.key_hex, self.nonce = sessions, addresses, key_hex, nonce
        self.post, self.settings = post, settings
        self.listener = socket.create_server(("", 0), backlog=job_port.decide_backlog(len(sessions)))
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self.opened_at = time.time()
        self._closed = threading.Event()
        self._wake_read, self._wake_write = socket.socketpair()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.listener, selectors.EVENT_READ, "accept")
        self._selector.register(self._wake_read, selectors.EVENT_READ, "wake")
        self._sockets: set = set()  # every socket accepted and not refused: closed at the end
        self.thread = threading.Thread(target=self._run, daemon=True, name="byoc-worker-output")
        self.thread.start()

    def _run(self) -> None:
        openings: dict = {}  # socket -> _Opening
        try:
            while not self._closed.is_set():
                for key, _ in self._selector.select(timeout=self.settings.stop_check_s):
                    if key.data == "accept":
                        self._accept(openings)
                    elif isinstance(key.data, _Opening):
                        self._read_opening(key.data, openings)
                    elif isinstance(key.data, WorkerSession):
                        self._read_stream(key.data, key.fileobj)
                now = time.monotonic()
                for opening in [o for o in openings.values() if o.deadline <= now]:
                    self._refuse(opening, openings, "its first line did not come in time")
        finally:
            self._selector.close()
            for sock in self._sockets:
                sock.close()
            self.listener.close()
            self._wake_read.close()
            self._wake_write.close()

    def _accept(self, openings: dict) -> None:
        import selectors

        while True:
            try:
                sock, address = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            sock.setblocking(False)
            self._sockets.add(sock)
            opening = _Opening(sock, address[0] if address else "?",
                               time.monotonic() + self.settings.message_read_timeout_s)
            openings[sock] = opening
            self._selector.register(sock, selectors.EVENT_READ, opening)

    def _receive(self, sock) -> bytes | None:
        """What the socket has now: b"" at its end, None when nothing yet."""
        try:
            return sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            return b""

    def _read_opening(self, opening: _Opening, openings: dict) -> None:
        import selectors

        chunk = self._receive(opening.sock)
        if chunk is None:
            return
        opening.data += chunk
        line, newline, rest = opening.data.partition(b"\n")
        if not newline:
            if not chunk or len(opening.data) > job_port.MAX_MESSAGE_BYTES:
                self._refuse(opening, openings, "no first line")
            return
        host, why = parse_opening(line, self.key_hex, self.nonce, self.opened_at, self.settings)
        session = self.sessions.get(host) if host is not None else None
        if host is not None and session is None:
            why = f"{host!r} is not one of this leader's workers"
        elif session is not None and opening.sender not in self.addresses.get(host, ()):
            why = f"a stream for {host!r} not from that host's addresses"
        elif session is not None and not session.attach(opening.sock):
            why = f"a second stream for {host!r}, or one after the wait for it"
        if why:
            self._refuse(opening, openings, why)
            return
        del openings[opening.sock]
        self._selector.modify(opening.sock, selectors.EVENT_READ, session)
        if rest:
            session.take_output(rest)

    def _read_stream(self, session: WorkerSession, sock) -> None:
        chunk = self._receive(sock)
        if chunk is None:
            return
        if chunk:
            session.take_output(chunk)
            return
        self._selector.unregister(sock)
        session.stream_ended()

    def _refuse(self, opening: _Opening, openings: dict, why: str) -> None:
        openings.pop(opening.sock, None)
        self._selector.unregister(opening.sock)
        opening.sock.close()
        self._sockets.discard(opening.sock)
        self.post(job_port.Refused(opening.sender, f"a rank-output stream: {why}"))

    def stop(self) -> None:
        """Every socket closed (a stream still open is cut: its worker stops following)."""
        self._closed.set()
        try:
            self._wake_write.send(b"x")
        except OSError:
            pass
        self.thread.join(timeout=self.settings.thread_join_s)


class WorkerOutput:
    """Every worker's stream of one run; stop() is the Supervisor's end of a follower. Its
    sessions' events are handled on the loop from start_worker_output to stop()."""

    def __init__(self, sessions: list[WorkerSession], loop, pump: OutputPump) -> None:
        self.sessions = sessions
        self.loop = loop
        self.pump = pump
        mine = list(sessions)  # a late event of another run's session is not this run's
        self.handlers = loop.on({SessionReady: lambda event: event.session in mine and event.session.on_ready(),
                                 SessionEnded: lambda event: event.session in mine and event.session.on_ended()})

    def stop(self, join_s: float) -> None:
        """Every stream's lines to their end, within join_s (a stop that comes meanwhile cuts
        the wait; one that came during the run does not: its ranks' last words count most).
        A stop here is still the run's too: this wait's handler runs beside the run's."""
        for session in self.sessions:
            session.close()
        self.loop.handle_pending()  # what came before this wait is the run's alone
        cut: list = []
        beside = self.loop.also({StopRequested: cut.append})
        try:
            self.loop.wait(lambda: bool(cut) or all(s.ended for s in self.sessions), time.monotonic() + join_s,
                           stop_ends=False)
        finally:
            self.loop.off(beside)
        for session in self.sessions:
            if not session.ended:
                session.say_lost(f"its last lines did not arrive within {join_s:g} s")
        self.pump.stop()
        self.loop.handle_pending()  # the pump's last events, while this run's handlers still take them
        self.loop.off(self.handlers)


def start_worker_output(plan, collector, loop, sinks: dict, log, ask_each, addresses: dict, key_hex: str) -> WorkerOutput:
    """Ask every worker to stream this run's rank output here, and wait until each stream has
    opened (at most settings.rank_stream_timeout_s; a stop ends the wait): mpirun may start then.
    A worker not ready by then is cut, and said so. ask_each(message_of, within_s) sends a word
    to every worker at once (the role's send_to_each_host): host -> whether it took it."""
    import secrets

    settings = plan.settings
    started = time.monotonic()
    deadline = started + settings.rank_stream_timeout_s
    sessions = {host: WorkerSession(host, collector, sinks, log, loop.post) for host in plan.peers}
    nonce = secrets.token_hex(16)
    pump = OutputPump(sessions, addresses, key_hex, nonce, loop.post, settings)
    output = WorkerOutput(list(sessions.values()), loop, pump)
    ask = job_port.FollowRanks(pump.port, nonce)
    taken = ask_each(lambda _host: ask, settings.rank_stream_timeout_s)
    waited = loop.wait(lambda: all(s.ready or s.ended or not taken.get(h) for h, s in sessions.items()), deadline)
    for session in sessions.values():
        session.cut_off()
    loop.handle_pending()  # a stream that opened before the cut is ready
    for host, session in sessions.items():
        if not session.ready and waited is not Waited.STOPPED:  # stopped: no run starts, nothing of it is lost
            session.say_lost("it could not be asked to stream them" if not taken.get(host) else
                             "its stream ended before it was ready" if session.ended else
                             f"its stream did not open within {settings.rank_stream_timeout_s:g} s")
    output.sessions = [s for s in sessions.values() if s.ready]
    if output.sessions:
        log(f"{len(output.sessions)} worker(s) stream their ranks' output here (ready in "
            f"{time.monotonic() - started:.2f} s)")
    return output

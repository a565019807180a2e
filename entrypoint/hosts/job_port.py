"""The job port: how the hosts of a multi-host job hear from each other (the one protocol
module; the rank's sender, rank/record_errors.py, keeps its own standard-library copy of the
words, and tests/entrypoint/test_layout.py holds the two to the same ones).

Every host of a torchrun or parameter-server job keeps a TCP port open while its job runs
(BYOC_JOB_PORT), under mpirun too (readiness, SSH keys, asks and the outcome; mpirun's own
launch goes over SSH). On the wire, one
connection carries nothing or lines of UTF-8 text, at most MAX_MESSAGE_BYTES:

    (nothing)                                           a liveness probe
    BYOC-SIGNED <hmac> BYOC-ROOT-CAUSE {json}           a rank's root cause (any host's rank)
    BYOC-SIGNED <hmac> BYOC-HOST-DONE {json}            a worker host's part ended (to the leader)
    BYOC-SIGNED <hmac> BYOC-HOST-FIGURES {json}         a worker host's figures for the job report
                                                        (to the leader, just before HOST-DONE)
    BYOC-SIGNED <hmac> BYOC-HOST-LIVE {json}            a worker host's live figures (to the leader,
                                                        every live interval: jobreport/live/)
    BYOC-SIGNED <hmac> BYOC-ATTEMPT {json}              a restart's words (roles/attempts.py): the
                                                        leader's to a worker (stop, start, end), a
                                                        worker's to the leader (ended)
    BYOC-SIGNED <hmac> BYOC-MPI-READY {json}            an MPI worker serves SSH (to the leader): its
                                                        key, then that it trusts every host's
    BYOC-SIGNED <hmac> BYOC-PEER-KEYS {json}            every host's SSH key (the MPI leader's, to
                                                        each worker: Open MPI's tree spawn)
    BYOC-SIGNED <hmac> BYOC-LEADER-ASK {json}           the MPI leader asks a worker for its ranks'
                                                        stacks or its report figures
    BYOC-SIGNED <hmac> BYOC-JOB-OUTCOME {json}          the MPI job's outcome (the leader's, to each
                                                        worker)
    BYOC-SIGNED <hmac> BYOC-FOLLOW-RANKS {json}         the MPI leader asks a worker to stream its
                                                        ranks' output for a run (to a port of its own)

- `<hmac>`: HMAC-SHA256 (hex) of the record (everything after it) with the job's key,
  BYOC_JOB_PORT_KEY (hex), which the plan gives every process of the job.
- BYOC-ROOT-CAUSE's json: host, rank, type, message, time (epoch s), where. Ranks also print
  the same record, unsigned, on stderr; it reaches the leader with their output.
- BYOC-HOST-DONE's json: host, exit_code, time.
- BYOC-HOST-FIGURES's json: host, time, figures (jobreport/figures.py: the host's sampled series,
  phases and ranks' step figures, cut to fit MAX_MESSAGE_BYTES; the leader keeps only the fields
  it knows, every number checked: parse_host_figures).
- BYOC-HOST-LIVE's json: host, time, figures (jobreport/live/: what is new since the last
  one, at most settings.live_figures_bytes; the leader checks every number as above).
- BYOC-ATTEMPT's json: word, attempt, host, exit_code, time. `attempt` numbers the job's runs
  from 1: a word about another attempt than the one a host is in is stale and dropped, so no
  rank of attempt N can be started beside a peer of attempt N-1 (docs/reliability.md).
- BYOC-MPI-READY's json: host, public_key (`ssh-ed25519 AAAA…`), trusted (false: sshd serves,
  with nothing authorized yet; true: every host's key below is authorized and pinned), time.
- BYOC-PEER-KEYS's json: part, parts (the keys of a large job span several messages), keys
  ([host, [addresses], public key], one per host of the job), time.
- BYOC-LEADER-ASK's json: ask (one of Ask), time. BYOC-JOB-OUTCOME's json: exit_code, report
  (the leader's output/failure when the job failed, cut to fit), time.
- BYOC-FOLLOW-RANKS's json: port (where the leader takes this run's streams), nonce (32 hex
  digits, fresh each run), time. The stream itself is not a word on this port: it opens with
  the signed record BYOC-RANK-OUTPUT {host, nonce, time} (hosts/worker_output.py).
- A record made more than settings.message_clock_skew_s before the port opened, or whose signature was
  seen before, is a replay and refused; so is anything unsigned or signed with another key.
- The ranks find every host's port in BYOC_JOB_PORTS (`host:port,host:port`).

In the process, each kind is a type with one parser (MESSAGE_KINDS), and the port posts what
it reads, typed, on the host's loop (entrypoint/loop/); the role's handlers take it there, on
the main thread. Nothing here waits on the main thread's behalf: deliver's pauses between
tries are the loop's.

Liveness: the leader probes every worker's port, the workers the leader's, every
peer_probe_every_s; a host silent for BYOC_HOST_LOST_TIMEOUT_S (default 30 s) is lost and the
job is stopped, naming it (PeerWatch posts PeerLost). A port that closes (a host whose part is
over) is posted by ClosedWatch. Both run the one probe loop, watch_ports, in a thread of their
own. socket is imported where a port is used: a 1-host job reads this module (the words) but
never opens one.
"""

from __future__ import annotations

import enum
import json
import re
import threading
import time
from collections import deque

from entrypoint.loop.events import (Ask, AttemptWord, Delivered, FollowRanks, HostDone, HostFigures,  # noqa: F401
                                    HostLive, JobOutcome, LeaderAsk, MpiReady, PeerKeys, PeerLost, PortClosed,
                                    RankOutputOpens, Refused, RootCauseLine, Word)
from entrypoint.outcome.records import RootCause
from entrypoint.settings import DEFAULTS, LaunchSettings

ROOT_CAUSE = "BYOC-ROOT-CAUSE "
HOST_DONE = "BYOC-HOST-DONE "
HOST_FIGURES = "BYOC-HOST-FIGURES "
HOST_LIVE = "BYOC-HOST-LIVE "
ATTEMPT = "BYOC-ATTEMPT "
MPI_READY = "BYOC-MPI-READY "
PEER_KEYS = "BYOC-PEER-KEYS "
LEADER_ASK = "BYOC-LEADER-ASK "
JOB_OUTCOME = "BYOC-JOB-OUTCOME "
FOLLOW_RANKS = "BYOC-FOLLOW-RANKS "
RANK_OUTPUT = "BYOC-RANK-OUTPUT "
SIGNED = "BYOC-SIGNED "
JOB_KEY_ENV = "BYOC_JOB_PORT_KEY"
JOB_KEY_OLD_ENV = "BYOC_JOB_REPORT_KEY"  # its name until 2026-11: still set, for one release
JOB_PORTS_ENV = "BYOC_JOB_PORTS"
MAX_MESSAGE_BYTES = 65536
# A message made during the run and sent again (a replay) is known by its signature: this many
# signatures are kept, the oldest forgotten first. A job's ranks send one root cause each to each port.
SEEN_SIGNATURES_KEPT = 4096
# ... and at least this many a host of the job: within the clock-skew window a host sends its
# live figures 6 times a minute, its outcome, its figures and a restart's words; its ranks a
# root cause each (4,096 in all was less than the window held above ~700 hosts).
SEEN_PER_HOST = 64


# --- the records -------------------------------------------------------------------------------


def parse_root_cause_line(line: str) -> RootCause | None:
    """The record in a line that holds `BYOC-ROOT-CAUSE {json}` anywhere (mpirun's tag may
    come first); None when it holds none. A rank's output is any text: never raises."""
    at = line.find(ROOT_CAUSE)
    if at < 0:
        return None
    try:
        data = json.loads(line[at + len(ROOT_CAUSE):])
        return RootCause(host=str(data["host"]), rank=str(data["rank"]), type=str(data["type"]),
                         message=str(data["message"]), time=float(data["time"]), where=str(data.get("where", "")))
    except (ValueError, KeyError, TypeError, RecursionError):
        return None


NONCE_SHAPE = re.compile(r"[0-9a-f]{32}")


WORDS = frozenset(w.value for w in Word)  # a restart's words on the wire


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_host_done(fields: dict) -> HostDone | None:
    host, code = fields.get("host"), fields.get("exit_code")
    return HostDone(host, code) if isinstance(host, str) and _is_int(code) else None


def _parse_figures(kind):
    def parse(fields: dict):
        host, figures = fields.get("host"), fields.get("figures")
        return kind(host, figures) if isinstance(host, str) and isinstance(figures, str) else None
    return parse


def _parse_attempt_word(fields: dict) -> AttemptWord | None:
    word, attempt, host, code = (fields.get("word"), fields.get("attempt"), fields.get("host"),
                                 fields.get("exit_code", 0))
    if word not in WORDS or not isinstance(host, str) or not _is_int(attempt) or not _is_int(code) or attempt < 1:
        return None
    return AttemptWord(Word(word), attempt, host, code)


# What a key list may hold: nothing that could turn an authorized_keys or known_hosts line into
# another one (a newline, an option), however the record was made.
PUBLIC_KEY_SHAPE = re.compile(r"ssh-ed25519 [A-Za-z0-9+/]{20,200}={0,2}")
HOST_NAME_SHAPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")


def is_public_key(text) -> bool:
    return isinstance(text, str) and PUBLIC_KEY_SHAPE.fullmatch(text) is not None


def is_address(text) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _parse_mpi_ready(fields: dict) -> MpiReady | None:
    host, key, trusted = fields.get("host"), fields.get("public_key"), fields.get("trusted", False)
    if not isinstance(host, str) or not is_public_key(key) or not isinstance(trusted, bool):
        return None
    return MpiReady(host, key, trusted)


def _parse_peer_keys(fields: dict) -> PeerKeys | None:
    part, parts, keys = fields.get("part"), fields.get("parts"), fields.get("keys")
    if not (_is_int(part) and _is_int(parts) and 1 <= part <= parts) or not isinstance(keys, list):
        return None
    parsed = []
    for entry in keys:
        if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str)
                and HOST_NAME_SHAPE.fullmatch(entry[0]) and isinstance(entry[1], list) and entry[1]
                and all(isinstance(a, str) and is_address(a) for a in entry[1]) and is_public_key(entry[2])):
            return None
        parsed.append((entry[0], tuple(entry[1]), entry[2]))
    return PeerKeys(part, parts, tuple(parsed))


def _parse_leader_ask(fields: dict) -> LeaderAsk | None:
    try:
        return LeaderAsk(Ask(fields.get("ask")))
    except ValueError:
        return None


def _parse_job_outcome(fields: dict) -> JobOutcome | None:
    code, report = fields.get("exit_code"), fields.get("report", "")
    return JobOutcome(code, report) if _is_int(code) and isinstance(report, str) else None


def _parse_follow_ranks(fields: dict) -> FollowRanks | None:
    port, nonce = fields.get("port"), fields.get("nonce")
    if not (_is_int(port) and 1 <= port <= 65535 and isinstance(nonce, str) and NONCE_SHAPE.fullmatch(nonce)):
        return None
    return FollowRanks(port, nonce)


def _parse_rank_output_opens(fields: dict) -> RankOutputOpens | None:
    host, nonce = fields.get("host"), fields.get("nonce")
    if not (isinstance(host, str) and isinstance(nonce, str) and NONCE_SHAPE.fullmatch(nonce)):
        return None
    return RankOutputOpens(host, nonce)


# Each kind of message: its word on the wire, its type, its one parser (the fields' dict ->
# the message, or None when they are not one), and how it is named when it is not one.
MESSAGE_KINDS = {
    HOST_DONE.strip(): (HostDone, _parse_host_done, "a host's outcome without a host name and exit code"),
    HOST_FIGURES.strip(): (HostFigures, _parse_figures(HostFigures), "a host's figures without a host name and figures"),
    HOST_LIVE.strip(): (HostLive, _parse_figures(HostLive), "a host's live figures without a host name and figures"),
    ATTEMPT.strip(): (AttemptWord, _parse_attempt_word, "a restart's word that is not one"),
    MPI_READY.strip(): (MpiReady, _parse_mpi_ready, "an MPI worker's readiness without a host name and key"),
    PEER_KEYS.strip(): (PeerKeys, _parse_peer_keys, "a key list that is not one"),
    LEADER_ASK.strip(): (LeaderAsk, _parse_leader_ask, "an ask that is not one"),
    JOB_OUTCOME.strip(): (JobOutcome, _parse_job_outcome, "a job's outcome without an exit code"),
    FOLLOW_RANKS.strip(): (FollowRanks, _parse_follow_ranks, "an ask to stream rank output without a port and nonce"),
    RANK_OUTPUT.strip(): (RankOutputOpens, _parse_rank_output_opens, "a rank-output stream's opening that is not one"),
}
WORD_OF = {kind: word + " " for word, (kind, _, _) in MESSAGE_KINDS.items()}


def build_record(message, now: float) -> str:
    """The record of a message (one of MESSAGE_KINDS' types): its word, then its fields and the
    time as JSON (ASCII: the signature is over these exact bytes)."""
    fields = {k: (v.value if isinstance(v, enum.Enum) else v) for k, v in message._asdict().items() if k != "sender"}
    return WORD_OF[type(message)] + json.dumps({**fields, "time": now}, ensure_ascii=True)


def parse_record(record: str):
    """The message of a record (a RootCauseLine for a rank's root cause), or a Refused's why when
    it holds none. A record is any text: never raises."""
    word, _, body = record.partition(" ")
    if word == ROOT_CAUSE.strip():
        return RootCauseLine(record)
    kind = MESSAGE_KINDS.get(word)
    if kind is None:
        return "not one of the job port's words"
    try:
        fields = json.loads(body)
    except (ValueError, RecursionError):
        fields = None
    message = kind[1](fields) if isinstance(fields, dict) else None
    return kind[2] if message is None else message


def parse_claimed_kind(line: str) -> type | None:
    """The type a line names by its word, signed or not, whether or not it is one (a refused
    host's outcome is counted as one: the leader waits for those); None when it names none."""
    first, _, rest = line.partition(" ")
    word = rest.split(" ", 2)[1] if first == SIGNED.strip() and rest.count(" ") >= 1 else first
    kind = MESSAGE_KINDS.get(word)
    return kind[0] if kind is not None else None


def parse_attempt_record(record: str) -> AttemptWord | None:
    """The word of a `BYOC-ATTEMPT {json}` record; None when it is not one."""
    message = parse_record(record)
    return message if isinstance(message, AttemptWord) else None


def build_job_outcome(exit_code: int, report: str) -> JobOutcome:
    """The outcome for the workers, its report cut at the end (the writer's order puts the root
    cause first) to the longest start whose signed line fits the port: a bisection, as an
    escaped character takes 1 to 12 bytes."""
    room = MAX_MESSAGE_BYTES - len(SIGNED) - 65 - 2  # the signature, its space and the newline

    def fits(length: int) -> bool:
        return len(build_record(JobOutcome(exit_code, report[:length]), 0.0)) + 16 <= room  # 16: the time's digits

    if fits(len(report)):
        return JobOutcome(exit_code, report)
    low, high = 0, len(report)  # fits(low), not fits(high)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return JobOutcome(exit_code, report[:low])


def sign_record(key_hex: str, record: str) -> str:
    """HMAC-SHA256 (hex) of a record with the job's key; ValueError for a key that is not hex."""
    import hmac  # only when a message is made or read: hmac imports hashlib, ~5 ms of every start-up

    return hmac.new(bytes.fromhex(key_hex), record.encode("utf-8"), "sha256").hexdigest()


def build_signed_line(key_hex: str, record: str) -> str:
    return f"{SIGNED}{sign_record(key_hex, record)} {record}\n"


def parse_signed_line(line: str, key_hex: str, not_before: float,
                      settings: LaunchSettings = DEFAULTS) -> tuple[str | None, str | None]:
    """(the record, None) when `line` is one of the job port's records, signed with this job's
    key and made after not_before; else (None, why it is refused)."""
    import hmac

    signed, _, rest = line.partition(" ")
    if signed != SIGNED.strip():
        return None, "not signed"
    signature, _, record = rest.partition(" ")
    try:
        expected = sign_record(key_hex, record)
    except ValueError:
        return None, "no valid job key on this host"
    if not hmac.compare_digest(signature, expected):
        return None, "signed with another key"
    word, _, body = record.partition(" ")
    try:
        made = float(json.loads(body)["time"]) if word in MESSAGE_KINDS or word == ROOT_CAUSE.strip() else None
    except (ValueError, KeyError, TypeError, RecursionError):
        made = None
    if made is None:
        return None, "neither a root-cause record nor a host's outcome or figures"
    if made < not_before - settings.message_clock_skew_s:
        return None, "made before this job started (a replay)"
    return record, None


class SeenSignatures:
    """The signatures of the messages taken so far, at most `kept` of them (oldest forgotten
    first); thread-safe (the port's thread adds, a test may look)."""

    def __init__(self, kept: int = SEEN_SIGNATURES_KEPT):
        self._kept = kept
        self._order: deque[str] = deque()
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def add(self, signature: str) -> bool:
        """True the first time `signature` is added; False when it was seen before."""
        with self._lock:
            if signature in self._seen:
                return False
            self._seen.add(signature)
            self._order.append(signature)
            if len(self._order) > self._kept:
                self._seen.discard(self._order.popleft())
            return True


# --- the port ----------------------------------------------------------------------------------


# The port's answer to each line it read, on the same connection once the sender has said all it
# had (shut its side down): the sender counts a message delivered only on TAKEN, and tries
# again until its deadline otherwise (a connection the kernel dropped, a port that never read
# it). REFUSED: it was read and is not this job's (not signed with its key, a replay): no try
# will change that.
TAKEN = b"BYOC-TAKEN"
REFUSED = b"BYOC-REFUSED"


def decide_backlog(hosts: int) -> int:
    """The listen backlog for a job of `hosts` hosts: every host may connect at once (the end of
    a job, a restart's barrier, a liveness sweep); 128 overflowed 2,500 to 24,500 times at 1,024
    (the kernel caps it at net.core.somaxconn)."""
    return max(128, 4 * hosts)


class _Connection:
    """One accepted connection's bytes so far, and when it must have said them."""

    __slots__ = ("sock", "sender", "data", "deadline")

    def __init__(self, sock, sender: str, deadline: float):
        self.sock, self.sender, self.data, self.deadline = sock, sender, bytearray(), deadline


class JobPort:
    """The host's port for its peers. A connection that sends nothing is a liveness probe. Each
    line of the others is posted, typed, with the address it came from: a HostDone, HostFigures,
    HostLive, AttemptWord or RootCauseLine, or a Refused saying why it is not this job's (and
    a replay); then answered (TAKEN or REFUSED, a line each). post: the host loop's
    (entrypoint/loop/), where the role's handlers take them.

    One thread serves every connection (a selector: a thread a connection, 357 to 920 at once,
    cost the leader a quarter of a core at 1,024 hosts), with a backlog sized to the job
    (decide_backlog) and a replay memory of at least SEEN_PER_HOST signatures a host.

    It writes no log line of its own, whatever it reads: a Refused is logged by the role that
    takes it (roles/peers.Peers.refuse), the first few a line each and the rest
    counted, so refused messages cannot grow a host's log without bound."""

    def __init__(self, port: int, post, job_key: str = "", settings: LaunchSettings = DEFAULTS, hosts: int = 1):
        import selectors
        import socket

        self._sock = socket.create_server(("", port), backlog=decide_backlog(hosts))
        self._sock.setblocking(False)
        self._settings = settings
        self._post = post
        self._job_key = job_key
        self._opened_at = time.time()
        self._seen = SeenSignatures(max(SEEN_SIGNATURES_KEPT, SEEN_PER_HOST * hosts))
        self._closed = threading.Event()
        self._wake_read, self._wake_write = socket.socketpair()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._sock, selectors.EVENT_READ, "accept")
        self._selector.register(self._wake_read, selectors.EVENT_READ, "wake")
        self.accepted = 0  # connections taken so far (the benchmarks read it)
        self._thread = threading.Thread(target=self._serve, daemon=True, name="byoc-job-port")
        self._thread.start()

    def _serve(self) -> None:
        open_: dict = {}  # socket -> _Connection
        try:
            while not self._closed.is_set():
                for key, _ in self._selector.select(timeout=self._settings.stop_check_s):
                    if key.data == "accept":
                        self._accept(open_)
                    elif isinstance(key.data, _Connection):
                        self._read(key.data, open_)
                now = time.monotonic()
                for connection in [c for c in open_.values() if c.deadline <= now]:
                    self._finish(connection, open_)  # what it said in time is taken; then it is closed
        finally:
            for connection in list(open_.values()):
                self._drop(connection, open_)
            self._selector.close()

    def _accept(self, open_: dict) -> None:
        import selectors

        while True:  # the whole queue at once: a burst of connects is taken in one go
            try:
                sock, address = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # closed by close(), or a transient error
            self.accepted += 1
            sock.setblocking(False)
            connection = _Connection(sock, address[0] if address else "?",
                                     time.monotonic() + self._settings.message_read_timeout_s)
            open_[sock] = connection
            self._selector.register(sock, selectors.EVENT_READ, connection)

    def _read(self, connection: _Connection, open_: dict) -> None:
        try:
            chunk = connection.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if chunk:
            connection.data += chunk[:MAX_MESSAGE_BYTES - len(connection.data)]
            if len(connection.data) < MAX_MESSAGE_BYTES:
                return
        self._finish(connection, open_)

    def _finish(self, connection: _Connection, open_: dict) -> None:
        """Every line the connection said: posted, and answered on it (a short answer: it fits the
        socket's buffer, so the send never waits)."""
        answers = []
        for line in connection.data.decode("utf-8", "replace").splitlines():
            if line.strip():
                message = self.build_message(line, connection.sender)
                self._post(message)
                answers.append((REFUSED + b" " + message.why.encode("utf-8", "replace")[:200]) if
                               isinstance(message, Refused) else TAKEN)
        if answers:
            try:
                connection.sock.send(b"".join(a + b"\n" for a in answers))
            except OSError:
                pass  # the sender is gone (an old sender never reads it): taken all the same
        self._drop(connection, open_)

    def _drop(self, connection: _Connection, open_: dict) -> None:
        open_.pop(connection.sock, None)
        try:
            self._selector.unregister(connection.sock)
        except (KeyError, ValueError):
            pass
        connection.sock.close()

    def build_message(self, line: str, sender: str):
        """What one line is: its message, with the sender, or a Refused."""
        record, why = parse_signed_line(line, self._job_key, self._opened_at, self._settings)
        if record is not None and not self._seen.add(line.split(" ", 2)[1]):
            record, why = None, "received before (a replay)"
        message = parse_record(record) if record is not None else why
        if isinstance(message, str):
            return Refused(sender, message, host_done=parse_claimed_kind(line) is HostDone)
        return message._replace(sender=sender)

    def close(self) -> None:
        import socket

        self._closed.set()
        try:
            self._wake_write.send(b"x")
        except OSError:
            pass
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._thread.join(timeout=self._settings.thread_join_s)
        self._sock.close()
        self._wake_read.close()
        self._wake_write.close()


class Sent(enum.Enum):
    DELIVERED = "delivered"  # the port answered TAKEN
    REFUSED = "refused"  # the port refused the word (not this job's): no try will change that
    CLOSED = "closed"  # nothing listens (that host has ended, nobody waits; or it has not opened yet)
    FAILED = "failed"  # not reachable now, or no answer: a later try may get through


ANSWERS = {TAKEN: Sent.DELIVERED, REFUSED: Sent.REFUSED}  # the port's answer's first word -> the try's end


def send_message(host: str, port: int, key_hex: str, message, settings: LaunchSettings = DEFAULTS) -> Sent:
    """One try: the message, signed, to host:port, and the port's answer (any thread)."""
    import socket

    try:
        payload = build_signed_line(key_hex, build_record(message, time.time())).encode("utf-8")
    except ValueError:  # no valid job key: the port would refuse it
        return Sent.FAILED
    try:
        with socket.create_connection((host, port), timeout=settings.peer_probe_timeout_s) as conn:
            conn.sendall(payload)
            conn.shutdown(socket.SHUT_WR)  # all said: the port answers now
            answer = b""
            while b"\n" not in answer and len(answer) < 512:
                chunk = conn.recv(512)
                if not chunk:
                    break
                answer += chunk
    except ConnectionRefusedError:
        return Sent.CLOSED
    except OSError:
        return Sent.FAILED
    return ANSWERS.get(answer.split(b"\n", 1)[0].split(b" ", 1)[0], Sent.FAILED)


def _retry_send(host: str, port: int, key_hex: str, message, within_s: float, settings: LaunchSettings,
                pause, until_open: bool = False) -> bool:
    """send_message, tried again every settings.stop_check_s until within_s has passed;
    pause(seconds) waits between tries and returns False when the sender must give up.
    until_open: a port nobody listens on yet is tried again too (a host still starting)."""
    deadline = time.monotonic() + within_s
    again = (Sent.FAILED, Sent.CLOSED) if until_open else (Sent.FAILED,)
    while (sent := send_message(host, port, key_hex, message, settings)) in again:
        if time.monotonic() >= deadline or not pause(min(settings.stop_check_s, max(0.0, deadline - time.monotonic()))):
            return False
    return sent is Sent.DELIVERED


def deliver(loop, host: str, port: int, key_hex: str, message, within_s: float,
            settings: LaunchSettings = DEFAULTS, until_open: bool = False) -> bool:
    """The message, tried until within_s; the waits between tries are the host loop's (a stop
    ends them). True when it was delivered."""
    return _retry_send(host, port, key_hex, message, within_s, settings, loop.pause, until_open)


def send_until(host: str, port: int, key_hex: str, message, within_s: float, loop,
               settings: LaunchSettings = DEFAULTS) -> bool:
    """deliver, for a thread that only sends (send_to_each's): its pauses between tries are
    the host loop's (loop: a HostLoop), a stop aside: its deadline is its own."""
    return _retry_send(host, port, key_hex, message, within_s, settings,
                       lambda seconds: loop.pause(seconds, stop_ends=False))


SENDERS = 12  # send_to_each's threads at most a batch, whatever the number of hosts (the leader's threads
# stay within 16: the main one, the port's, the watch's and these). A batch has threads of its own, so
# one whose words wait out a dead host's deadline never holds up the next (a pool shared by every
# batch would: an outcome behind retries of the job's keys).


def send_to_each(hosts, port: int, key_hex: str, message_of, within_s: float, loop, batch: int = 0,
                 settings: LaunchSettings = DEFAULTS) -> None:
    """message_of(host) to each of hosts' ports, SENDERS at a time, each tried until within_s of
    its own (send_until); Delivered(host, delivered, batch) posted on the loop (a HostLoop) for
    each as it ends. One at a time from the loop, a dead host cost every host after it its
    deadline; here it costs one."""
    start_senders(list(hosts), lambda host: loop.post(Delivered(host, send_until(
        host, port, key_hex, message_of(host), within_s, loop, settings), batch)))


def start_senders(items: list, send_one, most: int = SENDERS) -> list[threading.Thread]:
    """send_one(item) for each item, on at most `most` threads that only send, each taking the
    next item as it is done with one; the threads, for a caller that joins them."""
    import queue

    todo: queue.SimpleQueue = queue.SimpleQueue()
    for item in items:
        todo.put(item)

    def work() -> None:
        while True:
            try:
                item = todo.get_nowait()
            except queue.Empty:
                return
            send_one(item)

    senders = [threading.Thread(target=work, daemon=True, name="byoc-senders") for _ in range(min(most, len(items)))]
    for sender in senders:
        sender.start()
    return senders


def start_root_cause_sender(record: dict, env: dict[str, str]) -> threading.Thread:
    """A root cause written for a rank that could not (killed by a signal), to every host's
    port as the rank's own sender does (rank/record_errors.send_root_cause), on a thread that
    only sends; returned, for the run to join."""
    from entrypoint.rank.record_errors import send_root_cause

    (sender,) = start_senders([record], lambda item: send_root_cause(item, env))
    return sender


def send_live_figures(leader: str, port: int, key_hex: str, host: str, figures_json: str,
                      settings: LaunchSettings = DEFAULTS) -> int:
    """This host's live figures (jobreport/live/) to the leader's port, one try (the next
    interval brings newer ones), from the live thread. The bytes sent, 0 when not delivered."""
    message = HostLive(host, figures_json)
    try:
        size = len(build_signed_line(key_hex, build_record(message, time.time())).encode("utf-8"))
    except ValueError:
        return 0
    return size if send_message(leader, port, key_hex, message, settings) is Sent.DELIVERED else 0


# --- liveness: one probe loop for every wait on a peer's port ------------------------------------


class Probe(enum.Enum):
    ANSWERED = "answered"
    CLOSED = "closed"  # refused, or the name gone: nothing listens there any more
    SILENT = "silent"  # no answer within the probe's time (a host down, or too busy to answer)


def probe_ports(addresses: dict, port: int, timeout_s: float) -> dict:
    """One probe of every host at once (host -> its addresses, resolve_addresses): a connect
    each, not blocking, all waited for together up to timeout_s (one at a time, a dead host
    cost each sweep its timeout, and 1,024 hosts a sweep of minutes). host -> Probe."""
    import errno
    import selectors
    import socket
    import struct

    results, selector = {}, selectors.DefaultSelector()
    try:
        for host, found in addresses.items():
            if not found:
                results[host] = Probe.CLOSED  # the name no longer resolves: the host is gone
                continue
            family = socket.AF_INET6 if ":" in found[0] else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            # Closed with a reset, not a FIN: a probe says nothing, and 200 a second would
            # otherwise leave ~12,000 connections in TIME_WAIT on the prober (ports held a minute).
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.setblocking(False)
            code = sock.connect_ex((found[0], port))
            if code in (0, errno.EINPROGRESS, errno.EAGAIN):
                selector.register(sock, selectors.EVENT_WRITE, host)
            else:
                sock.close()
                results[host] = Probe.CLOSED if code == errno.ECONNREFUSED else Probe.SILENT
        deadline = time.monotonic() + timeout_s
        while selector.get_map() and (left := deadline - time.monotonic()) > 0:
            for key, _ in selector.select(timeout=left):
                code = key.fileobj.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                results[key.data] = Probe.ANSWERED if code == 0 else \
                    Probe.CLOSED if code == errno.ECONNREFUSED else Probe.SILENT
                selector.unregister(key.fileobj)
                key.fileobj.close()
        for key in list(selector.get_map().values()):
            results[key.data] = Probe.SILENT
            key.fileobj.close()
    finally:
        selector.close()
    return results


def decide_probe_every_s(job_hosts: int, lost_after_s: float, settings: LaunchSettings = DEFAULTS) -> float:
    """How often one host sweeps its peers, for a job of job_hosts hosts (pure): each host
    probes its peers (the leader every worker, each worker the leader), so the sweeps are
    spaced to keep the leader's probes at settings.probes_a_second, but never fewer than
    settings.probes_within_lost within the time that makes a host lost."""
    paced = max(settings.peer_probe_every_s, job_hosts / settings.probes_a_second)
    return min(paced, max(settings.peer_probe_every_s, lost_after_s / settings.probes_within_lost))


def watch_ports(hosts, port: int, on_probe, give_up: threading.Event, settings: LaunchSettings = DEFAULTS,
                skip=lambda host: False, every_s: float | None = None) -> threading.Thread:
    """In a daemon thread, probe `port` on every one of `hosts` at once (but those skip(host)
    names), every every_s (settings.peer_probe_every_s), calling on_probe(host, Probe) for each;
    the watch ends when on_probe returns True or give_up is set. A probe runs in that thread,
    never in the caller's: resolving a host that just went away can block for the resolver's
    timeout (a local-mode container's name vanishes from Docker's DNS when it exits), so names
    are resolved once, and again only for a host that did not answer."""
    from entrypoint.hosts.net import resolve_addresses

    hosts = tuple(hosts)
    every_s = settings.peer_probe_every_s if every_s is None else every_s

    def probe() -> None:
        addresses: dict = {}
        while not give_up.is_set():
            due = [h for h in hosts if not skip(h)]
            for host in due:
                if not addresses.get(host):
                    addresses[host] = resolve_addresses(host)
            results = probe_ports({h: addresses[h] for h in due}, port, settings.peer_probe_timeout_s)
            for host in due:
                if results[host] is not Probe.ANSWERED:
                    addresses[host] = []  # resolved again before the next probe
                if on_probe(host, results[host]):
                    return
            if give_up.wait(every_s):
                return

    thread = threading.Thread(target=probe, daemon=True, name="byoc-port-watch")
    thread.start()
    return thread


class PeerWatch:
    """Posts PeerLost once when a peer stops answering on `port` for lost_after_s, or never
    answers within first_contact_s (post: the host loop's).

    seen_at_start: the peers are known to be up now (every MPI worker has just said it is
    ready, on this port), so silence counts from now with lost_after_s. until_first_contact: only
    check that every peer answers within first_contact_s, then stop watching (a port that may
    close before this host's part ends). port_name: what the port is, for the reason. Its
    state is its probe thread's own."""

    def __init__(self, peers, port: int, lost_after_s: float, first_contact_s: float, post,
                 seen_at_start: bool = False, until_first_contact: bool = False, port_name: str = "",
                 settings: LaunchSettings = DEFAULTS, job_hosts: int = 0):
        started = time.monotonic()
        self._last_seen: dict[str, float | None] = {p: started if seen_at_start else None for p in peers}
        self._started, self._port, self._port_name = started, port, port_name
        self._lost_after_s, self._first_contact_s, self._post = lost_after_s, first_contact_s, post
        self._until_first_contact = until_first_contact
        self._closed = threading.Event()
        self._settings = settings
        skip = (lambda peer: self._last_seen[peer] is not None) if until_first_contact else (lambda peer: False)
        every_s = decide_probe_every_s(max(job_hosts, len(self._last_seen)), lost_after_s, settings)
        self._thread = watch_ports(self._last_seen, port, self._on_probe, self._closed, settings, skip, every_s)

    def _on_probe(self, peer: str, probe: Probe) -> bool:
        now = time.monotonic()
        if probe is Probe.ANSWERED:
            self._last_seen[peer] = now
            return self._until_first_contact and all(seen is not None for seen in self._last_seen.values())
        seen = self._last_seen[peer]
        limit = self._lost_after_s if seen is not None else self._first_contact_s
        if now - (seen if seen is not None else self._started) <= limit:
            return False
        what = "stopped answering" if seen is not None else "never answered"
        self._post(PeerLost(peer, f"host {peer} {what} on port {self._port}{self._port_name} for {limit:g} s"))
        return True

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=self._settings.thread_join_s)


class ClosedWatch:
    """Posts PortClosed for each of `hosts` once its port has been closed for closed_after_s
    (0: the first probe that finds it closed), then stops probing that host. Closed is a refused
    connection or a name gone, never a probe left unanswered: at 512 hosts, 405 workers took a
    leader too busy to answer for one that had ended, and left before it wrote its report (the
    caller's wait has a deadline of its own). Its state is its probe thread's own; close() ends it."""

    def __init__(self, hosts, port: int, post, closed_after_s: float = 0.0, settings: LaunchSettings = DEFAULTS,
                 job_hosts: int = 0):
        self._silent_since: dict[str, float] = {}
        self._closed_hosts: set[str] = set()
        self._hosts, self._port, self._post, self._after_s = tuple(hosts), port, post, closed_after_s
        self._give_up = threading.Event()
        every_s = decide_probe_every_s(max(job_hosts, len(self._hosts)), settings.peer_probe_every_s, settings)
        self._thread = watch_ports(self._hosts, port, self._on_probe, self._give_up, settings,
                                   skip=lambda host: host in self._closed_hosts, every_s=every_s)

    def _on_probe(self, host: str, probe: Probe) -> bool:
        if probe is not Probe.CLOSED:
            self._silent_since.pop(host, None)
            return False
        if time.monotonic() - self._silent_since.setdefault(host, time.monotonic()) >= self._after_s:
            self._closed_hosts.add(host)
            self._post(PortClosed(host, self._port))
        return len(self._closed_hosts) == len(self._hosts)

    def close(self) -> None:
        self._give_up.set()

"""The job port: how the hosts of a multi-host job hear from each other (the one protocol
module; the rank's sender, rank/record_errors.py, keeps its own standard-library copy of the
words, and tests/entrypoint/test_layout.py holds the two to the same ones).

Every host of a torchrun or parameter-server job keeps a TCP port open while its job runs
(BYOC_JOB_PORT); under mpirun, sshd's port plays the liveness part. On the wire, one
connection carries nothing or lines of UTF-8 text, at most MAX_REPORT_BYTES:

    (nothing)                                           a liveness probe
    BYOC-SIGNED <hmac> BYOC-ROOT-CAUSE {json}           a rank's root cause (any host's rank)
    BYOC-SIGNED <hmac> BYOC-HOST-DONE {json}            a worker host's part ended (to the leader)
    BYOC-SIGNED <hmac> BYOC-HOST-FIGURES {json}         a worker host's figures for the job report
                                                        (to the leader, just before HOST-DONE)
    BYOC-SIGNED <hmac> BYOC-HOST-LIVE {json}            a worker host's live figures (to the leader,
                                                        every live interval: jobreport/live.py)
    BYOC-SIGNED <hmac> BYOC-ATTEMPT {json}              a restart's words (roles/attempts.py): the
                                                        leader's to a worker (stop, start, end), a
                                                        worker's to the leader (ended)

- `<hmac>`: HMAC-SHA256 (hex) of the record (everything after it) with the job's report key,
  BYOC_JOB_PORT_KEY (hex), which the plan gives every process of the job.
- BYOC-ROOT-CAUSE's json: host, rank, type, message, time (epoch s), where. Ranks also print
  the same record, unsigned, on stderr; it reaches the leader with their output.
- BYOC-HOST-DONE's json: host, exit_code, time.
- BYOC-HOST-FIGURES's json: host, time, figures (jobreport/figures.py: the host's sampled series,
  phases and ranks' step figures, cut to fit MAX_REPORT_BYTES; the leader keeps only the fields
  it knows, every number checked: parse_host_figures).
- BYOC-HOST-LIVE's json: host, time, figures (jobreport/live.py: what is new since the last
  one, at most settings.live_figures_bytes; the leader checks every number as above).
- BYOC-ATTEMPT's json: word, attempt, host, exit_code, time. `attempt` numbers the job's runs
  from 1: a word about another attempt than the one a host is in is stale and dropped, so no
  rank of attempt N can be started beside a peer of attempt N-1 (docs/reliability.md).
- A record made more than REPORT_CLOCK_SKEW_S before the port opened, or whose signature was
  seen before, is a replay and refused; so is anything unsigned or signed with another key.
- The ranks find every host's port in BYOC_JOB_PORTS (`host:port,host:port`).

Liveness: the leader probes every worker's port, the workers the leader's, every
peer_probe_every_s; a host silent for BYOC_HOST_LOST_TIMEOUT_S (default 30 s) is lost and the
job is stopped, naming it (PeerWatch). All the waits on a peer's port (lost, gone, closed) run
the one probe loop, watch_ports. socket is imported where a port is used: a 1-host job reads
this module (the words) but never opens one.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from typing import NamedTuple

from entrypoint.hosts.net import can_connect
from entrypoint.outcome.records import RootCause
from entrypoint.settings import DEFAULTS, LaunchSettings

ROOT_CAUSE = "BYOC-ROOT-CAUSE "
HOST_DONE = "BYOC-HOST-DONE "
HOST_FIGURES = "BYOC-HOST-FIGURES "
HOST_LIVE = "BYOC-HOST-LIVE "
ATTEMPT = "BYOC-ATTEMPT "
SIGNED = "BYOC-SIGNED "
JOB_KEY_ENV = "BYOC_JOB_PORT_KEY"
JOB_KEY_OLD_ENV = "BYOC_JOB_REPORT_KEY"  # its name until 2026-11: still set, for one release
JOB_PORTS_ENV = "BYOC_JOB_PORTS"
MAX_REPORT_BYTES = 65536
# A report made during the run and sent again (a replay) is known by its signature: this many
# signatures are kept, the oldest forgotten first. A job's ranks send one report each to each port.
SEEN_SIGNATURES_KEPT = 4096


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


def build_host_done_record(host: str, exit_code: int, now: float) -> str:
    return HOST_DONE + json.dumps({"host": host, "exit_code": exit_code, "time": now}, ensure_ascii=True)


def build_host_figures_record(host: str, figures_json: str, now: float) -> str:
    """figures_json goes in as a string: the leader parses it on its own terms."""
    return HOST_FIGURES + json.dumps({"host": host, "time": now, "figures": figures_json}, ensure_ascii=True)


def build_host_live_record(host: str, figures_json: str, now: float) -> str:
    return HOST_LIVE + json.dumps({"host": host, "time": now, "figures": figures_json}, ensure_ascii=True)


def parse_host_figures_record(record: str, word: str = HOST_FIGURES) -> tuple[str, str] | None:
    """(host, the figures' JSON) of a `BYOC-HOST-FIGURES {json}` record (or `word`'s: HOST_LIVE);
    None when it is not one."""
    if not record.startswith(word):
        return None
    try:
        fields = json.loads(record[len(word):])
        host, figures = fields["host"], fields["figures"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    if not isinstance(host, str) or not isinstance(figures, str):
        return None
    return host, figures


def parse_host_done_record(record: str) -> tuple[str, int] | None:
    """(host, exit code) of a `BYOC-HOST-DONE {json}` record; None when it is not one."""
    if not record.startswith(HOST_DONE):
        return None
    try:
        fields = json.loads(record[len(HOST_DONE):])
        host, code = fields["host"], fields["exit_code"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    if not isinstance(host, str) or not isinstance(code, int) or isinstance(code, bool):
        return None
    return host, code


class AttemptWord(NamedTuple):
    """A restart's word on the job port (roles/attempts.py says who sends which, and when)."""

    word: str  # one of ATTEMPT_WORDS
    attempt: int  # the attempt it is about, from 1
    host: str  # the sender's host
    exit_code: int = 0  # "ended": how that host's processes of the attempt ended


# stop: the leader's, attempt N failed: stop your processes of it and say when they are gone.
# ended: a worker's, its processes of attempt N are gone (they failed, or were stopped).
# start: the leader's, every host's processes of attempt N-1 are gone: start attempt N.
# end: the leader's, attempt N is the last: end your part with its outcome.
ATTEMPT_WORDS = ("stop", "ended", "start", "end")


def build_attempt_record(word: AttemptWord, now: float) -> str:
    return ATTEMPT + json.dumps({**word._asdict(), "time": now}, ensure_ascii=True)


def parse_attempt_record(record: str) -> AttemptWord | None:
    """The word of a `BYOC-ATTEMPT {json}` record; None when it is not one."""
    if not record.startswith(ATTEMPT):
        return None
    try:
        fields = json.loads(record[len(ATTEMPT):])
        word = AttemptWord(fields["word"], fields["attempt"], fields["host"], fields.get("exit_code", 0))
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None
    numbers_ok = all(isinstance(n, int) and not isinstance(n, bool) for n in (word.attempt, word.exit_code))
    if word.word not in ATTEMPT_WORDS or not isinstance(word.host, str) or not numbers_ok or word.attempt < 1:
        return None
    return word


def sign_record(key_hex: str, record: str) -> str:
    """HMAC-SHA256 (hex) of a record with the job's report key; ValueError for a key that is not hex."""
    import hmac  # only when a report is made or read: hmac imports hashlib, ~5 ms of every start-up

    return hmac.new(bytes.fromhex(key_hex), record.encode("utf-8"), "sha256").hexdigest()


def build_signed_line(key_hex: str, record: str) -> str:
    return f"{SIGNED}{sign_record(key_hex, record)} {record}\n"


def parse_signed_report(line: str, key_hex: str, not_before: float,
                        settings: LaunchSettings = DEFAULTS) -> tuple[str | None, str | None]:
    """(the record, None) when `line` is a signed BYOC-ROOT-CAUSE, BYOC-HOST-DONE or BYOC-HOST-FIGURES record,
    signed with this job's key and made after not_before; else (None, why it is refused)."""
    import hmac

    if not line.startswith(SIGNED):
        return None, "not signed"
    signature, _, record = line[len(SIGNED):].partition(" ")
    try:
        expected = sign_record(key_hex, record)
    except ValueError:
        return None, "no valid report key on this host"
    if not hmac.compare_digest(signature, expected):
        return None, "signed with another key"
    marker = next((m for m in (ROOT_CAUSE, HOST_DONE, HOST_FIGURES, HOST_LIVE, ATTEMPT) if record.startswith(m)), None)
    try:
        made = float(json.loads(record[len(marker):])["time"]) if marker else None
    except (ValueError, KeyError, TypeError, RecursionError):
        made = None
    if made is None:
        return None, "neither a root-cause record nor a host's outcome or figures"
    if made < not_before - settings.report_clock_skew_s:
        return None, "made before this job started (a replay)"
    return record, None


class SeenSignatures:
    """The signatures of the reports taken so far, at most `kept` of them (oldest forgotten
    first); thread-safe: each connection is read in a thread of its own."""

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


class JobPort:
    """The host's port for its peers. A connection that sends nothing is a liveness probe.
    A signed root cause from a rank on any host goes to on_root_cause(record line); a worker
    host's outcome to on_host_done(host, exit_code); a host's figures to on_figures(host,
    figures JSON, the sender's address), its live figures to on_live (the same), a restart's
    word to on_attempt(AttemptWord, the sender's address); anything else, and a replay, to
    on_refused(address, why), and is dropped."""

    def __init__(self, port: int, on_root_cause=None, report_key: str = "", on_refused=None, on_host_done=None,
                 on_figures=None, settings: LaunchSettings = DEFAULTS, on_live=None, on_attempt=None):
        import socket

        self._sock = socket.create_server(("", port))
        self._settings = settings
        self._on_root_cause = on_root_cause
        self._on_host_done = on_host_done or (lambda host, exit_code: None)
        self._on_figures = on_figures or (lambda host, figures_json, sender: None)
        self._on_live = on_live or (lambda host, figures_json, sender: None)
        self._on_attempt = on_attempt or (lambda word, sender: None)
        self._report_key = report_key
        self._on_refused = on_refused or (lambda address, why: None)
        self._opened_at = time.time()
        self._seen = SeenSignatures()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, address = self._sock.accept()
            except OSError:
                continue  # closed by close(), or a transient error
            if self._on_root_cause is None:
                conn.close()
            else:
                threading.Thread(target=self._read_report, args=(conn, address), daemon=True).start()

    def _read_report(self, conn, address) -> None:
        data = b""
        try:
            conn.settimeout(self._settings.report_read_timeout_s)
            while len(data) < MAX_REPORT_BYTES:
                chunk = conn.recv(8192)
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
        finally:
            conn.close()
        sender = address[0] if address else "?"
        for line in data.decode("utf-8", "replace").splitlines():
            if line.strip():
                self._take_line(line, sender)

    def _take_line(self, line: str, sender: str) -> None:
        record, why = parse_signed_report(line, self._report_key, self._opened_at, self._settings)
        if record is not None and not self._seen.add(line[len(SIGNED):].partition(" ")[0]):
            record, why = None, "received before (a replay)"
        if record is None:
            # A host's refused outcome is named as one: the leader would wait for it.
            self._on_refused(sender, f"a host's outcome, {why}" if HOST_DONE in line else why)
        elif record.startswith(HOST_DONE):
            done = parse_host_done_record(record)
            if done is None:
                self._on_refused(sender, "a host's outcome without a host name and exit code")
            else:
                self._on_host_done(*done)
        elif record.startswith(HOST_FIGURES):
            figures = parse_host_figures_record(record)
            if figures is None:
                self._on_refused(sender, "a host's figures without a host name and figures")
            else:
                self._on_figures(*figures, sender)
        elif record.startswith(HOST_LIVE):
            live = parse_host_figures_record(record, HOST_LIVE)
            if live is None:
                self._on_refused(sender, "a host's live figures without a host name and figures")
            else:
                self._on_live(*live, sender)
        elif record.startswith(ATTEMPT):
            word = parse_attempt_record(record)
            if word is None:
                self._on_refused(sender, "a restart's word that is not one")
            else:
                self._on_attempt(word, sender)
        else:
            self._on_root_cause(record)

    def close(self) -> None:
        import socket

        self._stop.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        self._thread.join(timeout=self._settings.thread_join_s)


def send_host_done(leader: str, port: int, key_hex: str, host: str, exit_code: int,
                   within_s: float | None = None, stopped=lambda: False, settings: LaunchSettings = DEFAULTS) -> bool:
    """Tell the leader's job port that this host's part ended with exit_code; retried until
    within_s (default settings.host_done_send_s) has passed or stopped() turns true. True when
    it was delivered."""
    return send_record(leader, port, key_hex, build_host_done_record(host, exit_code, time.time()), within_s, stopped,
                       settings)


def send_host_figures(leader: str, port: int, key_hex: str, host: str, figures_json: str,
                      within_s: float | None = None, stopped=lambda: False, settings: LaunchSettings = DEFAULTS) -> bool:
    """This host's figures for the leader's job report (jobreport/figures.fit_figures keeps them
    under MAX_REPORT_BYTES); as send_host_done."""
    return send_record(leader, port, key_hex, build_host_figures_record(host, figures_json, time.time()), within_s,
                       stopped, settings)


def send_attempt_word(host: str, port: int, key_hex: str, word: AttemptWord, within_s: float, stopped,
                      settings: LaunchSettings = DEFAULTS) -> bool:
    """A restart's word to `host`'s job port; as send_host_done."""
    return send_record(host, port, key_hex, build_attempt_record(word, time.time()), within_s, stopped, settings)


def send_live_figures(leader: str, port: int, key_hex: str, host: str, figures_json: str,
                      settings: LaunchSettings = DEFAULTS) -> int:
    """This host's live figures (jobreport/live.py) to the leader's port, one try (the next
    interval brings newer ones). The bytes sent, 0 when not delivered."""
    record = build_host_live_record(host, figures_json, time.time())
    try:
        size = len(build_signed_line(key_hex, record).encode("utf-8"))
    except ValueError:
        return 0
    return size if send_record(leader, port, key_hex, record, 0.0, lambda: True, settings) else 0


def send_record(leader: str, port: int, key_hex: str, record: str, within_s: float | None, stopped,
                settings: LaunchSettings) -> bool:
    import socket

    try:
        payload = build_signed_line(key_hex, record).encode("utf-8")
    except ValueError:  # no valid report key: the leader's port would refuse it
        return False
    deadline = time.monotonic() + (settings.host_done_send_s if within_s is None else within_s)
    while True:
        try:
            with socket.create_connection((leader, port), timeout=settings.peer_probe_timeout_s) as conn:
                conn.sendall(payload)
            return True
        except ConnectionRefusedError:
            return False  # the leader's port is closed: it has ended, nobody waits for the word
        except OSError:
            if time.monotonic() >= deadline or stopped():
                return False
            time.sleep(settings.stop_check_s)


# --- liveness: one probe loop for every wait on a peer's port ------------------------------------


def watch_ports(hosts, port: int, on_probe, give_up: threading.Event, settings: LaunchSettings = DEFAULTS,
                skip=lambda host: False) -> threading.Thread:
    """In a daemon thread, probe `port` on each of `hosts` (but those skip(host) names) every
    settings.peer_probe_every_s, calling on_probe(host, answered) after each probe; the
    watch ends when on_probe returns True or give_up is set. A probe runs in that thread, never
    in the caller's: resolving a host that just went away can block for the resolver's timeout
    (a local-mode container's name vanishes from Docker's DNS when it exits)."""
    hosts = tuple(hosts)

    def probe() -> None:
        while not give_up.is_set():
            for host in hosts:
                if not skip(host) and on_probe(host, can_connect(host, port, timeout_s=settings.peer_probe_timeout_s)):
                    return
            if give_up.wait(settings.peer_probe_every_s):
                return

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    return thread


class PeerWatch:
    """Calls on_lost(host, reason) once when a peer stops answering on `port` for
    lost_after_s, or never answers within first_contact_s.

    seen_at_start: the peers are known to be up now (the MPI leader has just reached every
    worker over SSH), so silence counts from now with lost_after_s. until_first_contact: only
    check that every peer answers within first_contact_s, then stop watching (a port that may
    close before this host's part ends). port_name: what the port is, for the reason."""

    def __init__(self, peers, port: int, lost_after_s: float, first_contact_s: float, on_lost,
                 seen_at_start: bool = False, until_first_contact: bool = False, port_name: str = "",
                 settings: LaunchSettings = DEFAULTS):
        started = time.monotonic()
        self._last_seen: dict[str, float | None] = {p: started if seen_at_start else None for p in peers}
        self._started, self._port, self._port_name = started, port, port_name
        self._lost_after_s, self._first_contact_s, self._on_lost = lost_after_s, first_contact_s, on_lost
        self._until_first_contact = until_first_contact
        self._stop = threading.Event()
        self._settings = settings
        skip = (lambda peer: self._last_seen[peer] is not None) if until_first_contact else (lambda peer: False)
        self._thread = watch_ports(self._last_seen, port, self._on_probe, self._stop, settings, skip)

    def _on_probe(self, peer: str, answered: bool) -> bool:
        now = time.monotonic()
        if answered:
            self._last_seen[peer] = now
            return self._until_first_contact and all(seen is not None for seen in self._last_seen.values())
        seen = self._last_seen[peer]
        limit = self._lost_after_s if seen is not None else self._first_contact_s
        if now - (seen if seen is not None else self._started) <= limit:
            return False
        what = "stopped answering" if seen is not None else "never answered"
        self._on_lost(peer, f"host {peer} {what} on port {self._port}{self._port_name} for {limit:g} s")
        return True

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self._settings.thread_join_s)


def wait_until_port_closes(host: str, port: int, timeout_s: float, stopped=lambda: False,
                           settings: LaunchSettings = DEFAULTS) -> str:
    """Wait until host:port stops answering: "closed", "timeout" or "stopped" (stopped()
    turned true: a signal arrived, which must end the wait at once: docker stop allows 10 s
    before SIGKILL). This thread only waits, in short slices; the probes run in watch_ports'."""
    closed, give_up = threading.Event(), threading.Event()

    def on_probe(_host: str, answered: bool) -> bool:
        if not answered:
            closed.set()
        return not answered

    watch_ports((host,), port, on_probe, give_up, settings)
    deadline = time.monotonic() + timeout_s
    try:
        while not stopped():
            if closed.wait(settings.stop_check_s):
                return "closed"
            if time.monotonic() >= deadline:
                return "timeout"
        return "stopped"
    finally:
        give_up.set()


class HostOutcomes:
    """The worker hosts' outcomes as they reach the leader's job port (thread-safe)."""

    def __init__(self) -> None:
        self._codes: dict[str, int] = {}
        self._changed = threading.Condition()

    def add(self, host: str, exit_code: int) -> None:
        with self._changed:
            self._codes.setdefault(host, exit_code)  # the first word stands: a replay cannot change it
            self._changed.notify_all()

    def codes(self) -> dict[str, int]:
        with self._changed:
            return dict(self._codes)

    def wait_for(self, hosts, port: int, timeout_s: float, stopped=lambda: False, gone_after_s: float | None = None,
                 settings: LaunchSettings = DEFAULTS) -> tuple[dict[str, int], list[str], str]:
        """Wait until every host has reported its outcome or has not answered on `port` for
        gone_after_s (default settings.worker_gone_after_s). Returns (the outcomes reported,
        the hosts that went away without one, how the wait ended: "all", "timeout" or "stopped")."""
        hosts = tuple(hosts)
        gone_after_s = settings.worker_gone_after_s if gone_after_s is None else gone_after_s
        gone: set[str] = set()
        silent_since: dict[str, float] = {}
        give_up = threading.Event()

        def on_probe(host: str, answered: bool) -> bool:
            if answered:
                silent_since.pop(host, None)
            elif time.monotonic() - silent_since.setdefault(host, time.monotonic()) >= gone_after_s:
                with self._changed:
                    gone.add(host)
                    self._changed.notify_all()
            return False

        watch_ports(hosts, port, on_probe, give_up, settings, skip=lambda host: host in gone or host in self.codes())
        deadline = time.monotonic() + timeout_s
        try:
            with self._changed:
                while True:
                    codes = {h: self._codes[h] for h in hosts if h in self._codes}
                    missing = [h for h in hosts if h in gone and h not in codes]
                    if len(codes) + len(missing) == len(hosts):
                        return codes, missing, "all"
                    if stopped():
                        return codes, missing, "stopped"
                    if time.monotonic() >= deadline:
                        return codes, missing, "timeout"
                    self._changed.wait(settings.stop_check_s)
        finally:
            give_up.set()

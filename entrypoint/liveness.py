"""Notice a host that dies or drops off the network, on every launcher.

A collective blocked on a peer whose cable was pulled waits for gloo/NCCL/MPI timeouts
(minutes to hours); a dead host must instead end the job within a minute. Every host of a
multi-host job keeps one TCP port answering while its job runs: sshd's under mpirun, and
under torchrun and the parameter server a JobPort on every host (BYOC_JOB_PORT). The leader connects to every worker's port, the workers to the leader's,
once a second; a host that has not answered for BYOC_HOST_LOST_TIMEOUT_S (default 30 s,
at most 60) is lost and the job is stopped, naming it.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import deque

from entrypoint.rank.record_errors import MARKER, SIGNED, sign_report
from entrypoint.ssh import can_connect

CHECK_EVERY_S = 1.0


MAX_REPORT_BYTES = 65536

# A worker host of a torchrun or parameter-server job tells the leader's job port that its part
# has ended, and how: `BYOC-HOST-DONE {"host": ..., "exit_code": ..., "time": ...}`, signed as
# a rank's root-cause report is. The leader ends only after every worker has (HostOutcomes).
DONE_MARKER = "BYOC-HOST-DONE "
SEND_DONE_FOR_S = 3.0  # a worker retries that long to reach the leader's port (not a refused one)
# A worker host counts as gone (its part over, no word from it) when its port has not answered
# for this long: one missed probe under load is not enough, and a word sent just before the
# worker exited is read by then.
GONE_AFTER_S = 5.0


def build_host_done_record(host: str, exit_code: int, now: float) -> str:
    import json

    return DONE_MARKER + json.dumps({"host": host, "exit_code": exit_code, "time": now}, ensure_ascii=True)


def parse_host_done_record(record: str) -> tuple[str, int] | None:
    """(host, exit code) of a `BYOC-HOST-DONE {json}` record; None when it is not one."""
    import json

    if not record.startswith(DONE_MARKER):
        return None
    try:
        fields = json.loads(record[len(DONE_MARKER):])
        host, code = fields["host"], fields["exit_code"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    if not isinstance(host, str) or not isinstance(code, int) or isinstance(code, bool):
        return None
    return host, code


# A report signed before the port opened is a replay (the key is the same for every run of the
# same job definition); this much clock difference between hosts is allowed.
REPORT_CLOCK_SKEW_S = 60.0

# A report made during the run and sent again (a replay) is known by its signature: this many
# signatures are kept, the oldest forgotten first. A job's ranks send one report each to each port.
SEEN_SIGNATURES_KEPT = 4096


def parse_signed_report(line: str, key_hex: str, not_before: float) -> tuple[str | None, str | None]:
    """(the record line, None) when `line` is `BYOC-SIGNED <hmac> BYOC-ROOT-CAUSE {json}` (or
    `BYOC-HOST-DONE {json}`) signed with this job's key and made after not_before; else (None,
    why it is refused)."""
    import hmac  # only when a report arrives: hmac imports hashlib, ~5 ms of every start-up
    import json

    if not line.startswith(SIGNED):
        return None, "not signed"
    signature, _, record = line[len(SIGNED):].partition(" ")
    try:
        expected = sign_report(key_hex, record)
    except ValueError:
        return None, "no valid report key on this host"
    if not hmac.compare_digest(signature, expected):
        return None, "signed with another key"
    marker = next((m for m in (MARKER, DONE_MARKER) if record.startswith(m)), None)
    try:
        made = float(json.loads(record[len(marker):])["time"]) if marker else None
    except (ValueError, KeyError, TypeError, RecursionError):
        made = None
    if made is None:
        return None, "neither a root-cause record nor a host's outcome"
    if made < not_before - REPORT_CLOCK_SKEW_S:
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


class JobPort:
    """The host's port for its peers. A connection that sends nothing is a liveness probe.
    A connection may also carry one root-cause line from a failing rank on any host
    (rank/record_errors.py sends it), handed to on_report, or a worker host's outcome
    (send_host_done), handed to on_host_done(host, exit_code), when it is signed with the job's
    report key (parse_signed_report) and its signature was not seen before on this port (a
    report sent again is a replay); anything else is logged by on_refused and dropped."""

    def __init__(self, port: int, on_report=None, report_key: str = "", on_refused=None, on_host_done=None):
        self._sock = socket.create_server(("", port))
        self._on_report = on_report
        self._on_host_done = on_host_done or (lambda host, exit_code: None)
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
            if self._on_report is None:
                conn.close()
            else:
                threading.Thread(target=self._read_report, args=(conn, address), daemon=True).start()

    def _read_report(self, conn: socket.socket, address) -> None:
        data = b""
        try:
            conn.settimeout(5)
            while len(data) < MAX_REPORT_BYTES:
                chunk = conn.recv(8192)
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
        finally:
            conn.close()
        for line in data.decode("utf-8", "replace").splitlines():
            if not line.strip():
                continue
            record, why = parse_signed_report(line, self._report_key, self._opened_at)
            if record is not None and not self._seen.add(line[len(SIGNED):].partition(" ")[0]):
                record, why = None, "received before (a replay)"
            done = parse_host_done_record(record) if record is not None else None
            if record is None:
                # A host's refused outcome is named as one: the leader would wait for it.
                self._on_refused(address[0] if address else "?", f"a host's outcome, {why}" if DONE_MARKER in line else why)
            elif record.startswith(DONE_MARKER):
                if done is None:
                    self._on_refused(address[0] if address else "?", "a host's outcome without a host name and exit code")
                else:
                    self._on_host_done(*done)
            else:
                self._on_report(record)

    def close(self) -> None:
        self._stop.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        self._thread.join(timeout=2)


class PeerWatch:
    """Calls on_lost(host, reason) once when a peer stops answering on `port`."""

    def __init__(self, peers, port: int, lost_after_s: float, first_contact_s: float, on_lost, seen_at_start: bool = False,
                 until_first_contact: bool = False, port_name: str = ""):
        """seen_at_start: the peers are known to be up now (the MPI leader has just reached
        every worker over SSH), so silence counts from now with lost_after_s, not first_contact_s.
        until_first_contact: only check that every peer answers within first_contact_s, then
        stop watching (a port that may close before this host's part ends). port_name: what
        the port is, for the reason."""
        self.seen_at_start = seen_at_start
        self.until_first_contact = until_first_contact
        self.port_name = port_name
        self.peers = tuple(peers)
        self.port = port
        self.lost_after_s = lost_after_s
        self.first_contact_s = first_contact_s
        self.on_lost = on_lost
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        started = time.monotonic()
        last_seen: dict[str, float | None] = {p: started if self.seen_at_start else None for p in self.peers}
        while True:
            for peer in self.peers:
                if self.until_first_contact and last_seen[peer] is not None:
                    continue
                if can_connect(peer, self.port, timeout_s=2.0):
                    last_seen[peer] = time.monotonic()
                    continue
                seen = last_seen[peer]
                silent_for = time.monotonic() - (seen if seen is not None else started)
                limit = self.lost_after_s if seen is not None else self.first_contact_s
                if silent_for > limit:
                    what = "stopped answering" if seen is not None else "never answered"
                    self.on_lost(peer, f"host {peer} {what} on port {self.port}{self.port_name} for {limit:g} s")
                    return
            if self.until_first_contact and all(seen is not None for seen in last_seen.values()):
                return
            if self._stop.wait(CHECK_EVERY_S):
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def wait_until_port_closes(host: str, port: int, timeout_s: float, stopped=lambda: False) -> str:
    """Wait until host:port stops answering (probed once a second): "closed", "timeout" or
    "stopped" (stopped() turned true: a signal arrived).

    The probes run in a daemon thread and this thread only waits in short slices: resolving
    the name of a host that just went away can block for the resolver's whole timeout (a
    local-mode container's name vanishes from Docker's DNS when it exits), and a signal must
    still end the wait at once (docker stop allows 10 s before SIGKILL)."""
    closed, give_up = threading.Event(), threading.Event()

    def probe() -> None:
        while not give_up.is_set():
            if not can_connect(host, port, timeout_s=2.0):
                closed.set()
                return
            give_up.wait(CHECK_EVERY_S)

    threading.Thread(target=probe, daemon=True).start()
    deadline = time.monotonic() + timeout_s
    try:
        while not stopped():
            if closed.wait(0.2):
                return "closed"
            if time.monotonic() >= deadline:
                return "timeout"
        return "stopped"
    finally:
        give_up.set()


def send_host_done(leader: str, port: int, key_hex: str, host: str, exit_code: int,
                   within_s: float = SEND_DONE_FOR_S, stopped=lambda: False) -> bool:
    """Tell the leader's job port that this host's part ended with exit_code; retried until
    within_s has passed (or stopped() turns true). True when it was delivered."""
    record = build_host_done_record(host, exit_code, time.time())
    try:
        payload = f"{SIGNED}{sign_report(key_hex, record)} {record}\n".encode("utf-8")
    except ValueError:  # no valid report key: the leader's port would refuse it
        return False
    deadline = time.monotonic() + within_s
    while True:
        try:
            with socket.create_connection((leader, port), timeout=2.0) as conn:
                conn.sendall(payload)
            return True
        except ConnectionRefusedError:
            return False  # the leader's port is closed: it has ended, nobody waits for the word
        except OSError:
            if time.monotonic() >= deadline or stopped():
                return False
            time.sleep(0.2)


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

    def wait_for(self, hosts, port: int, timeout_s: float, stopped=lambda: False,
                 gone_after_s: float = GONE_AFTER_S) -> tuple[dict[str, int], list[str], str]:
        """Wait until every host has reported its outcome or has not answered on `port` for
        gone_after_s (probed once a second, in a daemon thread: resolving a host that just went
        away can block). Returns (the outcomes reported, the hosts that went away without one,
        how the wait ended: "all", "timeout" or "stopped")."""
        hosts = tuple(hosts)
        gone: set[str] = set()
        silent_since: dict[str, float] = {}
        give_up = threading.Event()

        def probe() -> None:
            while not give_up.is_set():
                for host in hosts:
                    if host in gone or host in self.codes():
                        continue
                    if can_connect(host, port, timeout_s=2.0):
                        silent_since.pop(host, None)
                    elif time.monotonic() - silent_since.setdefault(host, time.monotonic()) >= gone_after_s:
                        with self._changed:
                            gone.add(host)
                            self._changed.notify_all()
                give_up.wait(CHECK_EVERY_S)

        threading.Thread(target=probe, daemon=True).start()
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
                    self._changed.wait(0.2)
        finally:
            give_up.set()

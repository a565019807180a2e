"""The job port at 1,024 hosts (issue 50, item 2), with light stand-ins speaking the real protocol
from one selector thread (no thread a host): 1,024 simultaneous connects, each a signed word,
every one taken and answered; the port's own threads do not grow with the connections; a word
to every host at once, where a dead host costs one deadline and not one each; probes all at
once, a host closed only when refused."""

from __future__ import annotations

import selectors
import socket
import threading
import time

import pytest

from entrypoint.hosts import job_port
from entrypoint.hosts.job_port import (AttemptWord, Word, Delivered, HostDone, JobPort, Probe, Refused, build_record,
                                       build_signed_line, decide_probe_every_s, probe_ports)
from entrypoint.loop import HostLoop
from entrypoint.settings import DEFAULTS

KEY = "ab" * 32


class SilentPort:
    """A port whose accept queue is full and never read: a connect to it gets no answer (the
    kernel drops the SYN), as from a host too busy or cut off. .port; close() when done."""

    def __init__(self):
        self.server = socket.create_server(("127.0.0.1", 0), backlog=0)
        self.port = self.server.getsockname()[1]
        self.fill = []
        for _ in range(4):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", self.port))
            self.fill.append(sock)
        time.sleep(0.2)  # the handshakes of the ones that fit complete

    def close(self):
        for sock in self.fill:
            sock.close()
        self.server.close()


def free_port() -> int:
    # Picked as the job port binds (every address, SO_REUSEADDR): a port a closed connection
    # still holds (TIME_WAIT, after many probes) is not picked to fail that bind.
    with socket.create_server(("", 0)) as s:
        return s.getsockname()[1]


def connect_all_at_once(port: int, lines: list[bytes]) -> list[bytes]:
    """Each line on a connection of its own, every connection opened before any is read: the
    answers, in the lines' order (b"" for a connection that got none)."""
    selector, answers, open_ = selectors.DefaultSelector(), [b""] * len(lines), {}
    for i, line in enumerate(lines):
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", port))
        open_[sock] = [i, line, "connecting"]
        selector.register(sock, selectors.EVENT_WRITE, open_[sock])
    deadline = time.monotonic() + 120
    while open_ and time.monotonic() < deadline:
        for key, _ in selector.select(timeout=1.0):
            state, sock = key.data, key.fileobj
            if state[2] == "connecting":
                sock.setblocking(True)
                sock.sendall(state[1])
                sock.shutdown(socket.SHUT_WR)
                sock.setblocking(False)
                state[2] = "reading"
                selector.modify(sock, selectors.EVENT_READ, state)
                continue
            try:
                chunk = sock.recv(4096)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            answers[state[0]] += chunk
            if not chunk:
                selector.unregister(sock)
                sock.close()
                del open_[sock]
    for sock in open_:
        sock.close()
    selector.close()
    return answers


def test_1024_hosts_connecting_at_once_are_each_taken_and_answered_by_one_thread():
    port, loop, taken = free_port(), HostLoop(), []
    loop.on({HostDone: taken.append})
    threads_before = threading.active_count()
    listener = JobPort(port, loop.post, job_key=KEY, hosts=1024)
    try:
        assert threading.active_count() == threads_before + 1  # one thread serves every connection
        lines = [build_signed_line(KEY, build_record(HostDone(f"algo-{h}", 0), time.time())).encode()
                 for h in range(2, 1026)]
        answers = connect_all_at_once(port, lines)
        assert threading.active_count() == threads_before + 1
        loop.wait(lambda: len(taken) == 1024, time.monotonic() + 120)
    finally:
        listener.close()
    assert [a for a in answers if a != job_port.TAKEN + b"\n"] == []  # no connection dropped, none unanswered
    assert sorted(d.host for d in taken) == sorted(f"algo-{h}" for h in range(2, 1026))  # none lost, none twice
    assert listener.accepted == 1024


def test_a_word_the_port_cannot_take_is_answered_refused_and_not_tried_again():
    port, loop, refused = free_port(), HostLoop(), []
    loop.on({Refused: refused.append})
    listener = JobPort(port, loop.post, job_key=KEY)
    try:
        unsigned = b"BYOC-HOST-DONE {}\n"
        assert connect_all_at_once(port, [unsigned]) == [job_port.REFUSED + b" not signed\n"]
        assert not job_port.deliver(loop, "127.0.0.1", port, "cd" * 32, HostDone("algo-2", 0), 3600.0)
    finally:
        listener.close()


def test_a_port_that_takes_the_bytes_but_never_answers_is_tried_again_until_the_deadline():
    """Before, sendall returning was DELIVERED: a connection the kernel then dropped was lost."""
    silent = socket.create_server(("127.0.0.1", 0))
    accepted = []
    stop = threading.Event()

    def swallow():
        silent.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = silent.accept()
            except OSError:
                continue
            accepted.append(conn.recv(65536))
            conn.close()  # no answer

    thread = threading.Thread(target=swallow, daemon=True)
    thread.start()
    try:
        assert not job_port.send_until("127.0.0.1", silent.getsockname()[1], KEY, HostDone("algo-2", 0), 1.0,
                                       HostLoop())
    finally:
        stop.set()
        thread.join()
        silent.close()
    assert len(accepted) >= 2 and all(b"BYOC-HOST-DONE" in a for a in accepted)  # sent again, each try


def test_a_word_to_every_host_at_once_a_dead_one_costs_its_own_deadline_only():
    """50 workers that answer and one that accepts and never answers: every live one's word is
    taken before the dead one's deadline ends its try (one at a time, each host after the dead
    one waited out its deadline first)."""
    ports, listeners, loop, results = [], [], HostLoop(), []
    for _ in range(50):
        port = free_port()
        listeners.append(JobPort(port, lambda event: None, job_key=KEY))
        ports.append(port)
    dead = socket.create_server(("127.0.0.1", 0), backlog=1024)  # accepts (the kernel), never reads
    loop.on({Delivered: results.append})
    try:
        # Every "host" is 127.0.0.1; the port differs, so each host is its port here.
        by_port = {f"h{i}": p for i, p in enumerate(ports)} | {"dead": dead.getsockname()[1]}
        original = job_port.send_until

        def send_until(host, _port, key, message, within_s, loop, settings=DEFAULTS):
            return original("127.0.0.1", by_port[host], key, message, within_s, loop, settings)

        job_port.send_until = send_until
        try:
            job_port.send_to_each(["dead", *[f"h{i}" for i in range(50)]], 0, KEY,
                                  lambda host: AttemptWord(Word.START, 2, "algo-1"), 3.0, loop, batch=7)
            loop.wait(lambda: len(results) == 51, time.monotonic() + 120)
        finally:
            job_port.send_until = original
    finally:
        for listener in listeners:
            listener.close()
        dead.close()
    assert [r.host for r in results][-1] == "dead" and not results[-1].delivered
    assert all(r.delivered and r.batch == 7 for r in results[:-1]) and len(results) == 51


def test_one_sweep_probes_every_host_at_once_and_tells_closed_from_silent():
    listening, silent = socket.create_server(("127.0.0.1", 0)), SilentPort()
    closed = free_port()
    try:
        found = {**probe_ports({"up": ["127.0.0.1"]}, listening.getsockname()[1], 2.0),
                 **probe_ports({"closed": ["127.0.0.1"], "gone": []}, closed, 2.0),
                 **probe_ports({"silent": ["127.0.0.1"]}, silent.port, 0.2)}
    finally:
        listening.close()
        silent.close()
    assert found == {"up": Probe.ANSWERED, "closed": Probe.CLOSED, "gone": Probe.CLOSED, "silent": Probe.SILENT}


@pytest.mark.parametrize("hosts, lost_s, every", [
    (2, 30.0, 1.0), (200, 30.0, 1.0), (201, 30.0, 1.005), (1024, 30.0, 5.12),  # paced at 200 probes a second
    (1024, 8.0, 2.0), (1024, 4.0, 1.0), (1024, 1.0, 1.0),  # but 4 probes within the lost time, and 1 s at least
])
def test_the_sweeps_are_spaced_by_the_jobs_size_and_its_lost_time(hosts, lost_s, every):
    assert decide_probe_every_s(hosts, lost_s) == pytest.approx(every)


def test_a_worker_takes_its_leader_as_ended_only_when_its_port_is_refused_not_when_it_is_silent():
    """At 512 hosts, 405 workers took a leader too busy to answer for one that had ended."""
    from entrypoint.hosts.job_port import ClosedWatch, PortClosed

    class Counted(ClosedWatch):
        def __init__(self, *args, **kwargs):
            self.probes: list = []
            super().__init__(*args, **kwargs)

        def _on_probe(self, host, probe):
            self.probes.append(probe)
            return super()._on_probe(host, probe)

    closed_port, posted, busy = free_port(), [], SilentPort()
    fast = DEFAULTS._replace(peer_probe_timeout_s=0.05, peer_probe_every_s=0.01)
    silent = Counted(["localhost"], busy.port, posted.append, 0.0, fast)
    refused = Counted(["127.0.0.1"], closed_port, posted.append, 0.0, fast)
    try:
        deadline = time.monotonic() + 120
        while (len(silent.probes) < 5 or not refused.probes) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        silent.close()
        refused.close()
        busy.close()
    assert set(silent.probes) == {Probe.SILENT} and len(silent.probes) >= 5
    assert posted == [PortClosed("127.0.0.1", closed_port)]

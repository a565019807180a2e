"""Light stand-ins for an MPI job's workers, speaking the real job-port words with the job's key
(hosts/job_port.py), for a real MpiLeader (roles/mpi.py) in the test process.

    python mpi_stand_ins.py COUNT LEADER_PORT WORKER_PORT KEY_HEX

Worker i has its own loopback address (stand_in_address) and its job port there, on
WORKER_PORT, served by one selector thread; what it sends goes from that address (the leader
checks a sender against the host's addresses) through a small fixed pool. Each: tells the
leader its key (MPI-READY), tried until the leader's port opens; takes every part of the key
list (PEER-KEYS), then says it trusts them (MPI-READY, trusted); notes every ask (LEADER-ASK)
and the outcome (JOB-OUTCOME). Once every worker has the outcome, or on SIGTERM, it prints
one JSON line: what each worker took. Left out: sshd, orted, the ranks.
"""

from __future__ import annotations

import base64
import json
import os
import selectors
import signal
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from entrypoint.hosts.job_port import (JobOutcome, LeaderAsk, MpiReady, PeerKeys, build_record,  # noqa: E402
                                       build_signed_line, parse_record, parse_signed_line)


def stand_in_address(i: int) -> str:
    return f"127.0.{1 + i // 250}.{1 + i % 250}"


def stand_in_key(i: int) -> str:
    return "ssh-ed25519 " + base64.b64encode(b"byoc-stand-in-%08d" % i + b"\0" * 24).decode()


class StandIns:
    def __init__(self, count: int, leader_port: int, worker_port: int, key: str):
        self.count, self.leader_port, self.key = count, leader_port, key
        self.opened_at = time.time()
        self.parts: dict[int, dict[int, list]] = {i: {} for i in range(count)}
        self.asks: dict[int, list[str]] = {i: [] for i in range(count)}
        self.outcomes: dict[int, list] = {}
        self.refused: list[str] = []
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.pool = ThreadPoolExecutor(max_workers=16)
        self.selector = selectors.DefaultSelector()
        for i in range(count):
            server = socket.create_server((stand_in_address(i), worker_port), backlog=64)
            server.setblocking(False)
            self.selector.register(server, selectors.EVENT_READ, ("listen", i))

    def send(self, i: int, message) -> None:
        """message from worker i, tried until the leader's port takes it (at most a minute)."""
        line = build_signed_line(self.key, build_record(message, time.time())).encode()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with socket.socket() as sock:
                    sock.bind((stand_in_address(i), 0))
                    sock.settimeout(10)
                    sock.connect(("127.0.0.1", self.leader_port))
                    sock.sendall(line)
                    sock.shutdown(socket.SHUT_WR)
                    if sock.recv(512).startswith(b"BYOC-TAKEN"):
                        return
            except OSError:
                pass
            time.sleep(0.05)
        with self.lock:
            self.refused.append(f"worker {i}: {type(message).__name__} never taken")

    def take(self, i: int, data: bytes) -> bytes:
        answers = []
        for line in data.decode("utf-8", "replace").splitlines():
            record, why = parse_signed_line(line, self.key, self.opened_at)
            message = parse_record(record) if record is not None else why
            if isinstance(message, str):
                with self.lock:
                    self.refused.append(f"worker {i}: {message}")
                answers.append(b"BYOC-REFUSED")
                continue
            answers.append(b"BYOC-TAKEN")
            self.on_message(i, message)
        return b"".join(a + b"\n" for a in answers)

    def on_message(self, i: int, message) -> None:
        with self.lock:
            if isinstance(message, PeerKeys):
                self.parts[i][message.part] = [list(k) for k in message.keys]
                if len(self.parts[i]) == message.parts:
                    self.pool.submit(self.send, i, MpiReady(stand_in_address(i), stand_in_key(i), True))
            elif isinstance(message, LeaderAsk):
                self.asks[i].append(message.ask.value)
            elif isinstance(message, JobOutcome):
                self.outcomes.setdefault(i, [message.exit_code, message.report])
                if len(self.outcomes) == self.count:
                    self.done.set()

    def serve(self) -> None:
        buffers: dict = {}
        while not self.done.is_set():
            for key, _ in self.selector.select(timeout=0.1):
                kind, i = key.data
                if kind == "listen":
                    try:
                        conn, _ = key.fileobj.accept()
                    except OSError:
                        continue
                    conn.setblocking(False)
                    buffers[conn] = bytearray()
                    self.selector.register(conn, selectors.EVENT_READ, ("read", i))
                    continue
                conn = key.fileobj
                try:
                    chunk = conn.recv(65536)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    chunk = b""
                if chunk:
                    buffers[conn] += chunk
                    continue
                self.selector.unregister(conn)
                data = bytes(buffers.pop(conn))
                if data:
                    try:
                        conn.setblocking(True)
                        conn.settimeout(5)
                        conn.sendall(self.take(i, data))
                    except OSError:
                        pass
                conn.close()

    def report(self) -> dict:
        """Worker -> the keys it took (in the parts' order), its asks, its outcome; what was refused."""
        with self.lock:
            return {"keys": {i: [k for part in sorted(parts) for k in parts[part]] for i, parts in self.parts.items()},
                    "asks": self.asks, "outcomes": self.outcomes, "refused": self.refused}


def main() -> int:
    count, leader_port, worker_port, key = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    stand_ins = StandIns(count, leader_port, worker_port, key)
    signal.signal(signal.SIGTERM, lambda *_: stand_ins.done.set())
    print("listening", flush=True)
    for i in range(count):
        stand_ins.pool.submit(stand_ins.send, i, MpiReady(stand_in_address(i), stand_in_key(i)))
    stand_ins.serve()
    print(json.dumps(stand_ins.report()), flush=True)
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())

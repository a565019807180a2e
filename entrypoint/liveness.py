"""Notice a host that dies or drops off the network, on every launcher.

A collective blocked on a peer whose cable was pulled waits for gloo/NCCL/MPI timeouts
(minutes to hours); a dead host must instead end the job within a minute. Every host of a
multi-host job keeps one TCP port answering while its job runs: sshd's under mpirun, the
leader's root-cause store and a bare listener on the workers under torchrun and the
parameter server. The leader connects to every worker's port, the workers to the leader's,
once a second; a host that has not answered for BYOC_HOST_LOST_TIMEOUT_S (default 30 s,
at most 60) is lost and the job is stopped, naming it.
"""

from __future__ import annotations

import socket
import threading
import time

from entrypoint.ssh import can_connect

CHECK_EVERY_S = 1.0


class LivenessListener:
    """Accepts connections and closes them: "this host is up" and nothing more."""

    def __init__(self, port: int):
        self._sock = socket.create_server(("", port), reuse_port=False)
        self._sock.settimeout(0.5)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
                conn.close()
            except OSError:
                continue

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._sock.close()


class PeerWatch:
    """Calls on_lost(host, reason) once when a peer stops answering on `port`."""

    def __init__(self, peers, port: int, lost_after_s: float, first_contact_s: float, on_lost):
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
        last_seen: dict[str, float | None] = {p: None for p in self.peers}
        while not self._stop.wait(CHECK_EVERY_S):
            for peer in self.peers:
                if can_connect(peer, self.port, timeout_s=2.0):
                    last_seen[peer] = time.monotonic()
                    continue
                seen = last_seen[peer]
                silent_for = time.monotonic() - (seen if seen is not None else started)
                limit = self.lost_after_s if seen is not None else self.first_contact_s
                if silent_for > limit:
                    what = "stopped answering" if seen is not None else "never answered"
                    self.on_lost(peer, f"host {peer} {what} on port {self.port} for {limit:g} s")
                    return

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

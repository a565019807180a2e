"""An MPI worker's end of its rank-output stream to the leader (the protocol, and the leader's
end: hosts/worker_output.py): for one run, the folder cleared, a connection to the port the
leader named, the signed opening the role made, then every line this host's ranks write, each
whole under its tag (run/rank_output.RankOutputFollower), until the leader shuts its side;
then every file to its end, and the stream closed."""

from __future__ import annotations

import threading

from entrypoint.run import rank_output
from entrypoint.settings import DEFAULTS


class _SocketSink:
    """The follower's stdout and stderr: the stream (one sendall a batch of whole lines)."""

    def __init__(self, sock) -> None:
        self.sock = sock

    def write(self, data: bytes) -> None:
        self.sock.sendall(data)

    def flush(self) -> None:
        pass


class RankStream:
    """A worker's stream of one run to its leader (a thread): the folder cleared, the stream
    opened, then every line its ranks write (run/rank_output.RankOutputFollower), until the
    leader shuts its side; then every file to its end, and the stream closed. log: says once
    why there is no stream."""

    def __init__(self, folder: str, leader: str, port: int, opening: bytes, log, settings=DEFAULTS) -> None:
        self.folder, self.leader, self.port, self.opening, self.log = folder, leader, port, opening, log
        self.settings = settings
        self.sock = None
        self.ending = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="byoc-rank-stream")

    def start(self) -> RankStream:
        self.thread.start()
        return self

    def _run(self) -> None:
        import socket

        rank_output.clear(self.folder)  # what an earlier run left: the leader would print it again
        try:
            sock = socket.create_connection((self.leader, self.port), timeout=self.settings.peer_probe_timeout_s)
        except OSError as error:
            self.log(f"could not stream this host's ranks' output to the leader ({self.leader} port {self.port}): "
                     f"{error}")
            return
        self.sock = sock
        follower = None
        try:
            sock.settimeout(None)
            sock.sendall(self.opening)
            sink = _SocketSink(sock)
            follower = rank_output.RankOutputFollower(self.folder, lambda line, stream: None, lambda: None,
                                                      self.settings.quiet_line_s, self.settings.wait_poll_s,
                                                      {"stdout": sink, "stderr": sink}).start()
            while not self.ending.is_set() and sock.recv(65536):
                pass  # the leader sends nothing: only the end of its side says something
        except OSError:
            pass  # the leader cut the stream, or has gone
        finally:
            if follower is not None:
                follower.stop(join_s=None)  # every file to its end (a cut stream fails each send at once)
            sock.close()

    def end(self, join_s: float) -> None:
        """Cut the stream (this host's part is over) and wait for the thread, at most join_s."""
        import socket

        self.ending.set()
        if self.sock is not None:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.thread.join(timeout=join_s)

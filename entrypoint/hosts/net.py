"""The network between hosts, as a role needs it: names resolved, a port answering. No protocol
of ours: ssh.py, job_port.py and mpi_wire.py speak over these."""

from __future__ import annotations

import time


def resolve_addresses(host: str) -> list[str]:
    try:
        import socket  # multi-host paths only

        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return []
    return sorted({info[4][0] for info in infos})


def can_connect(host: str, port: int, timeout_s: float = 2.0) -> bool:
    try:
        import socket  # multi-host paths only

        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def wait_for_hosts(hosts: tuple[str, ...], timeout_s: float, stopped=lambda: False) -> list[str]:
    """Hosts that still do not resolve after timeout_s (SageMaker's DNS can lag at start), or
    when stopped() (the job's stop token) turns true."""
    import socket

    deadline = time.monotonic() + timeout_s
    pending = list(hosts)
    delay = 0.1
    while True:
        for host in list(pending):
            try:
                socket.getaddrinfo(host, None)
                pending.remove(host)
            except OSError:
                pass
        if not pending or time.monotonic() >= deadline or stopped():
            return pending
        until = time.monotonic() + min(delay, max(0.0, deadline - time.monotonic()))
        while time.monotonic() < until and not stopped():  # a stop ends the wait within 0.1 s
            time.sleep(min(0.1, max(0.0, until - time.monotonic())))
        delay = min(delay * 2, 5.0)

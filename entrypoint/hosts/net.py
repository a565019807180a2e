"""The network between hosts, as a role needs it: names resolved, a port answering. No protocol
of ours: ssh.py, job_port.py and worker_output.py speak over these."""

from __future__ import annotations

import time

from entrypoint.settings import DEFAULTS, LaunchSettings

BACKOFF = 2  # each wait for a name twice the one before


def resolve_addresses(host: str) -> list[str]:
    try:
        import socket  # multi-host paths only

        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return []
    return sorted({info[4][0] for info in infos})


def can_connect(host: str, port: int, timeout_s: float = DEFAULTS.peer_probe_timeout_s) -> bool:
    try:
        import socket  # multi-host paths only

        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def wait_for_hosts(hosts: tuple[str, ...], timeout_s: float, loop, settings: LaunchSettings = DEFAULTS) -> list[str]:
    """Hosts that still do not resolve after timeout_s (SageMaker's DNS can lag at start), or
    once a stop came; the waits between tries are the host loop's (entrypoint/loop/), each
    twice the one before, from settings.resolve_first_wait_s to settings.resolve_longest_wait_s."""
    import socket

    deadline = time.monotonic() + timeout_s
    pending = list(hosts)
    delay = settings.resolve_first_wait_s
    while True:
        for host in list(pending):
            try:
                socket.getaddrinfo(host, None)
                pending.remove(host)
            except OSError:
                pass
        if not pending or time.monotonic() >= deadline:
            return pending
        if not loop.pause(min(delay, max(0.0, deadline - time.monotonic()))):
            return pending
        delay = min(delay * BACKOFF, settings.resolve_longest_wait_s)

"""A free TCP port on the loopback, for the tests' servers (sshd, registries, rendezvous)."""

import socket


def free_port() -> int:
    """A port nothing listens on now (the kernel's pick; another process may take it before
    the caller binds it, which the tests accept)."""
    # Picked as the job port binds (every address, SO_REUSEADDR): a port a closed connection
    # still holds (TIME_WAIT, after many probes) is not picked to fail that bind.
    with socket.create_server(("", 0)) as s:
        return s.getsockname()[1]

"""A free TCP port on the loopback, for the tests' servers (sshd, registries, rendezvous)."""

import socket


def free_port() -> int:
    """A port nothing listens on now (the kernel's pick; another process may take it before
    the caller binds it, which the tests accept)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

"""A free TCP port on the loopback, for the tests' servers (sshd, registries, rendezvous)."""

import socket


def free_port() -> int:
    """A port nothing listens on now (the kernel's pick; another process may take it before
    the caller binds it, which the tests accept)."""
    # Picked as the job port binds (every address, SO_REUSEADDR): a port a closed connection
    # still holds (TIME_WAIT, after many probes) is not picked to fail that bind.
    with socket.create_server(("", 0)) as s:
        return s.getsockname()[1]


# The entrypoint's ports on one host: torchrun's rendezvous (BYOC_MASTER_PORT, 7777), the job
# port (+1) and the deep health check's (+2). A job the tests start on this machine's own
# network takes them; under the suite's parallel run each worker (PYTEST_XDIST_WORKER gwN)
# gets a block of its own, so two workers' jobs never meet on one port. A worker runs one
# test at a time, and its jobs one after another, as the whole suite did before.
ENTRYPOINT_PORT = 7777
PORTS_PER_WORKER = 10


def decide_master_port(environ) -> int:
    """This test worker's BYOC_MASTER_PORT: 7777 for gw0 or a run without workers."""
    worker = environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    return ENTRYPOINT_PORT + PORTS_PER_WORKER * index

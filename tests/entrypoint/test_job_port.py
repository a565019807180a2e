"""A failing rank's record reaches the leader's job port from another process (as from
another host); a bare connection is only a liveness probe."""

import socket
import subprocess
import sys
import time

from entrypoint.failure import parse_root_cause_line
from entrypoint.liveness import JobPort
from entrypoint.plan import RECORD_ERRORS
from entrypoint.ssh import can_connect


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_failing_rank_reports_to_the_leaders_job_port(tmp_path):
    port = free_port()
    lines = []
    job_port = JobPort(port, on_report=lines.append)
    try:
        assert can_connect("127.0.0.1", port)  # a liveness probe: no report
        script = tmp_path / "rank.py"
        script.write_text("raise KeyError('missing shard 7')\n")
        env = {"PATH": "/usr/bin:/bin", "BYOC_JOB_PORTS": f"127.0.0.1:{port}", "SM_CURRENT_HOST": "algo-2", "RANK": "3"}
        done = subprocess.run([sys.executable, RECORD_ERRORS, str(script)], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 1
        deadline = time.monotonic() + 10
        while not lines and time.monotonic() < deadline:
            time.sleep(0.05)
        causes = [parse_root_cause_line(line) for line in lines]
        assert [(c.host, c.rank, c.type, c.message) for c in causes] == [("algo-2", "3", "KeyError", "'missing shard 7'")]
    finally:
        job_port.close()
    assert not can_connect("127.0.0.1", port)


def test_worker_waits_until_the_leaders_job_port_closes():
    """A worker host that finished waits for its leader (local mode stops every container as
    soon as one exits): the wait ends when the leader closes its port, or at the bound."""
    import threading

    from entrypoint.liveness import wait_until_port_closes

    port = free_port()
    leader = JobPort(port)
    closer = threading.Timer(1.5, leader.close)
    start = time.monotonic()
    closer.start()
    assert wait_until_port_closes("127.0.0.1", port, timeout_s=30) == "closed"
    assert 1.4 <= time.monotonic() - start < 5

    still_running = JobPort(port)
    try:
        start = time.monotonic()
        assert wait_until_port_closes("127.0.0.1", port, timeout_s=1.0) == "timeout"
        assert time.monotonic() - start < 4
        assert wait_until_port_closes("127.0.0.1", port, timeout_s=30, stopped=lambda: True) == "stopped"
    finally:
        still_running.close()

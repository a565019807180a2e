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

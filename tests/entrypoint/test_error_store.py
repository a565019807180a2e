"""A rank's exception reaches the leader's store from another process (as from another host)."""

import socket
import subprocess
import sys

from entrypoint.error_store import RootCauseStore
from entrypoint.plan import RECORD_ERRORS


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_failing_rank_reports_to_the_leaders_store(tmp_path):
    port = free_port()
    store = RootCauseStore(port, log=lambda m: None)
    script = tmp_path / "rank.py"
    script.write_text("import torch\nraise KeyError('missing shard 7')\n")
    env = {"PATH": "/usr/bin:/bin", "BYOC_ERROR_STORE": f"127.0.0.1:{port}", "SM_CURRENT_HOST": "algo-2", "RANK": "3"}
    done = subprocess.run([sys.executable, RECORD_ERRORS, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    causes = store.collect()
    assert [(c.host, c.rank, c.type, c.message) for c in causes] == [("algo-2", "3", "KeyError", "'missing shard 7'")]

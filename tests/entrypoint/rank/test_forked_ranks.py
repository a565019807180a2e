"""A rank torchrun forks from its own interpreter (BYOC_FORK_RANKS=1, off by default:
decide/launchers/torchrun.py) sees what a rank started as a program of its own sees, and ends
the same way: its exit code, its exception, its signals. Real torchrun, one host, one rank (a CPU
host runs one; several ranks and hosts: tests/multihost/test_restarts.py)."""

import json
import signal
import socket

import pytest

from support.jobtree import failure_text, run_entrypoint, write_tree

TORCH = {"sagemaker_torch_distributed_enabled": True, "sagemaker_instance_type": "ml.c5.xlarge"}

# What a rank can tell about the process it runs in, written where the test reads it.
FACTS = """import atexit, faulthandler, json, os, signal, sys, threading
facts = {
    "name": __name__, "argv": sys.argv[1:], "rank": os.environ["RANK"], "world": os.environ["WORLD_SIZE"],
    "sigterm": str(signal.getsignal(signal.SIGTERM)), "sighup": str(signal.getsignal(signal.SIGHUP)),
    "sigint": getattr(signal.getsignal(signal.SIGINT), "__name__", "?"),
    "faulthandler": faulthandler.is_enabled(), "threads": threading.active_count(),
    "comm": open("/proc/self/comm").read().strip(),
}
with open(os.path.join(os.environ["SM_MODEL_DIR"], "facts-" + os.environ["RANK"] + ".json"), "w") as f:
    json.dump(facts, f)
"""


def run_job(tmp_path, script: str, fork: str, **hps):
    host = socket.gethostname()
    root = write_tree(tmp_path / f"fork-{fork}", script=script, hosts=(host,), current_host=host,
                      hyperparameters={**TORCH, **hps})
    env = {"SM_NUM_CPUS": "2", "BYOC_FORK_RANKS": fork}
    return root, run_entrypoint(root, **env)


def load_facts(root) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((root / "model").glob("facts-*.json"))]


def test_a_forked_rank_sees_what_a_started_rank_sees_but_its_name(tmp_path):
    seen = {}
    for fork in ("1", "0"):
        root, done = run_job(tmp_path, FACTS, fork, epochs=2)
        assert done.returncode == 0, done.stderr[-3000:]
        seen[fork] = load_facts(root)
    forked, started = seen["1"], seen["0"]
    assert [f["rank"] for f in forked] == [f["rank"] for f in started] == ["0"]
    # Named so that the entrypoint finds and labels it (run/processes.py): its command line and
    # its /proc environment are its torchrun's.
    assert [f.pop("comm") for f in forked] == ["byoc-rank-0"]
    assert all(not f.pop("comm").startswith("byoc-rank-") for f in started)
    # Torch's agent's SIGTERM handler would raise inside the user's code: a rank has the default.
    assert forked[0]["sigterm"] == str(int(signal.SIG_DFL)) and forked[0]["sigint"] == "default_int_handler"
    assert forked == started
    assert forked[0]["argv"] == ["--epochs", "2"] and forked[0]["name"] == "__main__"


@pytest.mark.parametrize("ending, code, words", [
    ("import sys\nsys.exit(3)\n", 1, "exitcode: 3"),
    ("def load_shard():\n    raise ValueError('bad shard 7')\nload_shard()\n", 1, "ValueError: bad shard 7"),
])
def test_a_forked_rank_fails_the_job_as_a_started_one_does(tmp_path, ending, code, words):
    script = "import os\nif os.environ['RANK'] == '0':\n" + "".join("    " + line + "\n" for line in ending.splitlines())
    first_lines = []
    for fork in ("1", "0"):
        root, done = run_job(tmp_path, script, fork)
        assert done.returncode == code, done.stderr[-3000:]
        text = failure_text(root)
        assert words in text, text[:2000]
        first_lines.append(text.splitlines()[0])
    assert first_lines[0] == first_lines[1]


def test_a_forked_rank_killed_by_sigsegv_leaves_its_own_python_stack(tmp_path):
    script = ("import ctypes, os\ndef crash_in_this_function():\n    if os.environ['RANK'] == '0':\n"
              "        ctypes.string_at(0)\ncrash_in_this_function()\n")
    root, done = run_job(tmp_path, script, "1")
    assert done.returncode == 1, done.stderr[-3000:]
    text = failure_text(root)
    assert "SIGSEGV" in text and "in crash_in_this_function" in text, text[:2000]

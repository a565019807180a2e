"""A rank torchrun forks from its own interpreter (BYOC_FORK_RANKS, on by default:
decide/launchers/torchrun.py) sees what a rank started as a program of its own sees, and ends
the same way: its exit code, its exception, its signals. Real torchrun, one host, one rank (a CPU
host runs one; several ranks and hosts: tests/multihost/test_restarts.py)."""

import json
import os
import signal
import socket
import subprocess
import time

import pytest

from support.jobtree import PYTHON, REPO, entrypoint_env, failure_text, run_entrypoint, write_tree

TORCH = {"sagemaker_torch_distributed_enabled": True, "sagemaker_instance_type": "ml.c5.xlarge"}

# What a rank can tell about the process it runs in, written where the test reads it.
FACTS = """import atexit, faulthandler, json, os, signal, sys, threading
facts = {
    "name": __name__, "argv": sys.argv[1:], "rank": os.environ["RANK"], "world": os.environ["WORLD_SIZE"],
    "sigterm": str(signal.getsignal(signal.SIGTERM)), "sighup": str(signal.getsignal(signal.SIGHUP)),
    "sigint": getattr(signal.getsignal(signal.SIGINT), "__name__", "?"),
    "faulthandler": faulthandler.is_enabled(), "threads": threading.active_count(),
    "comm": open("/proc/self/comm").read().strip(), "session_leader": os.getsid(0) == os.getpid(),
    "dynamo_loaded": "torch._dynamo" in sys.modules,
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
    # A session of its own, as torchrun starts a rank: a stop to torchrun's group is not its own.
    assert forked[0]["session_leader"] is True
    # torch._dynamo (DDP's constructor imports it) comes with the fork: torchrun imported it.
    assert [f.pop("dynamo_loaded") for f in forked] == [True]
    assert [f.pop("dynamo_loaded") for f in started] == [False]
    assert forked == started
    assert forked[0]["argv"] == ["--epochs", "2"] and forked[0]["name"] == "__main__"


@pytest.mark.parametrize("ending, code, words", [
    # A sys.exit that fails a rank leads the report as an exception does (issue 62, case 8).
    ("import sys\nsys.exit(3)\n", 1, "SystemExit: the program called sys.exit(3): exit code 3\nFirst failure: rank 0"),
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


@pytest.mark.parametrize("ending", ["import os\nos._exit(0)\n", "import ctypes\nctypes.CDLL(None).exit(0)\n",
                                    "import sys\nsys.exit(0)\n", "print('returns')\n"])
def test_a_forked_rank_that_ends_well_in_any_way_ends_the_job_well(tmp_path, ending):
    """os._exit(0) (train/'s scripts end so), a library's exit(0), sys.exit(0), a return: the
    job succeeds. Before, torchrun waited for ever for the return of a rank that never came
    back to torch's worker wrapper (its return is now handed over as the rank starts)."""
    root, done = run_job(tmp_path, "import time\ntime.sleep(0.5)\n" + ending, "1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (root / "output/success").exists()


def test_a_forked_rank_interrupted_fails_the_job_and_its_children_end_with_it(tmp_path):
    """A KeyboardInterrupt (SIGINT, or _thread.interrupt_main) fails the job as in a started
    rank, not a clean end that torch's wrapper would make of it; and a rank's own child process
    (multiprocessing, daemonic: a DataLoader worker's kind) is ended at the rank's exit."""
    script = ("import multiprocessing, os, time\n"
              "child = multiprocessing.Process(target=time.sleep, args=(600,), daemon=True)\nchild.start()\n"
              "open(os.path.join(os.environ['SM_MODEL_DIR'], 'child'), 'w').write(str(child.pid))\n"
              "if os.environ.get('INTERRUPT') == '1':\n    raise KeyboardInterrupt\n")
    for interrupt, code in (("1", 1), ("0", 0)):
        host = socket.gethostname()
        root = write_tree(tmp_path / f"int-{interrupt}", script=script, hosts=(host,), current_host=host,
                          hyperparameters=TORCH)
        done = run_entrypoint(root, SM_NUM_CPUS="2", INTERRUPT=interrupt)
        assert done.returncode == code, done.stderr[-3000:]
        child = int((root / "model" / "child").read_text())
        assert not os.path.exists(f"/proc/{child}") or open(f"/proc/{child}/stat").read().split()[2] == "Z"


def test_a_forked_ranks_end_is_seen_while_a_process_it_forked_lives_on(tmp_path):
    """torchrun sees a forked rank's end by a pipe the rank holds; a process the rank forked
    held it too, and torchrun waited for that one (for ever, for this one, which outlives the
    rank): the job now fails at the rank's own exit, as with a started rank."""
    script = ("import os, sys, time\nchild = os.fork()\nif child == 0:\n    time.sleep(600)\n    os._exit(0)\n"
              "open(os.path.join(os.environ['SM_MODEL_DIR'], 'forked'), 'w').write(str(child))\nsys.exit(3)\n")
    root, done = run_job(tmp_path, script, "1")
    os.kill(int((root / "model" / "forked").read_text()), signal.SIGKILL)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "exitcode: 3" in failure_text(root)


def test_a_forked_rank_killed_by_sigsegv_leaves_its_own_python_stack(tmp_path):
    script = ("import ctypes, os\ndef crash_in_this_function():\n    if os.environ['RANK'] == '0':\n"
              "        ctypes.string_at(0)\ncrash_in_this_function()\n")
    root, done = run_job(tmp_path, script, "1")
    assert done.returncode == 1, done.stderr[-3000:]
    text = failure_text(root)
    assert "SIGSEGV" in text and "in crash_in_this_function" in text, text[:2000]


# A rank that checkpoints on SIGTERM, as a training plan's scripts are told to.
CHECKPOINTS_ON_TERM = """import os, signal, sys, time
model = os.environ["SM_MODEL_DIR"]
def on_term(signum, frame):
    with open(os.path.join(model, "terms"), "a") as f:
        f.write("term\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
open(os.path.join(model, "ready"), "w").close()
while True:
    time.sleep(0.1)
"""


def run_stopped_job(tmp_path, fork: str) -> tuple[subprocess.CompletedProcess, str]:
    host = socket.gethostname()
    root = write_tree(tmp_path / f"stop-{fork}", script=CHECKPOINTS_ON_TERM, hosts=(host,), current_host=host,
                      hyperparameters=TORCH)
    env = entrypoint_env(root, SM_NUM_CPUS="2", BYOC_FORK_RANKS=fork, BYOC_GRACE_PERIOD_S="60")
    proc = subprocess.Popen([PYTHON, "-m", "entrypoint", "train"], env=env, cwd=str(REPO),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (root / "model" / "ready").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, "", err), (root / "model" / "terms").read_text()


def test_a_stop_ends_a_forked_rank_as_it_ends_a_started_one(tmp_path):
    """The stop reaches the rank once, through torchrun (before, also through torchrun's group:
    the checkpoint handler ran twice), and the rank exits when its handler ends, as a started
    rank does (before, torch's worker waited for a torchrun closing its ranks to read its
    return: torchrun gave up on it 30 s later with SIGKILL, past a shorter grace period: 137)."""
    ended = {}
    for fork in ("1", "0"):
        done, terms = run_stopped_job(tmp_path, fork)
        assert terms == "term\n", (fork, terms, done.stderr[-3000:])
        assert "Unable to shutdown process" not in done.stderr, done.stderr[-3000:]
        ended[fork] = done.returncode
    assert ended["1"] == ended["0"] == 1  # torchrun's own code after a signal (its SignalException)


def test_a_hang_finds_a_forked_rank_by_its_name_and_names_where_it_waits(tmp_path):
    """A forked rank's command line and /proc environment are its torchrun's: the entrypoint
    finds it (for SIGUSR1, the hang check) and labels it by the name it gave itself
    (run/processes.py); the stack it prints is its own, not torchrun's."""
    script = ("import time\ndef stuck_in_a_known_place():\n    time.sleep(600)\n"
              "print('started', flush=True)\nstuck_in_a_known_place()\n")
    host = socket.gethostname()
    root = write_tree(tmp_path / "hang", script=script, hosts=(host,), current_host=host, hyperparameters=TORCH)
    # The hang clock runs from the last line of output, the job's start included: with 3 s,
    # torchrun's start-up wrote nothing for longer on a loaded machine, and the question came
    # before any rank was there ("No rank printed a Python stack": 3 runs of 3 beside a
    # fresh-root check, and inside the image). A line per import (torchrun's, the rank
    # wrapper's) keeps the start-up talking, and 15 s is past any silence left in it.
    done = run_entrypoint(root, SM_NUM_CPUS="2", BYOC_HANG_TIMEOUT_S="15", PYTHONPROFILEIMPORTTIME="1", timeout=180)
    assert done.returncode == 124, done.stderr[-3000:]
    head = failure_text(root).split("\n")[0]
    assert "rank 0 in stuck_in_a_known_place (" in head, head


def test_forked_ranks_are_found_by_name_and_started_ones_by_the_wrapper():
    from entrypoint.run import processes

    table = {pid: processes.ProcInfo(pid, 1, pid, comm, "S") for pid, comm in
             [(10, "python"), (11, "byoc-rank-0"), (12, "byoc-rank-13"), (13, "pt_data_worker"), (14, "python")]}
    cmdlines = {10: ["python", "-m", "torch.distributed.run", "--run-path", "record_errors.py"],
                11: ["python", "-m", "torch.distributed.run"], 12: ["python", "-m", "torch.distributed.run"],
                13: ["python", "-m", "torch.distributed.run"], 14: ["/usr/bin/python3", "-u", "/x/record_errors.py", "t.py"]}
    # torchrun's own argv names the wrapper past its first two words: torchrun is not a rank.
    assert processes.decide_rank_pids(cmdlines, table) == [11, 12, 14]
    assert [processes.parse_rank_comm(c) for c in ("byoc-rank-0", "byoc-rank-13", "byoc-rank-", "byoc-rank-x", "python")] \
        == ["0", "13", None, None, None]


@pytest.mark.parametrize("argv, preload", [
    (["--nnodes", "1", "--run-path", "--start-method", "fork", "train.py"], True),
    (["--nnodes", "1", "--start-method", "spawn", "train.py"], False),
    (["--nnodes", "1", "train.py", "--start-method", "fork"], False),  # the program's own argument
    (["--nnodes", "1", "--no-such-option"], False),  # torchrun refuses it, once, when it runs
])
def test_torchrun_imports_dynamo_ahead_only_when_it_forks_its_ranks(argv, preload, capsys):
    from entrypoint.rank.launch_torchrun import decide_preload

    assert decide_preload(argv) is preload
    assert capsys.readouterr().err == ""


HELD_IMPORT = """
import json, os, sys, threading
sys.path.insert(0, {folder!r})
import launch_torchrun
seen = {{}}
def stand_in():  # the held torchrun's imports
    seen["import_nice"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen["group_during"] = launch_torchrun.load_autogroup_nice()
launch_torchrun.run_at_low_priority(stand_in)
seen["main_nice"] = os.getpriority(os.PRIO_PROCESS, 0)
seen["group_after"] = launch_torchrun.load_autogroup_nice()
print(json.dumps(seen))
"""


def test_a_held_torchrun_imports_at_the_lowest_priority_and_runs_at_its_own():
    """The held torchrun's imports take only the cores' idle time from the attempt running beside
    it; torchrun, and the ranks it forks, run at the priority it was started with."""
    from entrypoint.rank import launch_torchrun

    script = HELD_IMPORT.format(folder=os.path.dirname(launch_torchrun.__file__))
    done = subprocess.run([PYTHON, "-c", script], capture_output=True, text=True, timeout=60,
                          start_new_session=True)  # a session (and its scheduling group) of its own
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["import_nice"] == launch_torchrun.HELD_IMPORT_NICE and seen["main_nice"] == 0
    if os.path.exists(launch_torchrun.AUTOGROUP):  # the kernel groups a session's threads
        assert (seen["group_during"], seen["group_after"]) == (launch_torchrun.HELD_IMPORT_NICE, 0)
    else:
        assert seen["group_during"] is seen["group_after"] is None

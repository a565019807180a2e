"""The job report through the real entrypoint and real ranks (mpirun, 2 ranks on this host):
the slow rank is named and the one waiting for it is not (plain all_reduce, and DDP); a
failing job still writes its report; BYOC_REPORT=0 writes none; a program that is not
PyTorch gets the host's figures and a note saying so."""

import json
import socket

import pytest

from support.jobtree import run_entrypoint, write_tree

pytestmark = pytest.mark.slow

MPI_2 = {"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2}

# Rank 1 computes 3x longer; rank 0 waits for it inside all_reduce.
PLAIN = """
import os, time, torch, torch.distributed as dist
rank, world = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
dist.init_process_group("gloo", rank=rank, world_size=world)
model = torch.nn.Linear(64, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(40):
    loss = model(torch.randn(32, 64)).pow(2).mean()
    opt.zero_grad(); loss.backward()
    time.sleep(0.03 if rank == 1 else 0.01)
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
    if step == int(os.environ.get("FAIL_AT", "-1")):
        raise RuntimeError("injected failure at step %d" % step)
"""

# Rank 1's data arrives slowly (before forward); rank 0 waits inside DDP's backward.
DDP = """
import os, time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
rank, world = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
dist.init_process_group("gloo", rank=rank, world_size=world)
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
opt = torch.optim.Adam(model.parameters())
for step in range(40):
    time.sleep(0.03 if rank == 1 else 0.005)
    loss = model(torch.randn(32, 64)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
"""


def run_job(tmp_path, script, hps=MPI_2, **env):
    host = socket.gethostname()
    root = write_tree(tmp_path, script=script, hosts=(host,), current_host=host, hyperparameters=hps)
    done = run_entrypoint(root, **env)
    folder = root / "output" / "data" / "report"
    report = json.loads((folder / "report.json").read_text()) if (folder / "report.json").exists() else None
    return host, done, report, folder


def rank_names(report):
    return sorted((s["rank"], s["kind"]) for s in report["stragglers"] if s["kind"] == "rank")


@pytest.mark.parametrize("script, source", [(PLAIN, "step minus collectives"), (DDP, "DDP: step minus backward wait")])
def test_the_slow_rank_is_named_and_not_the_one_that_waits(tmp_path, script, source):
    # A sample every 0.25 s: the job's 40 steps take ~1.2 s once its ranks start fast (forked
    # under torchrun), 2 samples at the default second.
    host, done, report, folder = run_job(tmp_path, script, BYOC_REPORT_INTERVAL_S="0.25")
    assert done.returncode == 0, done.stderr[-3000:]
    assert set(report) >= {"hosts", "ranks", "stragglers", "phases"}
    assert rank_names(report) == [(1, "rank")], report["stragglers"]
    assert [(r["rank"], r["steps"], r["compute_source"]) for r in report["ranks"]] == [(0, 40, source), (1, 40, source)]
    # the step takes as long on both (they are in step); compute tells them apart
    fast, slow = report["ranks"]
    assert abs(fast["step_ms"] - slow["step_ms"]) < 0.25 * slow["step_ms"], report["ranks"]
    assert f"job report: straggler: rank 1 on {host}: compute " in done.stderr
    phases = [p["name"] for p in report["phases"]]
    assert phases[:3] == ["entrypoint start", "job read", "processes started"] and phases[-1] == "end"
    assert "first training step" in phases
    series = report["hosts"][host]["series"]
    assert len(series["time"]) >= 3 and max(series["tree_cpu_pct"]) > 10 and max(series["tree_rss_mb"]) > 100
    assert (folder / "index.html").read_text().count("<svg") >= 4


def test_a_failing_job_still_writes_what_ran(tmp_path):
    host, done, report, _ = run_job(tmp_path, PLAIN.replace('os.environ.get("FAIL_AT", "-1")', '"20"'))
    assert done.returncode == 1 and (tmp_path / "output" / "failure").exists()
    assert report["job"]["exit_code"] == 1
    assert {r["rank"] for r in report["ranks"]} == {0, 1} and min(r["steps"] for r in report["ranks"]) >= 20
    assert report["phases"][-1]["name"] == "end"


def test_byoc_report_0_writes_none_and_tells_the_ranks_nothing(tmp_path):
    script = "import json, os; json.dump(dict(os.environ), open(os.environ['SM_MODEL_DIR'] + '/env.json', 'w'))\n"
    _, done, report, folder = run_job(tmp_path, script, hps={}, BYOC_REPORT="0")
    assert done.returncode == 0, done.stderr[-3000:]
    assert report is None and not folder.exists() and "job report" not in done.stderr
    assert "BYOC_REPORT_DIR" not in json.loads((tmp_path / "model" / "env.json").read_text())


def test_a_program_that_is_not_pytorch_gets_the_hosts_figures_and_a_note(tmp_path):
    host, done, report, folder = run_job(tmp_path, "import time\nfor i in range(25):\n    time.sleep(0.1)\n", hps={})
    assert done.returncode == 0, done.stderr[-3000:]
    assert report["ranks"] == [] and report["job"]["framework"] == "none"
    assert any("not a PyTorch program" in n for n in report["notes"])
    assert len(report["hosts"][host]["series"]["time"]) >= 1
    assert (folder / "index.html").exists()


def test_trains_own_scripts_add_data_wait_and_samples(tmp_path):
    """train/'s loop tells the report its data wait and samples (train/report_hooks.py), and
    mpi4py's all-reduce wait, which the wrapper cannot see."""
    from tests.train.train_helpers import write_job

    host = socket.gethostname()
    write_job(tmp_path)
    root = write_tree(tmp_path, script="import runpy\nrunpy.run_module('train.mpi_train', run_name='__main__')\n",
                      program="job.py", hosts=(host,), current_host=host,
                      hyperparameters={**MPI_2, "epochs": 3, "batch_size": 8, "hidden_sizes": "[32]", "log_every": 5})
    done = run_entrypoint(root, OMP_NUM_THREADS="1", SM_NUM_CPUS="2")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((root / "output" / "data" / "report" / "report.json").read_text())
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    for r in report["ranks"]:
        assert r["compute_source"] == "step minus collectives" and r["wait_ms"] > 0, r
        assert r["data_wait_ms"] > 0 and r["samples_per_s"] > 0, r
    # and its progress lines' own figure (`... samples/s`), as any script's metric lines would be read
    assert report["hosts"][host]["samples_per_s"] > 0
    assert f"job report: {host}: the script's own output reports " in done.stderr


NESTED = """
import threading, time, torch, torch.distributed as dist
class Wrapper(torch.optim.SGD):  # a wrapper optimizer whose step runs the inner one's, as Horovod's does
    def step(self, closure=None):
        time.sleep(0.02)  # Horovod waits for its all-reduces here
        return super().step(closure)
Wrapper.__module__ = "horovod.torch.optimizer"
model = torch.nn.Linear(4, 1)
opt = Wrapper(model.parameters(), lr=0.1)
for i in range(10):
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
plain = torch.optim.SGD(model.parameters(), lr=0.1)
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % PORT, rank=0, world_size=2)
dist.barrier()  # then the peer sleeps 50 ms: the wait below is nearly all inside the inner all_gather
plain.step()
started = time.perf_counter()
dist.all_gather_object([None, None], {"x": 1})  # calls all_gather inside: one wait, not two
wall = (time.perf_counter() - started) * 1e3
plain.step()
def steps():  # several threads stepping at once: the hooks must neither raise nor miscount
    own = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(100):
        own.step()
threads = [threading.Thread(target=steps) for _ in range(4)]
[t.start() for t in threads]
[t.join() for t in threads]
print("WALL", wall)
"""

# The other rank of NESTED's collectives, without the rank wrapper (nothing of it is measured).
PEER = """
import os, time, torch.distributed as dist
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % PORT, rank=1, world_size=2)
dist.barrier()
time.sleep(0.05)
dist.all_gather_object([None, None], {"y": 2})
# Out at once, past gloo's teardown: rank 0 closing its side while this process's process group
# is destroyed at exit made gloo abort it (SIGABRT, seen once in a fresh-root run on a loaded machine).
os._exit(0)
"""


def test_nested_steps_threads_and_nested_collectives_count_once(tmp_path):
    import subprocess
    import sys

    from entrypoint.decide.plan import RECORD_ERRORS

    folder = tmp_path / "figures"
    folder.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "nested.py"
    script.write_text(NESTED.replace("PORT", str(port)))
    peer = subprocess.Popen([sys.executable, "-c", PEER.replace("PORT", str(port))], env={"PATH": "/usr/bin:/bin"})
    try:
        done = subprocess.run([sys.executable, RECORD_ERRORS, str(script)], capture_output=True, text=True,
                              timeout=120, env={"PATH": "/usr/bin:/bin", "BYOC_REPORT_DIR": str(folder), "RANK": "0"})
        assert peer.wait(timeout=60) == 0
    finally:
        peer.kill()
    assert done.returncode == 0, done.stderr[-3000:]
    wall = float(done.stdout.split("WALL")[1])
    figures = json.loads((folder / "rank-0.json").read_text())
    assert figures["steps"] == 10 + 2 + 4 * 100 and figures["stride"] == 1
    series = figures["series"]
    assert len({len(v) for v in series.values()}) == 1  # every series as long as the others
    # the wrapper's steps (points 1-9): ~20 ms each, nearly all of it the wait inside its step
    assert all(w >= 15 for w in series["wait_ms"][:9]), series["wait_ms"][:9]
    # the step around all_gather_object: its wait is the call's time, counted once: inside the
    # script's own measure of the call. Counted again, the inner all_gather's wait for the peer
    # (most of the call) would take it past that measure.
    collective = series["wait_ms"][series["step"].index(11)]  # the 12th step (points start at the 2nd)
    assert 0 < collective <= wall + 1.0, (collective, wall)

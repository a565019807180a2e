"""A real TensorBoard server on a finished job's folder, its scalars page screenshotted in
headless chromium (Debian's, as tests/entrypoint/jobreport/test_report_html.py uses it): the per-rank
step-time plots are there, checked by their pixels."""

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

from support.jobtree import run_entrypoint, write_tree

pytest.importorskip("tensorboard", reason="the test extra's tensorboard (not in the image, where these tests also run)")
Image = pytest.importorskip("PIL.Image", reason="pillow comes with the test extra's tensorboard")

pytestmark = pytest.mark.slow

TWO_RANKS = """
import os, time, torch, torch.distributed as dist
rank, world = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
dist.init_process_group("gloo", rank=rank, world_size=world)
model = torch.nn.Linear(64, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(40):
    loss = model(torch.randn(32, 64)).pow(2).mean()
    opt.zero_grad(); loss.backward()
    time.sleep(0.005 * (1 + step % 7) * (1 + rank))  # a shape to draw, rank 1 slower
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
"""
LINE = (255, 112, 67)  # TensorBoard's colour for the first run (ours: byoc-job)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_tags(port: int, proc, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugin/scalars/tags", timeout=5) as r:
                tags = json.load(r)
            if "rank/1/step_ms" in tags.get("byoc-job", {}):
                return tags
        except OSError:
            pass
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "TensorBoard never served the job's scalars"  # a hang guard
        time.sleep(0.5)


def test_tensorboard_shows_a_step_time_plot_per_rank(tmp_path):
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("chromium is not installed: run scripts/bootstrap.sh (it installs Debian's chromium "
                    "for the tests), or apt-get install chromium")
    host = socket.gethostname()
    root = write_tree(tmp_path / "ml", script=TWO_RANKS, hosts=(host,), current_host=host,
                      hyperparameters={"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2})
    # The default live interval (10 s): the last write is at the job's end. A free port and a
    # runtime folder of its own: another job on this machine may hold 7777 or this job's id.
    done = run_entrypoint(root, BYOC_TENSORBOARD="1", BYOC_MASTER_PORT=str(free_port()),
                          BYOC_RUNTIME_DIR=str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr[-3000:]
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(root / "output/tensorboard"),
                               "--port", str(port), "--host", "127.0.0.1"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        tags = wait_for_tags(port, server)
        assert {"rank/0/step_ms", "rank/1/step_ms", f"host/{host}/cpu_pct"} <= set(tags["byoc-job"])
        shot = tmp_path / "tensorboard.png"
        run = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                              "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
                              "--window-size=1400,1000", "--virtual-time-budget=15000",
                              f"http://127.0.0.1:{port}/#scalars&tagFilter=step_ms&_smoothingWeight=0"],
                             capture_output=True, text=True, timeout=180)
        assert shot.exists(), f"chromium wrote no screenshot (exit {run.returncode}):\n{run.stderr[-3000:]}"
    finally:
        server.terminate()
        server.communicate(timeout=30)
    image = np.asarray(Image.open(shot).convert("RGB")).astype(np.int32)
    line = np.abs(image - np.array(LINE)).sum(axis=2) <= 60
    # The filter's section comes first, under the tag filter: rank 0's chart on the left, rank 1's
    # on the right, each a line of the run's colour over hundreds of pixels (~2,500 here); the
    # page without them has none there (the header's orange is another shade and above).
    charts = line[200:460]
    left, right = int(charts[:, 360:720].sum()), int(charts[:, 720:1100].sum())
    assert left > 800 and right > 800, (left, right)

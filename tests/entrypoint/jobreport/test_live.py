"""The job watched live, through the real entrypoint and a real rank: TensorBoard's own loader
(EventAccumulator) reads our scalars while the job is still running (the script is held after
its first steps until the test has read them), the status line comes on its interval and not
at all with 0, and the live thread survives hostile rank files and a folder it cannot write."""

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from entrypoint.jobreport.live.loop import LiveLoop
from entrypoint.decide.job_report import ReportSpec
from entrypoint.jobreport.live.status_line import FIELDS, parse_status_line
from support.jobtree import PYTHON, REPO, entrypoint_env, write_tree

accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator",
                                  reason="the test extra's tensorboard (not in the image, where these tests also run)")

# A rank that steps, holds after HOLD_AT steps until the test says go (a file), then steps on.
HELD = """
import json, os, sys, time, torch
model = torch.nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
hold_at, go = int(os.environ["HOLD_AT"]), os.environ["GO_FILE"]
for step in range(int(os.environ.get("STEPS", "40"))):
    loss = model(torch.randn(8, 16)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    if step == 0:
        open(os.environ["FIRST_STEP_FILE"], "w").write(repr(time.time()))
    if step == hold_at:
        while not os.path.exists(go):
            time.sleep(0.05)
    time.sleep(0.02)
print("1,234 samples/s", flush=True)
"""


def read(folder: Path) -> dict:
    acc = accumulator.EventAccumulator(str(folder))
    acc.Reload()
    return {tag: [(e.step, e.value, e.wall_time) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def start_job(tmp_path, tensorboard: bool, **env):
    host = socket.gethostname()
    root = write_tree(tmp_path / "ml", script=HELD, hosts=(host,), current_host=host)
    if tensorboard:
        (root / "input/config/tensorboardoutputconfig.json").write_text(
            json.dumps({"LocalPath": str(root / "output/tensorboard"), "S3OutputPath": "s3://bucket/tb"}))
    files = {"GO_FILE": str(tmp_path / "go"), "FIRST_STEP_FILE": str(tmp_path / "first-step")}
    proc = subprocess.Popen([PYTHON, "-m", "entrypoint", "train"], cwd=str(REPO), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=entrypoint_env(root, BYOC_REPORT_INTERVAL_S="0.5", HOLD_AT="3",
                                               BYOC_RUNTIME_DIR=str(tmp_path / "run"), **files, **env))
    return host, root, proc


def wait_for(what, check, proc, timeout=90):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert proc.poll() is None, f"the job ended before {what}: {proc.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"  # a hang guard, not a speed goal
        time.sleep(0.1)


@pytest.mark.slow
def test_scalars_are_readable_while_the_job_runs_and_the_status_line_keeps_its_interval(tmp_path):
    host, root, proc = start_job(tmp_path, True, BYOC_LIVE_INTERVAL_S="1", BYOC_STATUS_INTERVAL_S="1", STEPS="60")
    folder = root / "output/tensorboard/byoc-job"
    try:
        def ready():
            scalars = read(folder) if folder.is_dir() else {}
            return scalars if {"rank/0/step_ms", f"host/{host}/cpu_pct"} <= set(scalars) else None

        scalars = wait_for("the rank's scalars", ready, proc)
        seen_at = time.time()
        assert proc.poll() is None  # read while the job runs: the rank is held after its 4th step
        first_step = float((tmp_path / "first-step").read_text())
        # the rank's first steps, the first points it wrote (its 2nd step on): no later step exists yet
        assert [s for s, _, _ in scalars["rank/0/step_ms"]][:1] == [1]
        assert max(s for s, _, _ in scalars["rank/0/step_ms"]) <= 3
        print(f"\nfirst rank scalar read {seen_at - first_step:.2f} s after the first step (live interval 1 s)")
        (tmp_path / "go").write_text("")
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    scalars = read(folder)
    steps = [s for s, _, _ in scalars["rank/0/step_ms"]]
    assert steps == sorted(set(steps)) and steps[0] == 1 and steps[-1] == 59  # to the last step, each once
    assert {"rank/0/compute_ms", "rank/0/wait_ms", "rank/0/backward_ms", f"host/{host}/tree_cpu_pct",
            f"host/{host}/samples_per_s"} <= set(scalars)
    lines = [parse_status_line(line) for line in err.splitlines() if "BYOC-STATUS" in line]
    assert len(lines) >= 2 and all(line is not None for line in lines), err[-3000:]
    elapsed = [int(line["elapsed_s"]) for line in lines]
    assert all(b - a >= 1 for a, b in zip(elapsed, elapsed[1:])), elapsed  # never more often than its interval
    assert lines[-1]["steps"] != "-" and float(lines[-1]["step_ms"]) > 0 and lines[-1]["slowest_rank"] == "-"
    assert list(lines[-1]) == list(FIELDS)
    assert (root / "output/data/report/report.json").exists()
    assert os.listdir(root / "output/tensorboard") == ["byoc-job"]  # ours in our subfolder only


@pytest.mark.slow
def test_status_line_off_and_no_tensorboard_without_a_config(tmp_path):
    (tmp_path / "go").write_text("")
    host, root, proc = start_job(tmp_path, False, BYOC_STATUS_INTERVAL_S="0", STEPS="10")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert "BYOC-STATUS" not in err and "job report (live)" not in err
    assert not (root / "output/tensorboard").exists()


class StandInSampler:
    """The sampler's side the live thread reads: its points and phases."""

    def __init__(self):
        self.phases = {"entrypoint start": 1000.0}
        self.points = [{"time": 1001.0, "cpu_pct": float("nan"), "tree_cpu_pct": 5.0}]

    def snapshot(self):
        return list(self.points), dict(self.phases)


class NoThroughput:
    def median(self):
        return None


def test_hostile_rank_files_are_noted_and_the_rest_still_written(tmp_path):
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    good = {"rank": "0", "steps": 3, "ddp": False, "series": {"step": [1, 2], "step_ms": [5.0, 6.0], "wait_ms": [0, 0],
                                                              "backward_ms": [1, 1], "data_wait_ms": [0, 0],
                                                              "samples": [0, 0]}}
    (ranks / "rank-0.json").write_text(json.dumps(good))
    (ranks / "rank-1.json").write_text('{"rank": "1", "series": {"step": [1, 2, 3], "step_ms": [NaN, Infinity, "x"],'
                                       ' "wait_ms": [], "backward_ms": [], "data_wait_ms": [], "samples": []}}')
    (ranks / "rank-2.json").write_text("[" * 50000)
    (ranks / "rank-3.json").write_text(json.dumps({"rank": [1], "series": 5}))
    (ranks / "rank-4.json").write_bytes(b"\xff\xfe\x00garbage")
    with open(ranks / "rank-5.json", "w") as f:
        f.write('{"rank": "5", "series": {"step": [' + ",".join(["1"] * 2_100_000) + "]}}")
    logged = []
    spec = ReportSpec(str(ranks), 1.0, 0, 0, str(tmp_path / "tb" / "byoc-job"), 1.0, 1.0)
    loop = LiveLoop(spec, "algo-1", StandInSampler(), NoThroughput(), logged.append)
    loop.next_status = 0.0
    loop.tick()
    scalars = read(tmp_path / "tb" / "byoc-job")
    assert [s for s, _, _ in scalars["rank/0/step_ms"]] == [1, 2] and "rank/1/step_ms" not in scalars
    assert "host/algo-1/cpu_pct" not in scalars and "host/algo-1/tree_cpu_pct" in scalars
    notes = [line for line in logged if line.startswith("job report (live)")]
    assert any("rank '1': steps whose time is not a finite number" in n for n in notes), logged
    assert any("rank-5.json: larger than" in n for n in notes), logged
    assert any("cpu_pct value that is not a finite number" in n for n in notes), logged
    assert any(parse_status_line(line) for line in logged)
    loop.stop()


def test_a_folder_that_cannot_be_written_is_a_note_and_the_loop_goes_on(tmp_path):
    (tmp_path / "not-a-folder").write_text("")
    logged = []
    spec = ReportSpec(str(tmp_path), 1.0, 0, 0, str(tmp_path / "not-a-folder" / "byoc-job"), 1.0, 1.0)
    loop = LiveLoop(spec, "algo-1", StandInSampler(), NoThroughput(), logged.append)
    loop.next_status = 0.0
    loop.tick()
    loop.next_status = 0.0
    loop.tick()
    assert sum("cannot write" in line for line in logged) == 1
    assert sum(parse_status_line(line) is not None for line in logged) == 2  # the status line goes on

"""One rule for the live view (jobreport/live/: update.py, view.py, loop.py, tb_events.py): a
figure outside what the writer can hold is left out with a note, and the view goes on. At the
edges (a step of 2**63-1, 2**63, 2**64, negative, not whole, a bool; a value inf, NaN, a
400-digit int, beyond a 32-bit float; a rank's name just under, at and over the cut length),
through the real view and writer, read back with TensorBoard's own loader, and through the real
entrypoint; a folder the events cannot be written to is a note in report.json as in the log."""

from __future__ import annotations

import collections
import json
import os
import subprocess
from pathlib import Path

import pytest

from entrypoint.decide.job_report import ReportSpec
from entrypoint.jobreport.live import tb_events
from entrypoint.jobreport.live.update import MAX_NAME, MAX_STEP, build_rank_name
from entrypoint.jobreport.live.loop import LiveLoop
from entrypoint.jobreport.live.view import build_tag_part
from entrypoint.jobreport.live.status_line import parse_status_line
from support.jobtree import run_entrypoint, write_tree

loader = pytest.importorskip("tensorboard.backend.event_processing.event_file_loader",
                             reason="the test extra's tensorboard (not in the image, where these tests also run)")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


def read_events(folder: Path) -> dict[str, list[int]]:
    """tag -> the steps of its scalars in the order written, every one (TensorBoard's
    EventAccumulator would hide a step written twice)."""
    steps = collections.defaultdict(list)
    for path in sorted(folder.glob("events*")):
        for event in loader.EventFileLoader(str(path)).Load():
            for value in event.summary.value:  # the loader turns a simple_value into a scalars tensor
                if value.HasField("simple_value") or value.metadata.plugin_data.plugin_name == "scalars":
                    steps[value.tag].append(event.step)
    return dict(steps)


def series(steps: list, step_ms: list | None = None) -> dict:
    zeros = [0] * len(steps)
    return {"step": steps, "step_ms": step_ms or [5.0] * len(steps), "wait_ms": zeros, "backward_ms": zeros,
            "data_wait_ms": zeros, "samples": zeros}


def put(folder: Path, name: str, raw: dict) -> None:
    (folder / name).write_text(json.dumps(raw))


class Sampler:
    """The sampler's side the live thread reads: a new host point each tick (add())."""

    def __init__(self):
        self.phases = {"entrypoint start": 1000.0}
        self.points = []

    def add(self):
        self.points.append({"time": 1001.0 + len(self.points), "tree_cpu_pct": 5.0})

    def snapshot(self):
        return list(self.points), dict(self.phases)


class NoThroughput:
    def median(self):
        return None


def make_loop(tmp_path, tb=True):
    ranks = tmp_path / "ranks"
    ranks.mkdir(exist_ok=True)
    logged, sampler = [], Sampler()
    spec = ReportSpec(str(ranks), 1.0, 0, 0, str(tmp_path / "tb" / "byoc-job") if tb else None, 1.0, 1.0)
    return LiveLoop(spec, "algo-1", sampler, NoThroughput(), logged.append), ranks, sampler, logged


def ticks(loop, sampler, count: int, between=None) -> None:
    for i in range(count):
        sampler.add()
        if between is not None:
            between(i)
        loop.next_status = 0.0  # a status line due every tick
        loop.tick()


def test_steps_and_values_at_the_edges_are_left_out_with_a_note_and_the_view_goes_on(tmp_path):
    loop, ranks, sampler, logged = make_loop(tmp_path)
    steps = [MAX_STEP - 3, MAX_STEP - 2, MAX_STEP - 1, MAX_STEP, MAX_STEP + 1, 2 ** 64, -1, 1.5, True, None, "7"]
    put(ranks, "rank-1.json", {"rank": "1", "steps": 4, "series": series(steps)})
    values = [float("inf"), float("nan"), 10 ** 400, -(10 ** 400), True, "5", 1e12, 1e12 + 1, 4e38, 0.0]
    put(ranks, "rank-2.json", {"rank": "2", "steps": 10 ** 400, "series": series(list(range(1, 11)), values)})

    def grow(i):
        put(ranks, "rank-0.json", {"rank": "0", "steps": i + 1, "series": series(list(range(1, i + 2)))})

    ticks(loop, sampler, 3, grow)
    loop.stop()
    events = read_events(tmp_path / "tb" / "byoc-job")
    assert events["host/algo-1/tree_cpu_pct"] == [1, 2, 3]  # every tick's host points
    assert events["rank/0/step_ms"] == [1, 2, 3]  # the good rank, each step once
    assert events["rank/1/step_ms"] == [MAX_STEP - 3, MAX_STEP - 2, MAX_STEP - 1, MAX_STEP]  # int64's last, held
    assert events["rank/2/step_ms"] == [7, 10]  # 1e12 and 0.0 only; 1e12 + 1, 4e38 and the rest left out
    notes = [line for line in logged if line.startswith("job report (live): ")]
    assert f"job report (live): rank '1': steps that are not whole numbers from 0 to {MAX_STEP}, left out" in notes
    assert "job report (live): rank '2': steps whose time is not a finite number, left out" in notes
    assert not any("cannot write" in line or "live figures:" in line for line in logged), logged
    assert sum(parse_status_line(line) is not None for line in logged) >= 3  # every tick's status line
    assert loop.events.problem is None and loop.events.written > 0


@pytest.mark.parametrize("length", [MAX_NAME - 1, MAX_NAME, MAX_NAME + 1, 5000])
def test_a_ranks_name_at_any_length_has_each_step_written_once(tmp_path, length):
    loop, ranks, sampler, logged = make_loop(tmp_path)
    name, twin = "r" * (length - 1) + "a", "r" * (length - 1) + "b"  # the same start: two ranks still

    def grow(i):
        for n, who in enumerate((name, twin)):
            put(ranks, f"rank-{n}.json", {"rank": who, "steps": 2 + (i == 2), "series": series([1, 2, 3][:2 + (i == 2)])})

    ticks(loop, sampler, 3, grow)  # the same two steps twice, then a third
    loop.stop()
    events = read_events(tmp_path / "tb" / "byoc-job")
    kept = [build_rank_name(name), build_rank_name(twin)]
    for who in kept:
        assert events[f"rank/{build_tag_part(who)}/step_ms"] == [1, 2, 3]  # not again at every tick
    assert all(len(k) <= MAX_NAME for k in kept) and kept[0] != kept[1]
    assert (kept[0] == name) == (length <= MAX_NAME)
    assert [r.rank for r in loop.view.ranks_now()] == sorted(kept)


def test_tags_that_share_a_moment_share_its_event_and_each_tag_keeps_its_order(tmp_path):
    """A host's point at step 2 and a rank's step 2 at the same time share one event, but never
    ahead of that rank's step 1 (written by moment alone, TensorBoard saw the rank go 2, 1)."""
    events = tb_events.EventsFile(str(tmp_path / "byoc-job"), lambda note: None)
    assert events.write([("host", 1.0, 2, 100.0), ("rank", 1.0, 1, 99.0), ("rank", 2.0, 2, 100.0),
                         ("other", 3.0, 2, 100.0), ("rank", 4.0, 2, 100.0)], [])
    events.close()
    assert read_events(tmp_path / "byoc-job") == {"host": [2], "rank": [1, 2, 2], "other": [2]}
    assert events.written == 4  # the host's moment, the rank's step 1, its step 2 (with other's), its step 2 again


def test_the_writer_leaves_out_what_it_cannot_hold_and_writes_the_rest(tmp_path):
    noted = []
    events = tb_events.EventsFile(str(tmp_path / "byoc-job"), noted.append)
    edges = [(MAX_STEP, 1.0), (MAX_STEP + 1, 1.0), (2 ** 64, 1.0), (-1, 1.0), (-(2 ** 63) - 1, 1.0), (True, 1.0),
             (2.0, 1.0), (3, float("inf")), (4, float("nan")), (5, 10 ** 400), (6, True), (7, 4e38), (8, 3e38),
             (9, -(10 ** 400)), (10, 2.5)]
    assert events.write([("a", value, step, 100.0) for step, value in edges], [("job/phases", "text", 2 ** 63, 100.0)])
    assert events.write([("a", 1.0, 11, float("inf")), ("a", 1.0, 12, 100.0)], [])  # and it goes on
    events.close()
    assert read_events(tmp_path / "byoc-job") == {"a": [MAX_STEP, -1, 8, 10, 12]}
    assert events.problem is None and events.left_out == 13
    assert len(noted) == 1 and noted[0].startswith("TensorBoard events: figures the writer cannot hold are left "
                                                   "out (the first: a: step 9223372036854775808")


# --- through the entrypoint -------------------------------------------------------------------------

# Writes hostile rank files beside a good one it grows every step, until the events file grew
# four times (four ticks; the deadline is a hang guard, not a goal), then records its last step.
HOSTILE = r"""
import glob, json, os, time
folder, events = os.environ["BYOC_REPORT_DIR"], os.environ["TB_DIR"]
def put(name, raw):
    with open(os.path.join(folder, "." + name), "w") as f:
        json.dump(raw, f)
    os.replace(os.path.join(folder, "." + name), os.path.join(folder, name))
def series(steps, step_ms):
    zeros = [0] * len(steps)
    return {"step": steps, "step_ms": step_ms, "wait_ms": zeros, "backward_ms": zeros, "data_wait_ms": zeros,
            "samples": zeros}
put("rank-7.json", {"rank": "7", "steps": 3, "series": series([1, 2 ** 63, 2 ** 64], [5.0] * 3)})
put("rank-8.json", {"rank": "8", "steps": 2, "series": series([1, 2], [10 ** 400, 5.0])})
put("rank-9.json", {"rank": "L" * 5000, "steps": 3, "series": series([1, 2, 3], [5.0] * 3)})
sizes, step, guard = set(), 0, time.monotonic() + 120
while len(sizes) < 5 and time.monotonic() < guard:
    step += 1
    put("rank-5.json", {"rank": "5", "steps": step, "series": series(list(range(1, step + 1)), [5.0] * step)})
    sizes.add(sum(os.path.getsize(p) for p in glob.glob(os.path.join(events, "events*"))))
    time.sleep(0.1)
open(os.path.join(os.environ["SM_MODEL_DIR"], "last-step"), "w").write(str(step))
"""


def run_job(tmp_path, script: str, tb_dir: Path):
    root = write_tree(tmp_path / "ml", script=script)
    (root / "input/config/tensorboardoutputconfig.json").write_text(
        json.dumps({"LocalPath": str(tb_dir), "S3OutputPath": "s3://bucket/tb"}))
    done = run_entrypoint(root, timeout=300, BYOC_RUNTIME_DIR=str(tmp_path / "run"), BYOC_REPORT_INTERVAL_S="0.5",
                          BYOC_LIVE_INTERVAL_S="1", BYOC_STATUS_INTERVAL_S="1", BYOC_COMPILE_CACHE="0",
                          TB_DIR=str(tb_dir / "byoc-job"))
    assert done.returncode == 0, done.stderr[-3000:]
    return root, done, json.loads((root / "output/data/report/report.json").read_text())


def test_hostile_rank_files_cost_only_their_own_figures_through_the_entrypoint(tmp_path):
    root, done, report = run_job(tmp_path, HOSTILE, tmp_path / "tb")
    events = read_events(tmp_path / "tb" / "byoc-job")
    last = int((root / "model/last-step").read_text())
    five = events["rank/5/step_ms"]
    assert five == sorted(set(five)) and five[-1] == last  # to its last step, each once
    assert len(events["host/algo-1/cpu_pct"]) >= 4  # every tick's host points
    assert events["rank/7/step_ms"] == [1] and events["rank/8/step_ms"] == [2]
    assert events[f"rank/{build_tag_part(build_rank_name('L' * 5000))}/step_ms"] == [1, 2, 3]  # once each
    assert sum("BYOC-STATUS" in line for line in done.stderr.splitlines()) >= 2
    notes = report["notes"]
    assert f"live figures: rank '7': steps that are not whole numbers from 0 to {MAX_STEP}, left out" in notes
    assert "live figures: rank '8': steps whose time is not a finite number, left out" in notes
    assert "cannot write" not in done.stderr


def test_a_folder_the_events_cannot_be_written_to_is_a_note_in_the_report_too(tmp_path):
    (tmp_path / "file").write_text("x")
    _, done, report = run_job(tmp_path, "print('done')\n", tmp_path / "file" / "tb")
    [line] = [line for line in done.stderr.splitlines() if "cannot write" in line]
    assert "job report (live): TensorBoard events: cannot write" in line and "the job goes on without them" in line
    assert [n for n in report["notes"] if "cannot write" in n] == [f"live figures: {line.split('job report (live): ', 1)[1]}"]


@needs_root
def test_a_read_only_events_folder_is_a_note_in_the_report_too(tmp_path):
    mount = tmp_path / "ro"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(mount)], check=True)
    try:
        _, done, report = run_job(tmp_path, "print('done')\n", mount)
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)
    assert sum("cannot write" in line for line in done.stderr.splitlines()) == 1
    assert any(n.startswith("live figures: TensorBoard events: cannot write") and "Read-only file system" in n
               for n in report["notes"]), report["notes"]

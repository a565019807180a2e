"""The job watched live, piece by piece (jobreport/live/: update.py, view.py, loop.py,
status_line.py, tb_events.py): the status line's format, the live updates' bounds and what
hostile figures become, the tags, and the events file on a folder that cannot take it (real
mounts: a read-only and a full tmpfs)."""

import json
import math
import os
import subprocess
import time

import pytest

from entrypoint.decide.settings import parse_launch_settings
from entrypoint.errors import JobDefinitionError
from entrypoint.jobreport.live import tb_events
from entrypoint.jobreport.live import update as live_update
from entrypoint.jobreport.live import view as live_view
from entrypoint.jobreport.live.update import Notes, build_rank_update, build_update, fit_update, parse_update
from entrypoint.jobreport.live.loop import decide_tick_s
from entrypoint.jobreport.live.view import LiveView, build_rank_values, build_tag_part
from entrypoint.decide.job_report import decide_tensorboard_dir
from entrypoint.jobreport.live.status_line import FIELDS, RankNow, build_status_line, parse_status_line

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

HOSTILE_TEXT = "r\ud800 \x1b[31m\n\t/../x"


# --- the status line -------------------------------------------------------------------------------


def test_the_status_line_has_every_field_in_order_and_parses_back():
    ranks = [RankNow(0, 120, 50.0, 40.0), RankNow(1, 121, 52.0, 41.0), RankNow(2, 119, 51.0, 58.0)]
    line = build_status_line(3723.4, ranks, [80, 90], [1000.0, 2000.0], 1800.2)
    assert line == ("BYOC-STATUS elapsed_s 3723 steps 121 step_ms 51.0 slowest_rank 2 slowest_pct 43 "
                    "gpu_util_pct 85 gpu_mem_mb 3000 capacity_left_s 1800")
    assert parse_status_line("[entrypoint] " + line) == dict(zip(FIELDS, line.split()[2::2]))


def test_unknown_and_hostile_values_are_dashes_and_never_an_extra_field():
    ranks = [RankNow(HOSTILE_TEXT, True, math.nan, math.inf), RankNow(7, 3, None, None)]
    line = build_status_line(math.nan, ranks, [math.nan, "90", None], [math.inf], None)
    fields = parse_status_line(line)
    assert fields == {"elapsed_s": "-", "steps": "3", "step_ms": "-", "slowest_rank": "-", "slowest_pct": "-",
                      "gpu_util_pct": "-", "gpu_mem_mb": "-", "capacity_left_s": "-"}
    two = [RankNow(HOSTILE_TEXT, 5, 10.0, 30.0), RankNow(1, 5, 10.0, 10.0)]
    fields = parse_status_line(build_status_line(1.0, two, [], [], None))
    assert fields["slowest_rank"] == "r___[31m__/../x" and fields["slowest_pct"] == "200"
    assert "\n" not in build_status_line(1.0, two, [], [], None)


def test_the_status_interval_off_at_zero_and_its_edges():
    assert parse_launch_settings({}).status_interval_s == 300.0
    assert parse_launch_settings({"BYOC_STATUS_INTERVAL_S": "0"}).status_interval_s == 0.0
    assert parse_launch_settings({"BYOC_STATUS_INTERVAL_S": "1"}).status_interval_s == 1.0
    assert parse_launch_settings({"BYOC_STATUS_INTERVAL_S": "86400"}).status_interval_s == 86400.0
    for bad in ("0.5", "86401", "nan", "-1", "x"):
        with pytest.raises(JobDefinitionError):
            parse_launch_settings({"BYOC_STATUS_INTERVAL_S": bad})
    assert parse_launch_settings({"BYOC_TENSORBOARD": "1"}).tensorboard is True
    assert parse_launch_settings({}).tensorboard is None


@pytest.mark.parametrize("tb, live_s, status_s, worker, expected", [
    (None, 10.0, 300.0, False, 300.0), (None, 10.0, 300.0, True, 300.0), ("/tb", 10.0, 300.0, False, 10.0),
    ("/tb", 10.0, 300.0, True, 10.0), ("/tb", 10.0, 0.0, True, 10.0), (None, 10.0, 0.0, False, None),
    (None, 10.0, 0.0, True, None), ("/tb", 10.0, 2.0, False, 2.0)])
def test_how_often_the_live_thread_works(tb, live_s, status_s, worker, expected):
    assert decide_tick_s(tb, live_s, status_s, worker) == expected


@pytest.mark.parametrize("switch, configured, expected", [
    (None, None, None), (None, "/opt/ml/output/tensorboard", "/opt/ml/output/tensorboard/byoc-job"),
    (True, None, "/default/byoc-job"), (True, "/tb", "/tb/byoc-job"), (False, "/tb", None)])
def test_our_events_go_to_a_subfolder_of_the_configured_or_default_path(switch, configured, expected):
    assert decide_tensorboard_dir(switch, configured, "/default") == expected


# --- updates: bounds and hostile figures -----------------------------------------------------------


def rank_raw(steps=10, rank="0", **series):
    base = {"step": list(range(1, steps + 1)), "step_ms": [10.0] * steps, "wait_ms": [2.0] * steps,
            "backward_ms": [3.0] * steps, "data_wait_ms": [0.0] * steps, "samples": [32] * steps}
    return {"rank": rank, "steps": steps, "ddp": False, "series": {**base, **series}}


def test_hostile_rank_figures_are_left_out_with_a_note():
    notes = Notes()
    raw = rank_raw(6, step_ms=[math.nan, math.inf, "12", True, 1e300, 11.0])
    update = build_rank_update(raw, 0, notes)
    assert [p[0] for p in update["points"]] == [6] and update["points"][0][1] == 11.0
    assert notes.seen == ["rank '0': steps whose time is not a finite number, left out"]
    assert build_rank_update({**raw, "series": {"step": "x"}}, 0, notes) is None
    assert build_rank_update({"rank": None, "series": {}}, 0, notes) is None
    assert build_rank_update(rank_raw(3, wait_ms=[math.nan, "x", None]), 0, Notes())["points"][0][2] is None


def test_a_huge_series_is_cut_to_its_newest_points():
    update = build_rank_update(rank_raw(100_000), 0, Notes())
    assert len(update["points"]) == live_update.MAX_POINTS and update["points"][-1][0] == 100_000


def test_updates_carry_only_what_is_new():
    sent, notes = {}, Notes()
    points = [{"time": 100.0 + i, "cpu_pct": 5.0} for i in range(3)]
    first = build_update("algo-2", points, [rank_raw(4)], sent, 12.5, notes)
    assert len(first["points"]) == 3 and [p[0] for p in first["ranks"][0]["points"]] == [1, 2, 3, 4]
    second = build_update("algo-2", points + [{"time": 103.0, "cpu_pct": 6.0}], [rank_raw(5)], sent, None, notes)
    assert [p["time"] for p in second["points"]] == [103.0] and [p[0] for p in second["ranks"][0]["points"]] == [5]


@pytest.mark.parametrize("slack", [-1, 0, 1])
def test_an_update_fits_its_limit_just_under_at_and_over(slack):
    update = build_update("algo-2", [{"time": float(i), "cpu_pct": 1.0} for i in range(200)], [rank_raw(200)], {},
                          None, Notes())
    whole = fit_update(update, 10**9)
    limit = len(json.dumps(whole)) + slack
    text = fit_update(update, limit)
    assert len(json.dumps(text)) <= limit
    kept = json.loads(text)
    if slack >= 0:
        assert kept == json.loads(whole)
    else:  # cut: the newest kept
        assert 0 < len(kept["points"]) < 200 and kept["points"][-1]["time"] == 199.0
    tiny = json.loads(fit_update(update, 100))
    assert tiny["points"] == [] and tiny["ranks"] == []


@pytest.mark.parametrize("text", ["", "not json", "[]", '{"host": "algo-3"}', "[" * 100000,
                                  '{"host": "algo-2", "points": 5, "ranks": {"a": 1}}'])
def test_a_workers_update_that_is_not_one_is_refused_or_emptied(text):
    parsed = parse_update(text, "algo-2", Notes())
    assert parsed is None or (parsed["points"] == [] and parsed["ranks"] == [])


def test_a_workers_hostile_numbers_are_left_out():
    notes = Notes()
    text = json.dumps({"host": "algo-2", "samples_per_s": "many",
                       "points": [{"time": 5.0, "cpu_pct": "NaN"}, {"time": "x"}, {"time": 6.0, "cpu_pct": 3.0}],
                       "ranks": [{"rank": "1", "steps": 9, "ddp": False,
                                  "points": [[1, 1e308 * 10, 0, 0, 0, 0], [2, 5.0, 1.0, 0, 0, 0], [3, 1]]}]})
    parsed = parse_update(text.replace('"NaN"', "NaN"), "algo-2", notes)
    assert [p["time"] for p in parsed["points"]] == [5.0, 6.0] and parsed["samples_per_s"] is None
    assert [p[0] for p in parsed["ranks"][0]["points"]] == [2]
    view = LiveView(0.0, notes)
    scalars, _ = view.take(parsed)
    assert all(math.isfinite(v) for _, v, _, _ in scalars)
    assert "host algo-2: a cpu_pct value that is not a finite number, left out" in notes.seen


def test_notes_are_said_once_and_bounded():
    notes = Notes()
    for i in range(100):
        notes.add(f"note {i % 30}")
    assert len(notes.seen) == live_update.MAX_NOTES


# --- the view: tags, compute, stragglers ----------------------------------------------------------


def test_tags_group_by_host_and_rank():
    view = LiveView(100.0, Notes())
    update = {"host": "algo-1", "samples_per_s": 99.0, "ranks": [build_rank_update(rank_raw(3, rank="3"), 0, Notes())],
              "points": [{"time": 102.0, "cpu_pct": 50.0, "gpu_util_pct": [80.0, 90.0], "neuron_util_pct": [1.0]}]}
    scalars, _ = view.take(update)
    tags = {t for t, _, _, _ in scalars}
    assert {"host/algo-1/cpu_pct", "host/algo-1/gpu0_util_pct", "host/algo-1/gpu1_util_pct",
            "host/algo-1/neuron_util_pct0", "host/algo-1/samples_per_s", "rank/3/step_ms", "rank/3/compute_ms",
            "rank/3/wait_ms", "rank/3/backward_ms", "rank/3/data_wait_ms", "rank/3/samples_per_s"} == tags
    assert {s for t, _, s, _ in scalars if t.startswith("host/")} == {2}
    assert sorted(s for t, _, s, _ in scalars if t == "rank/3/step_ms") == [1, 2, 3]
    assert build_tag_part(HOSTILE_TEXT) == "r____31m___.._x"


@pytest.mark.parametrize("ranks, most", [(0, 16), (1, 16), (10, 16), (11, 15), (166, 1), (167, 1), (10_000, 1)])
def test_rank_points_a_tick_are_bounded_by_the_job_size(ranks, most):
    assert live_view.decide_points_per_rank(ranks) == most


@pytest.mark.parametrize("count", [15, 16, 17, 1000])
def test_a_ticks_rank_points_are_merged_just_over_their_bound(count):
    points = [(step, {"step_ms": float(step)} if step % 5 else {"step_ms": float(step), "data_wait_ms": 1.0})
              for step in range(1, count + 1)]
    merged = live_view.build_merged(points, 16)
    assert len(merged) <= 16 and merged[-1][0] == count
    if count <= 16:
        assert merged == points
    else:  # the means of consecutive steps, at each group's last step
        size = -(-count // 16)
        assert merged[0] == (size, {"step_ms": (1 + size) / 2, **({"data_wait_ms": 1.0} if size >= 5 else {})})


def test_ddp_compute_takes_the_backward_beyond_the_shortest():
    assert build_rank_values([5, 50.0, None, 30.0, None, 0], True, 10.0) == {
        "step_ms": 50.0, "wait_ms": 20.0, "backward_ms": 30.0, "compute_ms": 30.0}
    assert build_rank_values([5, 50.0, 5.0, 30.0, 1.0, 10], False, 10.0)["compute_ms"] == 45.0


EDGE_VALUES = [None, 0.0, -0.0, 1.0, -5.0, 0.0004, 0.0005, 1e12, -1e12, 1e12 + 1, float("nan"), float("inf"),
               -float("inf"), 480.123456]


@pytest.mark.parametrize("ddp", [False, True])
@pytest.mark.parametrize("shortest", [None, 10.0])
def test_a_ranks_times_are_what_its_scalars_say_at_every_edge(ddp, shortest):
    """build_rank_times (what a large view keeps of every rank) gives the step and compute of
    build_rank_values (what it draws), for every pair of edge values: NaN, the infinities, the
    bound of 1e12 and just over, rounding at the third decimal."""
    for step_ms in [v for v in EDGE_VALUES if v is not None and live_update.finite(v) is not None]:
        for wait_ms in EDGE_VALUES:
            for backward_ms in (None, 30.0, 1e12):
                point = [5, step_ms, wait_ms, backward_ms, None, 0]
                values = build_rank_values(point, ddp, shortest)
                assert live_view.build_rank_times(point, ddp, shortest) == (values.get("step_ms"),
                                                                            values.get("compute_ms")), point


@pytest.mark.parametrize("values", [[1.0], [2.0, 1.0], [3.0, 1.0, 2.0], [0.1, 0.2, 0.3, 0.4], [5.0] * 64,
                                    [float(i % 7) for i in range(63)], [1, 2, 3, 4]])
def test_the_views_median_is_statistics_median(values):
    import statistics
    from collections import deque

    assert live_view.median(deque(values, maxlen=64)) == statistics.median(values)


def test_a_slow_rank_is_named_live_once_it_has_enough_steps():
    view = LiveView(0.0, Notes())
    fast = build_rank_update(rank_raw(10, rank="0"), 0, Notes())
    slow = build_rank_update(rank_raw(10, rank="1", step_ms=[30.0] * 10), 0, Notes())
    _, texts = view.take({"host": "algo-1", "points": [{"time": 1.0}], "ranks": [fast, slow], "samples_per_s": None})
    assert [t[0] for t in texts] == ["job/stragglers"] and texts[0][1].startswith("rank 1 on algo-1: compute 28 ms")
    _, again = view.take({"host": "algo-1", "points": [], "ranks": [], "samples_per_s": None})
    assert again == []  # said once, until it changes
    assert [r.rank for r in view.ranks_now()] == ["0", "1"]


# --- the events file: real folders ---------------------------------------------------------------

def read_scalars(folder):
    loader = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator",
                                 reason="the test extra's tensorboard (not in the image, where these tests also run)")
    acc = loader.EventAccumulator(str(folder))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_the_events_read_back_with_tensorboards_own_loader(tmp_path):
    logged = []
    events = tb_events.EventsFile(str(tmp_path / "byoc-job"), logged.append)
    assert events.write([("rank/0/step_ms", 12.5, 1, 100.0), ("rank/0/step_ms", 13.0, 2, 101.0)],
                        [("job/stragglers", HOSTILE_TEXT, 1, 100.0)])
    events.close()
    assert read_scalars(tmp_path / "byoc-job") == {"rank/0/step_ms": [(1, 12.5), (2, 13.0)]}
    assert logged == []


def test_the_scalars_of_one_moment_share_an_event_and_each_reads_back(tmp_path):
    """A tick's scalars at one (step, wall time) go in one event (a merged summary); each tag
    reads back with its own value, and one the writer cannot hold is left out of its event."""
    events = tb_events.EventsFile(str(tmp_path / "byoc-job"), lambda text: None)
    scalars = [(f"host/algo-{h}/cpu_pct", float(h), 7, 100.0) for h in range(1, 301)] + \
        [(f"host/algo-{h}/cpu_pct", float(h) + 0.5, 8, 101.0) for h in range(1, 301)] + \
        [("job/step_ms/p50", float("inf"), 8, 101.0)]
    assert events.write(scalars, [])
    events.close()
    assert events.written == 2 and events.left_out == 1
    read = read_scalars(tmp_path / "byoc-job")
    assert read == {f"host/algo-{h}/cpu_pct": [(7, float(h)), (8, float(h) + 0.5)] for h in range(1, 301)}


def test_a_folder_that_cannot_be_made_is_a_note_and_no_error(tmp_path):
    (tmp_path / "file").write_text("x")
    logged = []
    events = tb_events.EventsFile(str(tmp_path / "file" / "byoc-job"), logged.append)
    assert not events.write([("a", 1.0, 1, 1.0)], [])
    assert not events.write([("a", 1.0, 2, 2.0)], [])  # and it stops trying
    assert len(logged) == 1 and "the job goes on without them" in logged[0]


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


@pytest.fixture
def small_tmpfs(tmp_path):
    mount = tmp_path / "mnt"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


@needs_root
def test_a_full_folder_is_a_note_and_no_error(small_tmpfs):
    logged = []
    events = tb_events.EventsFile(str(small_tmpfs / "byoc-job"), logged.append)
    big = [(f"host/algo-1/t{i}", float(i), i, 1.0) for i in range(2000)]
    assert not events.write(big, [])
    assert len(logged) == 1 and "No space left on device" in logged[0]


@needs_root
def test_a_read_only_folder_is_a_note_and_no_error(small_tmpfs):
    subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], check=True)
    logged = []
    assert not tb_events.EventsFile(str(small_tmpfs / "byoc-job"), logged.append).write([("a", 1.0, 1, 1.0)], [])
    assert len(logged) == 1 and "Read-only file system" in logged[0]


# --- the word on the job port ----------------------------------------------------------------------


def test_a_workers_live_figures_reach_the_leaders_port_signed_and_a_replay_does_not(tmp_path):
    import socket as sockets

    from entrypoint.hosts import job_port

    with sockets.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    from entrypoint.loop import HostLoop

    key, loop, got, refused = "ab" * 32, HostLoop(), [], []
    loop.on({job_port.HostLive: got.append, job_port.Refused: lambda event: refused.append(event.why)})
    listener = job_port.JobPort(port, loop.post, job_key=key)
    try:
        text = fit_update(build_update("algo-2", [{"time": 1.0, "cpu_pct": 2.0}], [], {}, None, Notes()), 16000)
        sent = job_port.send_live_figures("127.0.0.1", port, key, "algo-2", text)
        loop.wait(lambda: bool(got), time.monotonic() + 60)
        assert got == [job_port.HostLive("algo-2", text, "127.0.0.1")]
        assert sent > len(text)  # the bytes of the signed line, counted for the traffic
        line = job_port.build_signed_line(key, job_port.build_record(job_port.HostLive("algo-2", text), 1e10))
        for _ in range(2):  # the same signed line twice: the second is a replay
            with sockets.create_connection(("127.0.0.1", port)) as conn:
                conn.sendall(line.encode())
        loop.wait(lambda: bool(refused) and len(got) == 2, time.monotonic() + 60)
        assert refused == ["received before (a replay)"] and len(got) == 2
        assert job_port.send_live_figures("127.0.0.1", port, "not hex", "algo-2", text) == 0
    finally:
        listener.close()


def test_the_scripts_last_throughput_is_written_even_without_a_new_host_point():
    """The script's last samples/s line often comes after the host's last sample: the final
    tick has no new point, and the figure must still reach TensorBoard, once."""
    view = LiveView(0.0, Notes())

    def samples(update):
        return [v for tag, v, _, _ in view.take(update)[0] if tag.endswith("/samples_per_s") and "host/" in tag]

    assert samples({"host": "algo-1", "points": [{"time": 1.0}], "ranks": [], "samples_per_s": None}) == []
    assert samples({"host": "algo-1", "points": [], "ranks": [], "samples_per_s": 1234.0}) == [1234.0]
    assert samples({"host": "algo-1", "points": [], "ranks": [], "samples_per_s": 1234.0}) == []  # said already
    assert samples({"host": "algo-1", "points": [{"time": 2.0}], "ranks": [], "samples_per_s": 1234.0}) == [1234.0]

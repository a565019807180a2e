"""The job report's page (entrypoint/jobreport/html.py): one self-contained HTML file.

Pure-function tests on the edges a report can have (no ranks, empty or gappy series, a single
point, all-equal values, missing keys, 64 ranks, hostile strings), and one real headless
browser (Debian's chromium, installed by scripts/bootstrap.sh) that screenshots the page and
looks at its pixels: the plots must be drawn, not just the text.
"""

from __future__ import annotations

import copy
import math
import re
import shutil
import struct
import subprocess
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entrypoint.jobreport.html import (MAX_POINTS, PALETTE, build_colours, build_report_html, build_tick_labels,
                                       build_ticks)

START = 1764130000.0
SVG_NAMESPACE = "http://www.w3.org/2000/svg"
STRAGGLER_LINE = "rank 3 on algo-2: compute 52 ms a step, median 37 ms (+41%)"
PHASES = (("entrypoint start", 0.0), ("job read", 0.2), ("hosts resolved", 0.5), ("peers ready", 1.5),
          ("processes started", 2.0), ("first training step", 9.0), ("end", 88.0))
# Control characters HTML forbids (C0 but tab, newline, CR and C1): none may reach the page.
RAW_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def wave(i: int, base: float, swing: float, period: float = 7.0) -> float:
    """A deterministic wiggle: the plots get lines that move, with no random generator."""
    return base + swing * math.sin(i / period * 2 * math.pi) * math.cos(i / 3.1)


def host_series(samples: int, gpus: int, offset: float = 0.0) -> dict:
    series = {
        "time": [START + offset + i for i in range(samples)],
        "cpu_pct": [wave(i, 80 if i > 9 else 25, 8) for i in range(samples)],
        "tree_cpu_pct": [wave(i, 160 if i > 9 else 30, 10, 5) for i in range(samples)],
        "core_pct": [[wave(i, 70, 25, 3), wave(i, 85, 14, 4)] for i in range(samples)],
        "tree_rss_mb": [300 + 3 * i for i in range(samples)],
        "cgroup_mb": [800 + 3 * i for i in range(samples)],
        "net_rx_mbps": [wave(i, 15, 12, 3) for i in range(samples)],
        "net_tx_mbps": [wave(i, 14, 12, 4) for i in range(samples)],
        "disk_read_mbps": [wave(i, 2.5, 2.4, 5) for i in range(samples)],
        "disk_write_mbps": [wave(i, 1.0, 0.9, 6) for i in range(samples)],
    }
    if gpus:
        series["gpu_util_pct"] = [[wave(i + 3 * g, 55, 44, 4 + g) for g in range(gpus)] for i in range(samples)]
        series["gpu_mem_mb"] = [[10000 + 2000 * g + i for g in range(gpus)] for i in range(samples)]
        series["gpu_power_w"] = [[wave(i, 250 - 40 * g, 45 * (1 - g), 5) for g in range(gpus)] for i in range(samples)]
    return series


def rank_entry(rank: int, host: str, points: int = 200, compute: float = 37.0) -> dict:
    steps = [10 * i for i in range(points)]
    return {"rank": rank, "host": host, "local_rank": rank % 2, "steps": 10 * points, "step_ms": 55.0,
            "compute_ms": compute, "wait_ms": 55.0 - compute, "data_wait_ms": None,
            "compute_source": "step minus collectives", "samples_per_s": None,
            "series": {"step": steps,
                       "step_ms": [wave(i + rank, 55.5, 1.0, 6) for i in range(points)],
                       "compute_ms": [wave(i + rank, compute + 1.5, 1.2, 5) for i in range(points)]}}


def sample_report() -> dict:
    """Like /tmp/r24/sample-report.json: 2 hosts (the first with 2 GPUs), 4 ranks, rank 3 a
    straggler, each host's phases, a note."""
    hosts = ["algo-1", "algo-2"]
    return {
        "version": 1,
        "job": {"what": "torchrun on 2 host(s)", "leader": "algo-1", "hosts": hosts, "exit_code": 0,
                "started": START, "ended": START + 88.0, "framework": "pytorch"},
        "phases": [{"host": h, "name": name, "time": START + t + 0.4 * n}
                   for n, h in enumerate(hosts) for name, t in PHASES],
        "hosts": {"algo-1": {"status": "reported", "interval_s": 1.0, "cores": 2, "sampler_cpu_s": 0.21,
                             "series": host_series(90, gpus=2)},
                  "algo-2": {"status": "reported", "interval_s": 1.0, "cores": 2, "sampler_cpu_s": 0.21,
                             "series": host_series(90, gpus=0, offset=0.4)}},
        "ranks": [rank_entry(0, "algo-1"), rank_entry(1, "algo-1"), rank_entry(2, "algo-2"),
                  rank_entry(3, "algo-2", compute=52.0)],
        "stragglers": [{"kind": "rank", "rank": 3, "host": "algo-2", "compute_ms": 52.0, "median_ms": 37.0,
                        "excess_pct": 41, "line": STRAGGLER_LINE}],
        "notes": ["host algo-3's figures did not arrive"],
    }


def svg_count(page: str) -> int:
    return page.count("<svg ")


def assert_self_contained_text(page: str) -> None:
    """Nothing fetched or run, and text any writer can encode as UTF-8."""
    page.encode("utf-8")  # strict: a lone surrogate raises here
    assert "<script" not in page.lower()
    assert set(re.findall(r"https?://[^\s\"'<>)]*", page)) <= {SVG_NAMESPACE}
    for fetcher in ("<link", "<img", "<iframe", "@import", "url(", " src=", " href="):
        assert fetcher not in page.lower(), fetcher
    assert not RAW_CONTROL.search(page)


def path_points(page: str) -> list[int]:
    """The number of points of each drawn line."""
    return [d.count("M") + d.count("L") for d in re.findall(r'<path d="([^"]*)"', page)]


# ------------------------------------------------------------------------- the whole page

def test_the_sample_report_has_a_plot_per_metric_and_step_series():
    page = build_report_html(sample_report())
    # Step and compute time; algo-1: CPU, memory, 3 GPU, network, disk; algo-2: the 4 without GPU.
    assert svg_count(page) == 2 + 7 + 4
    titles = re.findall(r"<figcaption><b>([^<]*)</b>", page)
    assert titles[:2] == ["Step time per rank", "Compute time per rank"]
    assert titles.count("CPU") == 2 and titles.count("GPU power") == 1
    assert "succeeded: exit code 0" in page and "88.0 s" in page
    assert "<li>host algo-3&#x27;s figures did not arrive</li>" in page
    for legend in ("rank 0 (algo-1)", "GPU 0", "GPU 1", "received", "sent"):
        assert legend in page
    # The straggler stands out in each legend, in its line's colour (red, drawn last and thick).
    assert page.count('<li class="slow"><i style="background:#d62728"></i>rank 3 (algo-2)</li>') == 2
    step_svg = re.findall(r"<svg .*?</svg>", page)[0]
    assert re.findall(r'<path d="[^"]*" stroke="(#[0-9a-f]{6})" stroke-width="([0-9.]+)"', step_svg)[-1] == (
        "#d62728", "2.6")
    assert_self_contained_text(page)


def test_stragglers_come_first_in_a_highlighted_box_and_their_rows_are_marked():
    page = build_report_html(sample_report())
    box = page.index('<section class="stragglers">')
    assert box < page.index('<table class="ranks">') < page.index("<svg ")
    assert f"<li>{STRAGGLER_LINE}</li>" in page[box:]
    slow_rows = re.findall(r'<tr class="slow">(.*?)</tr>', page)
    assert len(slow_rows) == 1 and slow_rows[0].startswith('<td class="txt">3</td><td class="txt">algo-2</td>')


def test_without_stragglers_the_page_says_no_one_stood_out():
    report = sample_report()
    report["stragglers"] = []
    page = build_report_html(report)
    assert "No rank or host stood out" in page
    assert 'class="stragglers"' not in page and 'class="slow"' not in page


def test_the_rank_table_has_every_column_and_leaves_unknowns_blank():
    page = build_report_html(sample_report())
    head = re.findall(r"<th>([^<]*)</th>", page)
    assert head == ["rank", "host", "steps", "step ms", "compute ms", "wait ms", "data-wait ms", "samples/s",
                    "compute source"]
    first = re.search(r"<tbody><tr>(.*?)</tr>", page).group(1)
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", first)
    assert cells == ["0", "algo-1", "2,000", "55.0", "37.0", "18.0", "", "", "step minus collectives"]


def test_a_failed_job_says_so_with_its_exit_code():
    report = sample_report()
    report["job"]["exit_code"] = 137
    page = build_report_html(report)
    assert '<span class="badge fail">failed: exit code 137</span>' in page
    assert "succeeded" not in page


def test_each_phase_is_a_line_on_every_timeline_of_its_host_and_in_its_key():
    report = sample_report()
    report["ranks"] = []
    page = build_report_html(report)
    # 7 phases a host, on each of algo-1's 7 timelines and algo-2's 4.
    assert page.count('class="phase"') == 7 * 7 + 7 * 4
    assert page.count("<b>6</b> first training step +9.0 s") == 1  # algo-1's key
    assert page.count("<b>6</b> first training step +9.4 s") == 1  # algo-2's, 0.4 s later
    # The five phases of the first two seconds share one label rather than overprinting.
    assert page.count('class="pl">1\u20135</text>') == 11


def test_timelines_share_the_jobs_time_axis():
    page = build_report_html(sample_report())
    # Every timeline spans 0..88 s: the same last tick (80) and axis title on each.
    timelines = [s for s in re.findall(r"<svg .*?</svg>", page) if "time since job start (s)" in s]
    assert len(timelines) == 11
    assert all('class="xt">80</text>' in s and 'class="xt">100</text>' not in s for s in timelines)


# ----------------------------------------------------------------------------- the edges

def test_no_ranks_says_host_figures_only():
    report = sample_report()
    report["ranks"], report["stragglers"] = [], []
    report["job"]["framework"] = "none"
    page = build_report_html(report)
    assert page.count("No PyTorch step figures: host figures only.") == 1
    assert svg_count(page) == 7 + 4 and "<table" not in page and "Step times" not in page


def test_a_missing_host_gets_a_panel_saying_its_figures_did_not_arrive():
    report = sample_report()
    report["hosts"]["algo-2"] = {"status": "missing"}
    report["job"]["hosts"].append("algo-3")  # named by the job, absent from "hosts"
    page = build_report_html(report)
    assert page.count('<div class="host missing">') == 2
    assert page.count("The figures of this host did not arrive") == 2
    assert svg_count(page) == 2 + 7


@pytest.mark.parametrize("report", [{}, {"version": 1}, {"job": None, "hosts": [], "ranks": "x", "phases": 3},
                                    {"job": {"hosts": ["a"]}, "hosts": {"a": {}}},
                                    {"job": {"hosts": "algo-1", "exit_code": True, "started": "x"}}])
def test_a_report_short_of_keys_or_of_the_wrong_shape_still_renders(report):
    page = build_report_html(report)
    assert page.startswith("<!DOCTYPE html>") and page.endswith("</html>\n")
    assert "exit code unknown" in page
    assert_self_contained_text(page)


def test_values_of_the_wrong_type_anywhere_are_left_out_not_raised_on():
    report = sample_report()
    report["phases"][0]["name"] = ["entrypoint start"]  # unhashable where a name belongs
    report["phases"][1]["time"] = "soon"
    report["ranks"][0]["rank"] = [0]
    report["ranks"][1]["series"] = {"step": "x", "step_ms": {"a": 1}, "compute_ms": None}
    report["ranks"][2]["steps"] = "many"
    report["stragglers"].append({"kind": "rank", "rank": {"r": 1}, "host": None})
    series = report["hosts"]["algo-1"]["series"]
    series["cpu_pct"][5:8] = ["12", True, [3]]
    series["gpu_util_pct"][3] = 7  # a number where a list of GPUs belongs
    series["core_pct"] = None
    report["hosts"]["algo-2"]["series"] = ["not", "a", "mapping"]
    page = build_report_html(report)
    assert_self_contained_text(page)
    assert "<td class=\"txt\">[0]</td>" in page and "<td class=\"num\">many</td>" in page
    assert svg_count(page) == 2 + 7  # algo-2's series unreadable: its panel says no samples
    assert "No samples recorded." in page


def test_empty_series_draw_no_plot():
    report = sample_report()
    report["hosts"]["algo-2"]["series"] = {key: [] for key in report["hosts"]["algo-2"]["series"]}
    for rank in report["ranks"]:
        rank["series"] = {"step": [], "step_ms": [], "compute_ms": []}
    page = build_report_html(report)
    assert "No samples recorded." in page and "The ranks recorded no step times." in page
    assert svg_count(page) == 7  # algo-1's timelines only


def test_a_single_point_is_drawn_as_a_dot():
    report = sample_report()
    report["job"]["hosts"] = ["algo-2"]
    del report["hosts"]["algo-1"]
    series = report["hosts"]["algo-2"]["series"]
    for key in series:
        series[key] = series[key][:1]
    report["ranks"] = [rank_entry(0, "algo-2", points=1)]
    page = build_report_html(report)
    assert svg_count(page) == 2 + 4
    # Machine, tree, busiest core, RSS, cgroup, rx, tx, read, write; step and compute time.
    assert page.count("<circle ") == 9 + 2
    assert "<path " not in page


def test_nulls_inside_a_series_leave_gaps():
    report = sample_report()
    cpu = report["hosts"]["algo-1"]["series"]["cpu_pct"]
    cpu[10:20] = [None] * 10
    cpu[40] = None
    cpu[60] = float("nan")  # not JSON, but a writer's bug must not break the page either
    report["hosts"]["algo-1"]["series"]["cgroup_mb"] = [None] * 90  # cgroup unknown
    page = build_report_html(report)
    cpu_svg = re.findall(r"<svg .*?</svg>", page)[2]
    machine = re.findall(r'<path d="([^"]*)" stroke="#1f77b4"', cpu_svg)[0]
    assert machine.count("M") == 4  # 0-9, 20-39, 41-59, 61-89
    assert "nan" not in page.lower().replace("nanoseconds", "")
    # A line with no value at all is not drawn; its chart keeps the other line.
    memory_svg = re.findall(r"<svg .*?</svg>", page)[3]
    assert memory_svg.count("<path ") == 1
    assert "container (cgroup) (no figures)</li>" in page


def test_all_equal_and_all_zero_values_divide_by_nothing():
    report = sample_report()
    series = report["hosts"]["algo-1"]["series"]
    for key in ("cpu_pct", "tree_cpu_pct", "net_rx_mbps", "net_tx_mbps"):
        series[key] = [0.0] * 90
    series["tree_rss_mb"] = series["cgroup_mb"] = [512] * 90
    for rank in report["ranks"]:
        rank["series"]["step_ms"] = [55.0] * 200
        rank["series"]["step"] = [7] * 200  # every point on one step
    page = build_report_html(report)
    assert svg_count(page) == 13
    assert "inf" not in page.lower().replace("info", "")
    assert_self_contained_text(page)


def test_a_long_series_is_downsampled_but_keeps_its_spike():
    report = sample_report()
    samples = 100_000
    report["hosts"]["algo-2"]["series"] = host_series(samples, gpus=0)
    report["hosts"]["algo-2"]["series"]["disk_write_mbps"][54_321] = 900.0
    report["job"]["ended"] = START + samples
    page = build_report_html(report)
    assert max(path_points(page)) <= MAX_POINTS
    assert len(page.encode()) < 1_000_000
    # The spike sets the disk chart's scale: its top tick is 1,000 MB/s.
    disk_svg = [s for s in re.findall(r"<svg .*?</svg>", page) if 'aria-label="Disk"' in s][-1]
    assert 'class="yt">1,000</text>' in disk_svg
    assert "time since job start (h)" in page  # 100,000 s: hours on the axis


def test_sixty_four_ranks_get_their_own_colours_and_a_readable_legend():
    report = sample_report()
    hosts = [f"algo-{h}" for h in range(1, 9)]
    report["job"]["hosts"] = hosts
    report["hosts"] = {h: {"status": "reported", "cores": 96, "series": host_series(30, gpus=8)} for h in hosts}
    report["ranks"] = [rank_entry(r, hosts[r // 8], points=50) for r in range(64)]
    page = build_report_html(report)
    step_figure = page[page.index("Step time per rank"):page.index("Compute time per rank")]
    assert '<ul class="legend many">' in step_figure
    entries = re.findall(r'<li(?: class="slow")?><i style="background:(#[0-9a-f]{6})"></i>([^<]*)</li>',
                         step_figure)
    assert [label for _, label in entries][:2] == ["rank 0 (algo-1)", "rank 1 (algo-1)"]
    assert entries[-1][1] == "rank 63 (algo-8)"
    assert len({colour for colour, _ in entries}) == 64
    assert len(set(build_colours(64))) == 64
    # One legend for both plots (twice 64 entries would push the second off the screen).
    assert page.count('<ul class="legend many">') == 1 and "colours as above" in page
    # The ranks' table scrolls in a box of its own.
    assert '<div class="ranks-box tall">' in page


def test_many_neuron_cores_are_drawn_as_their_min_mean_and_max():
    report = sample_report()
    report["hosts"]["algo-2"]["series"]["neuron_util_pct"] = [[(i * c) % 100 for c in range(32)] for i in range(90)]
    page = build_report_html(report)
    neuron = page[page.index("NeuronCore utilisation"):]
    neuron = neuron[:neuron.index("</svg>")]
    assert "max of 32" in neuron and "mean of 32" in neuron and "min of 32" in neuron
    assert neuron.count("<path ") == 3


HOSTILE = "<script>alert('x')</script>\udc80\x00\x1b[31m\x7f\x9b&\"é"


def test_every_string_from_the_report_is_escaped_and_the_page_is_utf8():
    report = sample_report()
    report["job"]["what"] = HOSTILE
    report["job"]["hosts"][1] = HOSTILE
    report["hosts"][HOSTILE] = report["hosts"].pop("algo-2")
    report["phases"].append({"host": HOSTILE, "name": HOSTILE, "time": START + 5})
    report["ranks"][3]["host"] = report["ranks"][3]["compute_source"] = HOSTILE
    report["stragglers"][0]["line"] = HOSTILE
    report["notes"] = [HOSTILE, 42, None]
    page = build_report_html(report)
    assert_self_contained_text(page)
    escaped = "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;?\\x00\\x1b[31m\\x7f\\x9b&amp;&quot;é"
    assert page.count(escaped) >= 8
    assert f'<section class="stragglers"><h2>Stragglers (1)</h2><ul><li>{escaped}</li>' in page


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 0x10FFFF), max_size=30).map(lambda codes: "".join(map(chr, codes))))
def test_any_text_in_any_string_field_gives_a_safe_page(text):
    report = sample_report()
    report["job"]["what"] = report["notes"][0] = report["stragglers"][0]["line"] = text
    report["ranks"][0]["host"] = report["phases"][0]["name"] = text
    report["hosts"][text] = copy.deepcopy(report["hosts"]["algo-1"])
    report["job"]["hosts"].append(text)
    assert_self_contained_text(build_report_html(report))


# ------------------------------------------------------------------------------ the scales

@pytest.mark.parametrize("lo, hi", [(0, 0), (5, 5), (0, 1e-9), (0, 88), (-3, 7), (0, 1e12), (1e9, 1e9 + 1)])
def test_ticks_are_never_fewer_than_two_nor_a_zero_span(lo, hi):
    ticks = build_ticks(lo, hi, 5, extend=True)
    assert len(ticks) >= 2 and ticks[-1] > ticks[0]
    assert ticks[0] <= lo and ticks[-1] >= hi
    assert len(build_tick_labels(ticks)) == len(ticks)


def test_an_axis_labels_all_its_ticks_one_way():
    assert build_tick_labels([0, 2500, 5000, 7500, 10000, 12500]) == ["0", "2.5k", "5.0k", "7.5k", "10.0k", "12.5k"]
    assert build_tick_labels([0.0, 0.25, 0.5]) == ["0", "0.25", "0.50"]
    assert build_tick_labels([0, 20, 40]) == ["0", "20", "40"]


# ---------------------------------------------------------------------- a real browser

def decode_png(data: bytes) -> np.ndarray:
    """The RGB pixels of an 8-bit, non-interlaced PNG (what chromium writes): its chunks by
    struct, its rows by zlib, and the five row filters undone."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, head = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"IHDR":
            head = struct.unpack(">IIBBBBB", data[pos + 8:pos + 8 + length])
        elif kind == b"IDAT":
            idat.append(data[pos + 8:pos + 8 + length])
        pos += 12 + length
    width, height, depth, colour_type, _, _, interlace = head
    assert depth == 8 and colour_type in (2, 6) and interlace == 0, head
    channels = 3 if colour_type == 2 else 4
    rows = np.frombuffer(zlib.decompress(b"".join(idat)), np.uint8).reshape(height, width * channels + 1)
    pixels = np.zeros((height, width * channels), np.int32)
    previous = np.zeros(width * channels, np.int32)
    for y in range(height):
        pixels[y] = previous = unfilter_row(rows[y, 0], rows[y, 1:].astype(np.int32), previous, channels)
    return pixels.reshape(height, width, channels)[:, :, :3].astype(np.uint8)


def unfilter_row(kind: int, row: np.ndarray, above: np.ndarray, channels: int) -> np.ndarray:
    if kind == 0:
        return row
    if kind == 1:  # Sub: a running sum along each channel
        return row.reshape(-1, channels).cumsum(axis=0).reshape(-1) & 255
    if kind == 2:  # Up
        return (row + above) & 255
    out, raw, up = [0] * len(row), row.tolist(), above.tolist()
    for i in range(len(raw)):  # Average and Paeth depend on the byte just decoded
        left = out[i - channels] if i >= channels else 0
        corner = up[i - channels] if i >= channels else 0
        if kind == 3:
            guess = (left + up[i]) >> 1
        else:
            p_left, p_up, p_corner = abs(up[i] - corner), abs(left - corner), abs(left + up[i] - 2 * corner)
            guess = left if p_left <= p_up and p_left <= p_corner else (up[i] if p_up <= p_corner else corner)
        out[i] = (raw[i] + guess) & 255
    return np.array(out, np.int32)


def pixels_near(image: np.ndarray, colour: str, tolerance: int = 40) -> int:
    target = np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)], np.int32)
    return int((np.abs(image.astype(np.int32) - target).sum(axis=2) <= tolerance).sum())


def test_chromium_draws_the_plots(tmp_path):
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("chromium is not installed: run scripts/bootstrap.sh (it installs Debian's chromium "
                    "for the tests), or apt-get install chromium")
    page = tmp_path / "index.html"
    page.write_text(build_report_html(sample_report()), encoding="utf-8")
    shot = tmp_path / "report.png"
    run = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                          "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}",
                          f"--screenshot={shot}", "--window-size=1280,2400", page.as_uri()],
                         capture_output=True, text=True, timeout=180)
    assert shot.exists(), f"chromium wrote no screenshot (exit {run.returncode}):\n{run.stderr[-3000:]}"
    image = decode_png(shot.read_bytes())
    assert image.shape == (2400, 1280, 3)
    # The lines' colours, each over many pixels (the legends' swatches alone give ~700 blue and
    # orange, ~100 green and red): blue and orange (ranks 0 and 1, every host chart's first
    # two lines), green (rank 2) and red (rank 3, the straggler, drawn thicker).
    counts = {colour: pixels_near(image, colour) for colour in PALETTE[:4]}
    least = {PALETTE[0]: 3000, PALETTE[1]: 3000, PALETTE[2]: 700, PALETTE[3]: 2000}
    assert all(counts[colour] > least[colour] for colour in least), counts
    assert pixels_near(image, "#fff6e0", 6) > 20_000  # the stragglers' box
    # Not a page of text: antialiased lines give many shades (~350 without the plots, ~2,500
    # with), and a good share of ink (1.6% without, 3.2% with).
    coarse = image.astype(np.int32) // 8  # 32 levels a channel: near shades count once
    distinct = len(np.unique(coarse[:, :, 0] << 10 | coarse[:, :, 1] << 5 | coarse[:, :, 2]))
    assert distinct > 1200, distinct
    ink = (image.astype(np.int32).sum(axis=2) < 600).mean()
    assert ink > 0.025, ink


def test_restarts_are_listed_under_the_header_with_what_each_cost():
    report = sample_report()
    report["job"]["attempts"] = 3
    report["restarts"] = [
        {"attempt": 1, "exit_code": 143, "cause": "rank 1 on algo-2: SIGKILL <killed>", "restart_s": 0.62},
        {"attempt": 2, "exit_code": 1, "cause": "h\ud800st\x1b[31m", "restart_s": None},
        {"attempt": [2], "exit_code": "x", "cause": None, "restart_s": float("nan")},  # a hand-made report.json
        "not a restart",
    ]
    page = build_report_html(report)
    assert_self_contained_text(page)
    assert "<h2>Restarts (3)</h2>" in page and "<dt>attempts</dt><dd>3</dd>" in page
    assert ("attempt 1 failed (exit code 143: rank 1 on algo-2: SIGKILL &lt;killed&gt;); the next attempt started "
            "0.6 s later") in page
    assert "no attempt started after it" in page
    assert "Restarts" not in build_report_html(sample_report())


def test_each_failures_cost_is_shaded_on_every_hosts_timeline_and_the_efficiency_is_in_the_header():
    """report.json's restarts with their cost (jobreport/build.build_failure_costs): the time
    lost, from the steps redone before the failure to the next attempt's first step, is a band
    on each host's charts; the header gives job.efficiency. Hand-made values (NaN, text) draw no band."""
    report = sample_report()
    times = report["hosts"]["algo-1"]["series"]["time"]
    failed = times[len(times) // 2]
    report["job"].update({"attempts": 3, "efficiency": 0.9512, "lost_s": 9.0, "training_s": 184.5})
    report["restarts"] = [
        {"attempt": 1, "exit_code": 137, "cause": "rank 1 on algo-2: SIGKILL", "restart_s": 1.2, "failed": failed,
         "to_first_step_s": 4.0, "steps_redone": 5, "lost_s": 9.0},
        {"attempt": 2, "exit_code": 137, "cause": "x", "restart_s": 1.0, "failed": float("nan"),
         "to_first_step_s": "soon", "steps_redone": None, "lost_s": float("inf")},
    ]
    page = build_report_html(report)
    assert_self_contained_text(page)
    assert "<dt>efficiency</dt><dd>0.951: 9.0 s of 184.5 s of training lost to failures</dd>" in page
    assert "<b>9.0 s lost</b>: its first step 4.0 s after the failure, at least 5 step(s) redone" in page
    timelines = page.count("time since job start (")  # the hosts' charts (the ranks' are by step)
    assert page.count('class="lost"') == timelines > 0  # one band a timeline: the failure with a cost
    assert "efficiency" not in build_report_html(sample_report()).split("</header>")[0]

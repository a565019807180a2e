"""The job report of a large job (issue 50, item 4): 256 hosts × 8 ranks with the figures'
real shape and size (tests/support/big_report.py). The first screen names the slowest ranks
and hosts and the distribution of step times; the tables are top-N with the rest counted; the
step charts are per group of hosts; the page is at most 3 MB; report.json keeps every rank.
A small job's page is the page it was (the limits: just under, at and over each).
jobreport/page.py chooses; the pages: jobreport/html.py (small) and jobreport/at_scale.py."""

from __future__ import annotations

import json
import random
import re
import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from support.big_report import SLOW_RANK, build_figures  # noqa: E402

from entrypoint.jobreport import at_scale  # noqa: E402
from entrypoint.jobreport.build import build_report  # noqa: E402
from entrypoint.jobreport.page import build_report_page  # noqa: E402
from entrypoint.jobreport.stragglers import decide_median_without, decide_outliers  # noqa: E402


@pytest.fixture(scope="module")
def big():
    figures = build_figures(256, 8)
    figures.pop("algo-200")  # a host whose figures never arrived
    names = tuple(f"algo-{h + 1}" for h in range(256))
    report = build_report("torchrun on 256 host(s)", names[0], names, 0, figures, [])
    return report, build_report_page(report)


def test_the_page_of_256_hosts_by_8_ranks_fits_in_3_mb_and_report_json_keeps_every_rank(big):
    report, page = big
    assert len(page.encode("utf-8")) <= 3_000_000
    assert len(report["ranks"]) == 255 * 8 and len(json.loads(json.dumps(report))["ranks"]) == 2040
    assert all(r["series"]["step_ms"] for r in report["ranks"])  # every rank's own series is kept there


def test_the_first_screen_names_the_slowest_ranks_and_hosts_and_the_spread(big):
    _, page = big
    order = [page.index(s) for s in ("<h2>Stragglers", "<h2>At a glance", "<h2>Ranks", "<h2>Step times",
                                     "<h2>Hosts")]
    assert order == sorted(order)
    glance = page[page.index("<h2>At a glance"):page.index("<h2>Ranks")]
    assert "step time (ms, 2,040 ranks)" in glance and "<th>p99</th>" in glance
    slowest = re.findall(r"<li>rank (\d+) on ([^:]+): compute", glance)
    assert slowest[0] == (str(SLOW_RANK), "algo-5") and len(slowest) == at_scale.GLANCE
    hosts = re.findall(r"<li>([^:<]+): median compute", glance)
    assert hosts[0] == "algo-86" and len(hosts) == at_scale.GLANCE  # the slow host (the third of 256)
    assert "Ranks by their step time" in glance  # the distribution, drawn
    # The stragglers' box names the worst few and folds the rest.
    box = page[page.index("<h2>Stragglers"):page.index("<h2>At a glance")]
    assert box.count("<li>") == 9 + 1 and "Stragglers (10)" in box and "<summary>5 more</summary>" in box


def test_the_tables_are_top_n_and_say_what_they_leave_out(big):
    _, page = big
    ranks = page[page.index("<h2>Ranks"):page.index("<h2>Step times")]
    rows = ranks.count("<tr")
    assert rows - 1 <= at_scale.TOP_RANKS + 9  # the header, the stragglers, the slowest
    assert re.search(r"The other [\d,]+ are in report\.json", ranks)
    hosts = page[page.index("<h2>Hosts"):]
    every = hosts[hosts.index("Every host (256)"):hosts.index("</details>")]
    assert every.count("<tr") == 257 and 'class="slowhost"><td class="txt">algo-200</td><td class="txt">missing' in every
    panels = re.findall(r'<div class="host(?: missing)?"><details open><summary>([^<]+)</summary>', hosts)
    assert "algo-86" in panels and "algo-5" in panels and "algo-200" in panels
    assert len(panels) <= at_scale.HOST_PANELS + 3


def test_the_step_charts_draw_a_line_per_group_of_hosts_and_the_worst_stragglers(big):
    _, page = big
    steps = page[page.index("<h2>Step times"):page.index("<h2>Hosts")]
    legend = steps[:steps.index("</ul>")]
    groups = re.findall(r"</i>(algo-\d+–algo-\d+): median", legend)
    assert len(groups) == at_scale.HOST_GROUPS and groups[0] == "algo-1–algo-16"
    own = re.findall(r'<li class="slow"><i[^>]*></i>rank (\d+)', legend)
    assert own[0] == str(SLOW_RANK) and len(own) == at_scale.STRAGGLER_LINES


@pytest.mark.parametrize("hosts, ranks_per_host, large", [
    (16, 4, False), (17, 1, True),  # hosts: at and over the limit
    (8, 8, False), (13, 5, True),  # ranks: 64 (at), 65 (over)
    (2, 2, False),
])
def test_the_large_page_only_above_its_limits(hosts, ranks_per_host, large):
    figures = build_figures(hosts, ranks_per_host, samples=20, steps=20)
    names = tuple(figures)
    report = build_report("job", names[0], names, 0, figures, [])
    if hosts == 13:
        report["ranks"] = report["ranks"][:65]
    page = build_report_page(report)
    assert ("<h2>At a glance" in page) is large
    assert ("Step time per rank" in page) is not large


def test_a_large_page_escapes_every_string():
    figures = build_figures(17, 1, samples=10, steps=10)
    hostile = "<script>\x1b&\"x"
    figures[hostile] = figures.pop("algo-17")
    for r in figures[hostile]["ranks"]:
        r["host"] = hostile
    names = tuple(figures)
    report = build_report("<i>what</i>", names[0], names, 0, figures, [hostile] * 30)
    page = build_report_page(report)
    assert "<script>" not in page and "<i>what" not in page and "\x1b" not in page
    assert "&lt;script&gt;\\x1b&amp;&quot;x" in page
    assert "<summary>20 more notes</summary>" in page  # 10 notes in the header, the rest folded


def test_the_median_of_the_others_is_statistics_median_without_the_list():
    rng = random.Random(7)
    for n in range(2, 60):
        values = sorted(rng.choice([rng.random() * 100, 5.0, 5.0]) for _ in range(n))
        for at in range(n):
            assert decide_median_without(values, at) == statistics.median(values[:at] + values[at + 1:])


def quadratic_outliers(values: dict, pct: float = 20.0) -> list:
    """decide_outliers as it was (a list of the others for each value): the reference."""
    found = []
    for key, value in values.items():
        others = [v for k, v in values.items() if k != key]
        if not others:
            continue
        median = statistics.median(others)
        if median <= 0 or value - median <= 1.0:
            continue
        excess = round(100 * (value - median) / median)
        if excess > pct:
            found.append((key, value, median, excess))
    return sorted(found, key=lambda f: -f[3])


@pytest.mark.parametrize("seed", range(20))
def test_the_outliers_are_the_quadratic_rules_in_one_sort(seed):
    rng = random.Random(seed)
    values = {(r, f"h{r % 5}"): rng.choice([40.0, 40.0, 52.0, rng.uniform(30, 70)]) for r in range(rng.randint(0, 40))}
    assert decide_outliers(values) == quadratic_outliers(values)


def load_png_tools():
    """test_report_html.py's PNG reader and colour count (a module of its own folder, by path)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("report_html_tests", Path(__file__).with_name("test_report_html.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.decode_png, module.pixels_near


def test_chromium_shows_the_stragglers_and_the_spread_on_the_first_screen(big, tmp_path):
    import shutil
    import subprocess

    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("chromium is not installed: run scripts/bootstrap.sh (it installs Debian's chromium)")
    _, page = big
    (tmp_path / "index.html").write_text(page, encoding="utf-8")
    shot = tmp_path / "first.png"
    run = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                          "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
                          "--window-size=1280,1000", (tmp_path / "index.html").as_uri()],
                         capture_output=True, text=True, timeout=180)
    assert shot.exists(), f"chromium wrote no screenshot (exit {run.returncode}):\n{run.stderr[-3000:]}"
    decode_png, pixels_near = load_png_tools()
    image = decode_png(shot.read_bytes())
    assert image.shape == (1000, 1280, 3)
    assert pixels_near(image, "#fff6e0", 6) > 20_000  # the stragglers' box, on the first screen
    assert pixels_near(image, "#f1f3f7", 6) > 5_000  # the percentiles' table head, on it too

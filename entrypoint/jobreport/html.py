"""The job report (report.json, version 1) as one self-contained HTML page: index.html.

The page is read where the job's output lands (an S3 download, a laptop with no network), so
it carries everything itself: inline CSS, plots as inline SVG drawn here with the standard
library, no script and nothing fetched. Every string from the report is user-influenced (host
names, notes, lines a rank printed) and is escaped; the page is always valid UTF-8 text.

Pure: build_report_html(report) -> str. It never raises on a report that is short of keys,
has empty or gappy series, or odd values: what is missing is left blank or said in words.
"""

from __future__ import annotations

import colorsys
import datetime
import html
import math
import re
from typing import NamedTuple

# More points than this in one line are bucketed (min and max of each bucket kept, so a
# spike survives): a day sampled each second would otherwise make a page of megabytes.
MAX_POINTS = 600
# Colour-blind-friendly, tell-apart-at-a-glance colours (Tableau 10) for the first lines.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
           "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
# The phases in the order a job passes them: their numbers on the timelines.
PHASE_ORDER = ("entrypoint start", "job read", "hosts resolved", "peers ready",
               "processes started", "first training step", "end")
# Above this many devices a chart shows their min, mean and max rather than a line each.
MAX_DEVICE_LINES = 8
# C0 and C1 controls but tab and newline: HTML forbids most, and a reader should see them.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_SLOW = ' class="slow"'
# Beyond this a value is a broken figure, not a measurement; kept out of the scales.
_LARGEST = 1e12


class Line(NamedTuple):
    label: str
    colour: str
    xs: list
    ys: list
    width: float = 1.6
    opacity: float = 1.0
    emphasis: bool = False  # a straggler: bold in the legend


class Chart(NamedTuple):
    title: str
    unit: str  # the y axis's unit
    lines: list
    x_range: tuple  # (lo, hi) in the x unit
    x_label: str
    phases: list = []  # (x, number) for the vertical lines
    bands: list = []  # (x from, x to) of training lost to a failure: shaded
    y_max: float = 0.0  # the least top of the y axis (100 for a percentage)
    zoom: bool = False  # the y axis may start above 0, where the values sit far above it
    width: int = 600
    height: int = 210


class Margin(NamedTuple):
    left: int = 58
    right: int = 14
    top: int = 22
    bottom: int = 38


def build_report_html(report: dict) -> str:
    """The whole page for one report.json of a job up to at_scale.LARGE_RANKS ranks and
    LARGE_HOSTS hosts (jobreport/page.py chooses): a line per rank, a panel per host. Always
    valid UTF-8 text (lone surrogates in the report become '?'), whatever the report holds."""
    report = _mapping(report)
    job = _mapping(report.get("job"))
    ranks = [r for r in _list(report.get("ranks")) if isinstance(r, dict)]
    stragglers = [s for s in _list(report.get("stragglers")) if isinstance(s, dict)]
    return build_page(report, job, [
        _render_header(job, _list(report.get("notes"))),
        _render_restarts([r for r in _list(report.get("restarts")) if isinstance(r, dict)]),
        _render_stragglers(stragglers),
        _section("Ranks", _render_rank_table(ranks, stragglers)),
        _section("Step times", _render_step_charts(ranks, stragglers)) if ranks else "",
        _section("Hosts", _render_host_panels(report, job)),
    ])


def build_page(report: dict, job: dict, sections: list) -> str:
    """The page around its sections (this small page's, or a large job's: at_scale.py)."""
    body = "\n".join([*sections, f'<footer>report.json version {_text(report.get("version", "?"))}</footer>'])
    title = _text(job.get("what") or "job report")
    page = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>Job report: {title}</title><style>{_CSS}</style></head>\n"
            f'<body><main>\n{body}\n</main></body></html>\n')
    # Belt and braces: everything went through _text, but no surrogate may reach a writer.
    return page.encode("utf-8", "replace").decode("utf-8")


# ---------------------------------------------------------------------------- the header

def _render_header(job: dict, notes: list) -> str:
    what = _text(job.get("what") or "job")
    code = job.get("exit_code")
    if isinstance(code, int) and not isinstance(code, bool):
        ok = code == 0
        badge = (f'<span class="badge {"ok" if ok else "fail"}">'
                 f'{"succeeded" if ok else "failed"}: exit code {code}</span>')
    else:
        badge = '<span class="badge unknown">exit code unknown</span>'
    hosts = [_text(h) for h in _list(job.get("hosts"))]
    started, ended = _number(job.get("started")), _number(job.get("ended"))
    facts = [
        ("hosts", f'{len(hosts)}: {", ".join(hosts)}' if hosts else "none named"),
        ("leader", _text(job.get("leader") or "")),
        ("framework", _text(job.get("framework") or "")),
        ("attempts", _text(job.get("attempts")) if job.get("attempts") is not None else ""),
        ("started", _format_epoch(started)),
        ("duration", _format_duration(ended - started) if started is not None and ended is not None else ""),
    ]
    if isinstance(job.get("attempts"), int) and job["attempts"] > 1:  # a job that never failed lost nothing
        facts.insert(4, ("efficiency", _render_efficiency(job)))
    rows = "".join(f"<dt>{k}</dt><dd>{v or '&ndash;'}</dd>" for k, v in facts)
    note_items = "".join(f"<li>{_text(n)}</li>" for n in notes)
    notes_html = f'<div class="notes"><h2>Notes</h2><ul>{note_items}</ul></div>' if notes else ""
    return (f'<header><h1>{what}</h1>{badge}<dl class="facts">{rows}</dl>'
            f"{notes_html}</header>")


def _render_efficiency(job: dict) -> str:
    """The share of the training's wall time the failures did not take (report.json's
    job.efficiency, jobreport/build.build_efficiency), with what it is made of."""
    efficiency, lost, wall = _number(job.get("efficiency")), _number(job.get("lost_s")), _number(job.get("training_s"))
    if efficiency is None:
        return "unknown (a failure's cost is not in the ranks' figures)"
    return f"{_format_number(efficiency, 3)}: {_format_number(lost)} s of {_format_number(wall)} s of training lost to failures"


def _render_restarts(restarts: list) -> str:
    """Each failed attempt the job was started again after (BYOC_MAX_RESTARTS), what the
    restart cost the launcher and what the failure cost the training (shaded on the charts);
    nothing for a job that never restarted."""
    if not restarts:
        return ""
    items = []
    for r in restarts:
        attempt, cost = r.get("attempt"), _number(r.get("restart_s"))
        after = (f"the next attempt started {_format_number(cost)} s later" if cost is not None
                 else "no attempt started after it")
        lost, to_first, redone = _number(r.get("lost_s")), _number(r.get("to_first_step_s")), _number(r.get("steps_redone"))
        if lost is not None:
            after += (f"; <b>{_format_number(lost)} s lost</b>: its first step {_format_number(to_first)} s after the "
                      f"failure" + (f", at least {_format_number(redone, 0)} step(s) redone" if redone is not None else
                                    ", steps redone unknown (the script did not say where it resumed)"))
        items.append(f"<li>attempt {_text(attempt)} failed (exit code {_text(r.get('exit_code'))}: "
                     f"{_text(r.get('cause'))}); {after}</li>")
    return f'<section class="restarts"><h2>Restarts ({len(restarts)})</h2><ul>{"".join(items)}</ul></section>'


def _render_stragglers(stragglers: list) -> str:
    """First on the page: a slow rank or host is what makes a job slow."""
    if not stragglers:
        return ('<section class="calm"><h2>Stragglers</h2><p>No rank or host stood out: '
                "every one was within the straggler margin of the median.</p></section>")
    items = "".join(f"<li>{_text(s.get('line') or _describe_straggler(s))}</li>" for s in stragglers)
    return (f'<section class="stragglers"><h2>Stragglers ({len(stragglers)})</h2>'
            f"<ul>{items}</ul></section>")


def _describe_straggler(straggler: dict) -> str:
    """A straggler without its line (an older writer): said from its figures."""
    who = f"rank {straggler.get('rank')}" if straggler.get("kind") == "rank" else "host"
    return (f"{who} on {straggler.get('host', '?')}: compute {_format_number(straggler.get('compute_ms'))} ms,"
            f" median {_format_number(straggler.get('median_ms'))} ms")


# ------------------------------------------------------------------------- the rank table

def _render_rank_table(ranks: list, stragglers: list) -> str:
    if not ranks:
        return '<p class="empty">No PyTorch step figures: host figures only.</p>'
    slow, slow_hosts = _straggler_ranks(stragglers), _straggler_hosts(stragglers)
    columns = ("rank", "host", "steps", "step ms", "compute ms", "wait ms", "data-wait ms",
               "samples/s", "compute source")
    head = "".join(f"<th>{c}</th>" for c in columns)
    rows = []
    for r in ranks:
        cells = [_text(r.get("rank", "")), _text(r.get("host", "")), _format_number(r.get("steps"), 0)]
        cells += [_format_number(r.get(k)) for k in ("step_ms", "compute_ms", "wait_ms", "data_wait_ms",
                                                      "samples_per_s")]
        cells.append(_text(r.get("compute_source") or ""))
        tds = "".join(f'<td class="{"num" if 2 <= i <= 7 else "txt"}">{c}</td>' for i, c in enumerate(cells))
        mark = (' class="slow"' if _plain(r.get("rank")) in slow else
                ' class="slowhost"' if _plain(r.get("host")) in slow_hosts else "")
        rows.append(f"<tr{mark}>{tds}</tr>")
    hint = ["Medians over the steps", "wait: in collectives"]
    hint += ["highlighted: a straggling rank"] if slow else []
    hint += ["tinted: the ranks of a straggling host"] if slow_hosts else []
    # Many ranks scroll in a box of their own: the plots stay near the top of the page.
    box = "ranks-box tall" if len(ranks) > 16 else "ranks-box"
    return (f'<div class="{box}"><table class="ranks"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div><p class="hint">{"; ".join(hint)}.</p>')


def _straggler_ranks(stragglers: list) -> set:
    """The straggling ranks, as text: a rank's number is compared as the reader sees it (and
    a report's odd value, a list, cannot break a set)."""
    return {_plain(s.get("rank")) for s in stragglers if s.get("kind") == "rank" and s.get("rank") is not None}


def _straggler_hosts(stragglers: list) -> set:
    return {_plain(s.get("host")) for s in stragglers if s.get("kind") == "host" and s.get("host") is not None}


# ------------------------------------------------------------------------- the step plots

def _render_step_charts(ranks: list, stragglers: list) -> str:
    """One line per rank, step time against the step; stragglers drawn thicker, on top."""
    if not ranks:
        return '<p class="empty">No PyTorch step figures: host figures only.</p>'
    many = len(ranks) > 12
    charts = []
    for key, title in (("step_ms", "Step time per rank"), ("compute_ms", "Compute time per rank")):
        lines, legend = build_rank_lines(ranks, key, _straggler_ranks(stragglers))
        if not any(_has_values(line.ys) for line in lines):
            if key == "step_ms":
                charts.append('<p class="empty">The ranks recorded no step times.</p>')
            continue
        x_range = _value_range([x for line in lines for x in line.xs])
        chart = Chart(title, "ms", lines, x_range, "step", width=1200, height=320, zoom=True)
        # Many ranks: one legend (64 entries twice would push the second plot off the screen).
        charts.append(render_chart(chart, legend if not (many and charts) else [], "colours as above"))
    return "\n".join(charts)


def build_rank_lines(ranks: list, key: str, slow: set) -> tuple:
    """(lines in drawing order, lines in the ranks' order for the legend): a colour per rank;
    stragglers last, thick and opaque, so they sit on top of the others where they are seen."""
    colours = build_colours(len(ranks))
    faint = 0.75 if len(ranks) > 12 else 1.0
    legend = []
    for rank, colour in zip(ranks, colours):
        series = _mapping(rank.get("series"))
        straggler = _plain(rank.get("rank")) in slow
        legend.append(Line(f"rank {_plain(rank.get('rank', '?'))} ({_plain(rank.get('host', '?'))})", colour,
                           _list(series.get("step")), _list(series.get(key)), 2.6 if straggler else 1.3,
                           1.0 if straggler else faint, straggler))
    drawn = [line for line in legend if not line.emphasis] + [line for line in legend if line.emphasis]
    return drawn, legend


# ---------------------------------------------------------------------- the host timelines

def _render_host_panels(report: dict, job: dict) -> str:
    hosts = _mapping(report.get("hosts"))
    names = [h for h in _list(job.get("hosts")) if isinstance(h, str)]
    names += [h for h in hosts if h not in names]
    if not names:
        return '<p class="empty">No host figures in this report.</p>'
    start, span = _job_window(job, hosts, _list(report.get("phases")))
    axis = build_time_axis(span)
    numbers = build_phase_numbers(_list(report.get("phases")))
    # A failure's cost as the time it took, up to the next attempt's first step: from when the
    # step that attempt resumed from was done (jobreport/build.build_failure_costs).
    bands = [((failed + to_first - lost - start) / axis[0], (failed + to_first - start) / axis[0])
             for failed, lost, to_first in ((_number(r.get("failed")), _number(r.get("lost_s")),
                                             _number(r.get("to_first_step_s")))
                                            for r in _list(report.get("restarts")) if isinstance(r, dict))
             if failed is not None and lost is not None and to_first is not None]
    panels = []
    for name in names:
        host = _mapping(hosts.get(name))
        phases = [p for p in _list(report.get("phases")) if isinstance(p, dict) and p.get("host") == name]
        panels.append(_render_host_panel(name, host, phases, numbers, start, span, axis, bands))
    return "\n".join(panels)


def _render_host_panel(name, host: dict, phases: list, numbers: dict, start: float, span: float, axis,
                       bands: list = ()) -> str:
    # <details open>: a reader folds the hosts he has seen, with no script.
    title = f"<details open><summary>{_text(name)}</summary>"
    if host.get("status") == "missing" or not host:
        return (f'<div class="host missing">{title}<p>The figures of this host did not arrive: '
                "its sampler did not report to the leader (the host may have died or been cut off)."
                "</p></details></div>")
    divisor, unit = axis
    series = _mapping(host.get("series"))
    times = [(t - start) / divisor if t is not None else None for t in map(_number, _list(series.get("time")))]
    marks = [((t - start) / divisor, _phase_number(numbers, p)) for p, t in
             ((p, _number(p.get("time"))) for p in phases) if t is not None]
    charts = [render_chart(Chart(title_, unit_, lines, (0.0, span / divisor), f"time since job start ({unit})",
                                 marks, list(bands), y_max))
              for title_, unit_, lines, y_max in build_host_charts(series, times, _number(host.get("cores")))
              if any(_has_values(line.ys) for line in lines)]
    about = _render_host_facts(host, len(times))
    key = _render_phase_key(phases, numbers, start)
    body = f'<div class="grid">{"".join(charts)}</div>' if charts else '<p class="empty">No samples recorded.</p>'
    return f'<div class="host">{title}<p class="hint">{about}</p>{key}{body}</details></div>'


def _render_host_facts(host: dict, samples: int) -> str:
    facts = [f"{samples} samples"]
    if _number(host.get("interval_s")) is not None:
        facts.append(f"every {_format_number(host.get('interval_s'), 2)} s")
    if _number(host.get("cores")) is not None:
        facts.append(f"{_format_number(host.get('cores'), 0)} cores")
    if _number(host.get("sampler_cpu_s")) is not None:
        facts.append(f"the sampler used {_format_number(host.get('sampler_cpu_s'), 2)} s of CPU")
    if _number(host.get("samples_per_s")) is not None:
        facts.append(f"the script's own lines report {_format_number(host.get('samples_per_s'), 1)} samples/s")
    return " · ".join(facts)


def build_host_charts(series: dict, times: list, cores: float | None) -> list:
    """(title, unit, lines, least y top) for each of a host's metrics; a chart whose lines hold
    no value is dropped by the caller."""
    def line(key, label, colour, scale=1.0):
        values = [v / scale if v is not None else None for v in map(_number, _list(series.get(key)))]
        return Line(label, colour, times, values)

    # The tree's % is of one core (over 100 with many): as a share of the machine it sits on
    # the machine's scale, instead of flattening it on a 96-core host.
    if cores and cores > 0:
        tree = line("tree_cpu_pct", f"job's processes (% of all {_format_number(cores, 0)} cores)", PALETTE[1], cores)
    else:
        tree = line("tree_cpu_pct", "job's processes (% of one core)", PALETTE[1])
    busiest = [max(vs) if vs else None for vs in
               ([v for v in map(_number, _list(s)) if v is not None] for s in _list(series.get("core_pct")))]
    charts = [
        ("CPU", "%", [line("cpu_pct", "machine", PALETTE[0]), tree,
                      Line("busiest core", PALETTE[7], times, busiest, 1.0)], 100.0),
        ("Memory", "MB", [line("tree_rss_mb", "job's processes (RSS)", PALETTE[0]),
                          line("cgroup_mb", "container (cgroup)", PALETTE[1])], 0.0),
    ]
    for key, title, unit, name in (("gpu_util_pct", "GPU utilisation", "%", "GPU"),
                                   ("gpu_mem_mb", "GPU memory", "MB", "GPU"),
                                   ("gpu_power_w", "GPU power", "W", "GPU"),
                                   ("neuron_util_pct", "NeuronCore utilisation", "%", "NeuronCore")):
        if key in series:
            charts.append((title, unit, build_device_lines(_list(series.get(key)), times, name),
                           100.0 if unit == "%" else 0.0))
    charts += [
        ("Network", "MB/s", [line("net_rx_mbps", "received", PALETTE[0]),
                             line("net_tx_mbps", "sent", PALETTE[1])], 0.0),
        ("Disk", "MB/s", [line("disk_read_mbps", "read", PALETTE[0]),
                          line("disk_write_mbps", "written", PALETTE[1])], 0.0),
    ]
    return charts


def build_device_lines(samples: list, times: list, name: str) -> list:
    """A line per device (GPU, NeuronCore) from per-sample lists; with many devices, their min,
    mean and max (32 NeuronCores as 32 lines would be a tangle)."""
    rows = [[_number(v) for v in _list(s)] for s in samples]
    count = max((len(r) for r in rows), default=0)
    columns = [[r[i] if i < len(r) else None for r in rows] for i in range(count)]
    if count <= MAX_DEVICE_LINES:
        return [Line(f"{name} {i}", PALETTE[i % len(PALETTE)], times, col) for i, col in enumerate(columns)]
    present = [[v for v in r if v is not None] for r in rows]
    return [Line(f"max of {count}", PALETTE[3], times, [max(p) if p else None for p in present]),
            Line(f"mean of {count}", PALETTE[0], times, [sum(p) / len(p) if p else None for p in present]),
            Line(f"min of {count}", PALETTE[2], times, [min(p) if p else None for p in present])]


def _render_phase_key(phases: list, numbers: dict, start: float) -> str:
    items = []
    for p in sorted(phases, key=lambda p: _number(p.get("time")) or 0.0):
        t = _number(p.get("time"))
        when = "" if t is None else f" {'+' if t >= start else '-'}{_format_duration(abs(t - start))}"
        items.append(f'<li><b>{_phase_number(numbers, p)}</b> {_text(p.get("name", ""))}{when}</li>')
    if not items:
        return ""
    return f'<ul class="phases"><li class="k">phases (dashed lines):</li>{"".join(items)}</ul>'


def build_phase_numbers(phases: list) -> dict:
    """Each phase's number: its place in a job's order, so that one number means one phase on
    every host; names we do not know come after, in the order they first appear."""
    numbers = {name: i + 1 for i, name in enumerate(PHASE_ORDER)}
    for p in phases:
        name = p.get("name") if isinstance(p, dict) else None
        if isinstance(name, str) and name not in numbers:
            numbers[name] = len(numbers) + 1
    return numbers


def _phase_number(numbers: dict, phase: dict) -> int:
    name = phase.get("name")
    return numbers.get(name, 0) if isinstance(name, str) else 0


def _job_window(job: dict, hosts: dict, phases: list) -> tuple:
    """(start, span) of the job in epoch seconds: from the job's start (else the first sample
    or phase) to the last of its end, samples and phases, so that a worker's later "end" is
    still drawn. The span is never zero (it divides)."""
    times = [t for h in hosts.values() for t in map(_number, _list(_mapping(_mapping(h).get("series")).get("time")))
             if t is not None]
    times += [t for t in (_number(p.get("time")) for p in phases if isinstance(p, dict)) if t is not None]
    start = _number(job.get("started"))
    end = _number(job.get("ended"))
    start = start if start is not None else (min(times) if times else 0.0)
    ends = [t for t in (end, *times) if t is not None]
    end = max(ends) if ends else start + 1.0
    return start, max(end - start, 1e-3)


def build_time_axis(span: float) -> tuple:
    """(divisor, unit) that keep a timeline's tick labels short: seconds, minutes or hours."""
    if span <= 300:
        return 1.0, "s"
    if span <= 300 * 60:
        return 60.0, "min"
    return 3600.0, "h"


# -------------------------------------------------------------------------------- one plot

def render_chart(chart: Chart, legend: list | None = None, no_legend: str = "") -> str:
    """A figure: title, legend (HTML: it wraps, and stays readable with 64 ranks) and the SVG.
    An empty legend list shows no_legend instead."""
    entries = legend if legend is not None else chart.lines
    # A line with no value (a cgroup's memory unknown) stays in the legend, saying so.
    items = "".join(f'<li{_SLOW if line.emphasis else ""}><i style="background:{line.colour}"></i>'
                    f'{_text(line.label)}{"" if _has_values(line.ys) else " (no figures)"}</li>' for line in entries)
    many = " many" if len(entries) > 12 else ""
    keyed = f'<ul class="legend{many}">{items}</ul>' if entries else f'<span class="unit">{_text(no_legend)}</span>'
    return (f'<figure><figcaption><b>{_text(chart.title)}</b> <span class="unit">({_text(chart.unit)})</span>'
            f"{keyed}</figcaption>{render_svg(chart)}</figure>")


def render_svg(chart: Chart) -> str:
    m = Margin()
    w, h = chart.width, chart.height
    plot_w, plot_h = w - m.left - m.right, h - m.top - m.bottom
    x_lo, x_hi = chart.x_range
    x_lo, x_hi = (x_lo, x_hi) if x_hi > x_lo else (x_lo - 0.5, x_lo + 0.5)
    y_ticks = build_y_ticks(chart)
    y_lo, y_hi = y_ticks[0], y_ticks[-1]

    def sx(x):
        return m.left + (x - x_lo) / (x_hi - x_lo) * plot_w

    def sy(y):
        return m.top + plot_h - (y - y_lo) / (y_hi - y_lo) * plot_h

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" role="img" '
             f'aria-label="{_text(chart.title)}">',
             f'<rect x="{m.left}" y="{m.top}" width="{plot_w}" height="{plot_h}" class="plot"/>']
    for t, label in zip(y_ticks, build_tick_labels(y_ticks)):
        parts.append(f'<line x1="{m.left}" x2="{m.left + plot_w}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" class="gl"/>'
                     f'<text x="{m.left - 6}" y="{sy(t) + 4:.1f}" class="yt">{label}</text>')
    x_ticks = [t for t in build_ticks(x_lo, x_hi, max(2, plot_w // 90)) if x_lo <= t <= x_hi]
    for t, label in zip(x_ticks, build_tick_labels(x_ticks)):
        parts.append(f'<line x1="{sx(t):.1f}" x2="{sx(t):.1f}" y1="{m.top + plot_h}" y2="{m.top + plot_h + 4}" '
                     f'class="axis"/><text x="{sx(t):.1f}" y="{m.top + plot_h + 16}" class="xt">'
                     f"{label}</text>")
    parts.append(f'<text x="{m.left + plot_w / 2:.1f}" y="{h - 4}" class="xl">{_text(chart.x_label)}</text>'
                 f'<text transform="translate(13 {m.top + plot_h / 2:.1f}) rotate(-90)" class="yl">'
                 f"{_text(chart.unit)}</text>")
    for lo, hi in chart.bands:  # a failure's cost: its failure to the next attempt's first step, and steps redone
        lo, hi = max(lo, x_lo), min(hi, x_hi)
        if hi > lo:
            parts.append(f'<rect x="{sx(lo):.1f}" y="{m.top}" width="{max(1.0, sx(hi) - sx(lo)):.1f}" '
                         f'height="{plot_h}" class="lost"><title>lost to a failure</title></rect>')
    parts += _render_phase_marks(chart.phases, sx, x_lo, x_hi, m.top, m.top + plot_h)
    for line in chart.lines:
        parts.append(render_line(line, sx, sy))
    parts.append("</svg>")
    return "".join(parts)


def build_y_ticks(chart: Chart) -> list:
    """From 0 (or the least value, if negative) to the top value, and to at least chart.y_max;
    a zoomed chart whose values all sit above half their top starts near its least value, so
    a 52 ms straggler among 37 ms ranks is not a thin band at the top of an empty plot."""
    values = [y for line in chart.lines for y in map(_number, line.ys) if y is not None]
    lo, hi = min([0.0, *values]), max([chart.y_max, *values])
    if chart.zoom and values and min(values) > max(values) / 2:
        # At least a quarter of the top in view: a jitter of 1 ms in 55 is not blown up to
        # fill the plot, which would read as a wild one.
        least, most = min(values), max(values)
        middle, half = (least + most) / 2, max(most - least, most * 0.25) * 0.65
        lo, hi = middle - half, middle + half
    return build_ticks(lo, hi, 5, extend=True)


def _render_phase_marks(phases: list, sx, x_lo: float, x_hi: float, top: float, bottom: float) -> list:
    """Dashed vertical lines with the phase's number above; phases closer than a label's width
    share one label ("1–5"), so numbers never overprint."""
    inside = sorted((x, n) for x, n in phases if x_lo <= x <= x_hi)
    groups: list[list] = []
    for x, n in inside:
        if groups and sx(x) - sx(groups[-1][0][0]) < 26:
            groups[-1].append((x, n))
        else:
            groups.append([(x, n)])
    parts = [f'<line x1="{sx(x):.1f}" x2="{sx(x):.1f}" y1="{top}" y2="{bottom}" class="phase"/>' for x, _ in inside]
    for group in groups:
        numbers = [n for _, n in group]
        run = len(numbers) > 2 and numbers == list(range(numbers[0], numbers[-1] + 1))
        label = f"{numbers[0]}\u2013{numbers[-1]}" if run else ",".join(str(n) for n in numbers)
        parts.append(f'<text x="{sx(group[0][0]):.1f}" y="{top - 6}" class="pl">{label}</text>')
    return parts


def render_line(line: Line, sx, sy) -> str:
    """One series as a path, lifting the pen at gaps (None); a point with no neighbour is a dot,
    since a path of one point draws nothing."""
    xs, ys = build_downsampled(line.xs, line.ys)
    d, dots, run = [], [], []
    for x, y in list(zip(xs, ys)) + [(None, None)]:
        if x is None or y is None:
            if len(run) == 1:
                dots.append(run[0])
            elif run:
                d.append("M" + "L".join(f"{px:.1f},{py:.1f}" for px, py in run))
            run = []
        else:
            run.append((sx(x), sy(y)))
    faint = f' stroke-opacity="{line.opacity}"' if line.opacity < 1 else ""
    path = (f'<path d="{"".join(d)}" stroke="{line.colour}" stroke-width="{line.width}"{faint} fill="none" '
            f'stroke-linejoin="round"/>' if d else "")
    return path + "".join(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{line.colour}"/>' for x, y in dots)


def build_downsampled(xs: list, ys: list) -> tuple:
    """At most MAX_POINTS points: each bucket's lowest and highest, in their order, so a spike
    (a straggling step) is still drawn. A bucket with no value stays a gap."""
    pairs = [(_number(x), _number(y)) for x, y in zip(xs, ys)]
    if len(pairs) <= MAX_POINTS:
        return [p[0] for p in pairs], [p[1] for p in pairs]
    buckets = MAX_POINTS // 2
    out = []
    for b in range(buckets):
        chunk = pairs[b * len(pairs) // buckets:(b + 1) * len(pairs) // buckets]
        present = [(i, p) for i, p in enumerate(chunk) if p[0] is not None and p[1] is not None]
        if not present:
            out.append((chunk[0][0] if chunk else None, None))
            continue
        low = min(present, key=lambda ip: ip[1][1])
        high = max(present, key=lambda ip: ip[1][1])
        out += [p for _, p in sorted({low, high})]
    return [p[0] for p in out], [p[1] for p in out]


def build_ticks(lo: float, hi: float, count: int, extend: bool = False) -> list:
    """Round tick values (1, 2, 2.5 or 5 times a power of ten) covering lo..hi; extend: the
    first and last tick enclose lo and hi (a y axis), else they lie within (an x axis).
    Never fewer than two ticks, never a zero span."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0, 1.0]
    if hi <= lo:
        # All values equal: a span around them (from 0 when they are all 0).
        lo, hi = (0.0, 1.0) if lo == 0 else (lo - abs(lo) * 0.1, hi + abs(hi) * 0.1)
    raw = (hi - lo) / max(count, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(f * magnitude for f in (1, 2, 2.5, 5, 10) if f * magnitude >= raw * (1 - 1e-9))
    first = math.floor(lo / step + 1e-9) if extend else math.ceil(lo / step - 1e-9)
    last = math.ceil(hi / step - 1e-9) if extend else math.floor(hi / step + 1e-9)
    ticks = [k * step for k in range(int(first), int(last) + 1)]
    return ticks if len(ticks) >= 2 else [lo, hi]


def build_colours(count: int) -> list:
    """A colour per line: the palette first, then hues a golden angle apart (two lightnesses),
    so 64 ranks still get 64 colours and neighbours in the legend differ."""
    if count <= len(PALETTE):
        return list(PALETTE[:count])
    colours = []
    for i in range(count):
        r, g, b = colorsys.hls_to_rgb((i * 0.618033988749895) % 1.0, 0.38 if i % 2 else 0.52, 0.72)
        colours.append(f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}")
    return colours


# ------------------------------------------------------------------------------ the values

def _number(value) -> float | None:
    """A finite, plausible number, or None (a gap): not a bool, not NaN, not 1e300."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and abs(value) <= _LARGEST else None


def _has_values(values: list) -> bool:
    return any(_number(v) is not None for v in values)


def _value_range(values: list) -> tuple:
    present = [v for v in map(_number, values) if v is not None]
    return (min(present), max(present)) if present else (0.0, 1.0)


def _mapping(value) -> dict:
    return value if isinstance(value, dict) else {}


def _list(value) -> list:
    return value if isinstance(value, list) else []


def _plain(value) -> str:
    """Any value as text a reader can see: lone surrogates as '?', control characters as
    \\xNN. Not yet escaped for HTML (_text does both)."""
    text = value if isinstance(value, str) else str(value)
    text = text.encode("utf-8", "replace").decode("utf-8")
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _text(value) -> str:
    return html.escape(_plain(value), quote=True)


def _format_number(value, digits: int = 1) -> str:
    number = _number(value)
    if number is None:
        return "" if value is None else _text(value)
    return f"{number:,.{digits}f}"


def build_tick_labels(ticks: list) -> list:
    """One format for an axis's ticks: as many decimals as the step needs, and thousands as
    "12.5k" on the whole axis once its top reaches 10,000 (a mix of "7,500" and "10k" misleads)."""
    step = ticks[1] - ticks[0] if len(ticks) > 1 and ticks[1] > ticks[0] else 1.0
    top = max(abs(t) for t in ticks)
    scale, suffix = next(((s, x) for s, x in ((1e9, "G"), (1e6, "M"), (1e3, "k")) if top >= 10 * s), (1.0, ""))
    step /= scale
    # The decimals that the step shows exactly: 0.25 needs 2, 2.5 needs 1, 5 needs 0.
    digits = next((d for d in range(0, 7) if abs(round(step, d) - step) < step * 1e-6), 6)
    return [f"{t / scale:,.{digits}f}{suffix}" if t else "0" for t in ticks]


def _format_epoch(epoch: float | None) -> str:
    if epoch is None:
        return ""
    try:
        moment = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc)
    except (OverflowError, OSError, ValueError):
        return _format_number(epoch)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def _format_duration(seconds: float) -> str:
    if seconds < 0:
        return ""
    if seconds < 90:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s"


def _section(title: str, content: str) -> str:
    return f"<section><h2>{title}</h2>{content}</section>"


_CSS = """
:root{--ink:#1d2330;--muted:#5b6475;--line:#d9dde5;--bg:#f5f6f8}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif}
main{max-width:1240px;margin:0 auto;padding:18px 20px 40px}
h1{font-size:22px;margin:0 12px 6px 0;display:inline-block}
h2{font-size:17px;margin:0 0 8px}
h3{font-size:15px;margin:0 0 4px}
header,section,.host{background:#fff;border:1px solid var(--line);border-radius:8px;padding:14px 16px;margin:0 0 14px}
section .host{border-color:#e6e8ee;margin:10px 0 0}
summary{font-size:15px;font-weight:600;cursor:pointer;margin-bottom:2px}
.missing p{margin:6px 0 0;color:#a3231b}
.badge{display:inline-block;padding:2px 10px;border-radius:12px;font-weight:600;font-size:13px;vertical-align:4px}
.badge.ok{background:#e3f4e6;color:#1b6b2a}.badge.fail{background:#fde3e1;color:#a3231b}.badge.unknown{background:#eee;color:#555}
.facts{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:8px 0 0}
.facts dt{color:var(--muted)}.facts dd{margin:0;overflow-wrap:anywhere}
.notes{margin-top:10px;padding:8px 12px;background:#f7f8fb;border-left:4px solid #8a94a8;border-radius:4px}
.notes h2{font-size:14px;margin:0 0 4px}.notes ul{margin:0;padding-left:18px}
.stragglers{background:#fff6e0;border-color:#f0b429;border-left:6px solid #f0b429}
.stragglers li{font-weight:600;overflow-wrap:anywhere}
.calm{border-left:6px solid #5bb974}.calm p{margin:0}
.empty{color:var(--muted);font-style:italic;margin:4px 0}
.hint{color:var(--muted);font-size:12.5px;margin:2px 0 6px}
table.ranks{border-collapse:collapse;width:100%;font-size:13px}
.ranks th,.ranks td{padding:4px 8px;border-bottom:1px solid #eceef2;white-space:nowrap}
.ranks th{text-align:left;background:#f1f3f7;font-weight:600}
.ranks td.num{text-align:right;font-variant-numeric:tabular-nums}
.ranks tr.slow td{background:#fff1cc;font-weight:600}.ranks tr.slowhost td{background:#fff8e8}
.ranks-box.tall{max-height:460px;overflow:auto;border:1px solid #eceef2;border-radius:4px}
.ranks th{position:sticky;top:0}
figure{margin:6px 0 8px;min-width:0}
figcaption{font-size:13px;display:flex;flex-wrap:wrap;align-items:baseline;gap:2px 10px}
figcaption .unit{color:var(--muted)}
.legend{list-style:none;margin:0;padding:0;display:flex;flex-wrap:wrap;gap:2px 12px;font-size:12px}
.legend.many{display:grid;grid-template-columns:repeat(auto-fill,minmax(150px,1fr));width:100%;gap:1px 8px;font-size:11.5px}
.legend li{white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.legend li.slow{font-weight:700;background:#fff1cc;border-radius:3px;padding:0 4px}
.legend i{display:inline-block;width:16px;height:4px;border-radius:2px;margin:0 5px 3px 0;vertical-align:middle}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(520px,1fr));gap:4px 22px}
svg{width:100%;height:auto;display:block}
svg text{font:11px system-ui,"DejaVu Sans",sans-serif;fill:#4a5263}
svg .yt{text-anchor:end}svg .xt,svg .xl{text-anchor:middle}svg .yl{text-anchor:middle}
svg .pl{text-anchor:middle;font-weight:700;fill:#6b4fa0}
svg .plot{fill:#fff;stroke:#c9ced8}
svg .gl{stroke:#eef0f4}svg .axis{stroke:#9aa2b1}
svg .phase{stroke:#6b4fa0;stroke-width:1;stroke-dasharray:4 3;opacity:.75}
svg .lost{fill:#d62728;opacity:.15}
.phases{list-style:none;padding:0;margin:0 0 6px;display:flex;flex-wrap:wrap;gap:2px 14px;font-size:12px;color:var(--muted)}
.phases b{color:#6b4fa0}.phases .k{font-style:italic}
footer{color:var(--muted);font-size:12px;text-align:right}
"""

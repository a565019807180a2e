"""The job report's page for a large job (more than LARGE_RANKS ranks or LARGE_HOSTS hosts): what
a reader of 2,048 ranks on 256 hosts needs first, within a bounded page (pure).

The small page (jobreport/html.py) draws a line per rank and a panel per host: at 256 hosts × 8
ranks that was 11 MB and 280,000 px, with the straggler off the first screen. Here:
- first, "At a glance": the distribution of the ranks' step and compute times (percentiles, and
  a chart of how many ranks take how long), the slowest ranks and the slowest hosts;
- the ranks' table: the stragglers and the slowest TOP_RANKS, the rest counted (report.json
  keeps every rank's figures);
- the step charts: a line per group of hosts (the median over its ranks at each step), at most
  HOST_GROUPS of them, and each straggling rank's own line on top;
- the hosts: a compact table of every host, then the timelines of the slowest HOST_PANELS hosts
  and of every straggling or missing one.
Every count left out is said where it is left out.
"""

from __future__ import annotations

import statistics

from entrypoint.jobreport import html
from entrypoint.jobreport.stragglers import decide_percentiles

LARGE_RANKS = 64  # up to this many the small page draws a line per rank (64 colours)
LARGE_HOSTS = 16  # and a panel per host
TOP_RANKS = 32
GLANCE = 10  # the slowest ranks and hosts named first
HOST_GROUPS = 16
HOST_PANELS = 8
PERCENTILES = (0, 10, 50, 90, 99, 100)
HISTOGRAM_BINS = 40
STRAGGLER_LINES = 5  # the worst stragglers drawn on their own over the groups' medians


# Only a large page has these (a small page stays as it was, byte for byte).
CSS = (".ataglance .glance{display:inline-block;vertical-align:top;margin:10px 36px 0 0}"
       ".glance ol{margin:0;padding-left:24px}.glance h3{margin:0 0 2px}"
       ".ataglance table.ranks{width:auto}")


def is_large(ranks: list, hosts: list) -> bool:
    return len(ranks) > LARGE_RANKS or len(hosts) > LARGE_HOSTS


def _figure(rank: dict, key: str) -> float | None:
    return html._number(rank.get(key))


def decide_slowest_ranks(ranks: list, count: int) -> list:
    """The ranks by their compute a step (else their step time), slowest first."""
    timed = [r for r in ranks if _figure(r, "compute_ms") is not None or _figure(r, "step_ms") is not None]
    return sorted(timed, key=lambda r: -(_figure(r, "compute_ms") if _figure(r, "compute_ms") is not None
                                         else _figure(r, "step_ms")))[:count]


def decide_host_medians(ranks: list) -> dict:
    """host -> the median of its ranks' compute a step (their step time where none)."""
    per_host: dict = {}
    for r in ranks:
        value = _figure(r, "compute_ms")
        value = value if value is not None else _figure(r, "step_ms")
        if value is not None:
            per_host.setdefault(html._plain(r.get("host")), []).append(value)
    return {host: statistics.median(values) for host, values in per_host.items()}


def decide_host_groups(names: list, count: int = HOST_GROUPS) -> list:
    """(label, hosts) for at most `count` groups of consecutive hosts, in the job's order."""
    size = max(1, -(-len(names) // count))
    groups = []
    for at in range(0, len(names), size):
        members = names[at:at + size]
        label = members[0] if len(members) == 1 else f"{members[0]}–{members[-1]}"
        groups.append((label, members))
    return groups


def build_group_lines(ranks: list, groups: list, key: str, slow: list) -> tuple:
    """(lines to draw, legend): per group, the median over its ranks of `key` at each step; the
    first STRAGGLER_LINES straggling ranks' (slow: their labels, worst first) own lines last,
    thick, on top."""
    slow = set(slow[:STRAGGLER_LINES])
    group_of = {host: i for i, (_, members) in enumerate(groups) for host in members}
    at_step: list = [{} for _ in groups]
    stragglers = []
    for r in ranks:
        series = html._mapping(r.get("series"))
        if html._plain(r.get("rank")) in slow:
            stragglers.append(html.Line(f"rank {html._plain(r.get('rank'))} ({html._plain(r.get('host'))})",
                                        html.PALETTE[3], html._list(series.get("step")),
                                        html._list(series.get(key)), 2.6, 1.0, True))
        group = group_of.get(html._plain(r.get("host")))
        if group is None:
            continue
        for step, value in zip(html._list(series.get("step")), html._list(series.get(key))):
            step, value = html._number(step), html._number(value)
            if step is not None and value is not None:
                at_step[group].setdefault(step, []).append(value)
    colours = html.build_colours(len(groups))
    lines = []
    for (label, _), colour, values in zip(groups, colours, at_step):
        steps = sorted(values)
        lines.append(html.Line(f"{label}: median", colour, steps, [statistics.median(values[s]) for s in steps],
                               1.6, 0.9))
    return lines + stragglers, lines + stragglers


def render_glance(ranks: list, host_medians: dict) -> str:
    """The first screen: how the ranks' times are spread, the slowest ranks and hosts."""
    parts = []
    rows = []
    for key, what in (("step_ms", "step time"), ("compute_ms", "compute")):
        values = [v for v in (_figure(r, key) for r in ranks) if v is not None]
        if values:
            cells = "".join(f'<td class="num">{html._format_number(v)}</td>' for _, v in decide_percentiles(values, PERCENTILES))
            rows.append(f'<tr><td class="txt">{what} (ms, {len(values):,} ranks)</td>{cells}</tr>')
    if rows:
        head = "".join(f"<th>{'min' if q == 0 else 'max' if q == 100 else f'p{q}'}</th>" for q in PERCENTILES)
        parts.append(f'<table class="ranks"><thead><tr><th>the ranks\' medians</th>{head}</tr></thead>'
                     f'<tbody>{"".join(rows)}</tbody></table>')
    slowest = decide_slowest_ranks(ranks, GLANCE)
    if slowest:
        items = "".join(f"<li>rank {html._text(r.get('rank'))} on {html._text(r.get('host'))}: compute "
                        f"{html._format_number(r.get('compute_ms'))} ms, step {html._format_number(r.get('step_ms'))}"
                        f" ms</li>" for r in slowest)
        parts.append(f'<div class="glance"><h3>The slowest {len(slowest)} ranks</h3><ol>{items}</ol></div>')
    hosts = sorted(host_medians.items(), key=lambda item: -item[1])[:GLANCE]
    if hosts:
        items = "".join(f"<li>{html._text(h)}: median compute {html._format_number(v)} ms</li>" for h, v in hosts)
        parts.append(f'<div class="glance"><h3>The slowest {len(hosts)} hosts</h3><ol>{items}</ol></div>')
    parts.append(render_histogram(ranks))
    return f'<section class="ataglance"><h2>At a glance</h2>{"".join(parts)}</section>'


def render_histogram(ranks: list) -> str:
    """How many ranks take how long a step, and how long their compute (their medians), each
    over HISTOGRAM_BINS bins of its own range."""
    charts = []
    for key, title, colour in (("step_ms", "Ranks by their step time", html.PALETTE[0]),
                               ("compute_ms", "Ranks by their compute a step", html.PALETTE[1])):
        values = [v for v in (_figure(r, key) for r in ranks) if v is not None]
        if not values:
            continue
        lo, hi = min(values), max(values)
        width = (hi - lo) / HISTOGRAM_BINS or 1.0
        counts = [0] * HISTOGRAM_BINS
        for v in values:
            counts[min(HISTOGRAM_BINS - 1, int((v - lo) / width))] += 1
        centres = [lo + (i + 0.5) * width for i in range(HISTOGRAM_BINS)]
        line = html.Line(f"{len(values):,} ranks", colour, centres, counts)
        charts.append(html.render_chart(html.Chart(title, "ranks", [line], (lo, hi + width), "ms (the rank's median)",
                                                   height=180)))
    return f'<div class="grid">{"".join(charts)}</div>' if charts else ""


def render_rank_table(ranks: list, stragglers: list) -> str:
    """The straggling ranks and the slowest TOP_RANKS, slowest first; the rest counted."""
    slow = html._straggler_ranks(stragglers)
    flagged = [r for r in ranks if html._plain(r.get("rank")) in slow]
    shown_ids = {id(r) for r in flagged}
    shown = flagged + [r for r in decide_slowest_ranks(ranks, TOP_RANKS) if id(r) not in shown_ids]
    table = html._render_rank_table(shown, stragglers)
    left = len(ranks) - len(shown)
    more = (f'<p class="hint">{len(shown)} of {len(ranks):,} ranks: the stragglers and the slowest. The other '
            f"{left:,} are in report.json, every rank's figures.</p>") if left > 0 else ""
    return table + more


def render_step_charts(ranks: list, stragglers: list, names: list) -> str:
    groups = decide_host_groups(names)
    # Worst first (the stragglers' order): only the first STRAGGLER_LINES get a line of their own.
    slow = [html._plain(s.get("rank")) for s in stragglers if s.get("kind") == "rank" and s.get("rank") is not None]
    charts = []
    for key, title in (("step_ms", "Step time per group of hosts"), ("compute_ms", "Compute time per group of hosts")):
        lines, legend = build_group_lines(ranks, groups, key, slow)
        if not any(html._has_values(line.ys) for line in lines):
            continue
        x_range = html._value_range([x for line in lines for x in line.xs])
        chart = html.Chart(title, "ms", lines, x_range, "step", width=1200, height=320, zoom=True)
        charts.append(html.render_chart(chart, legend if not charts else [], "colours as above"))
    if not charts:
        return '<p class="empty">The ranks recorded no step times.</p>'
    drawn = min(STRAGGLER_LINES, len(slow))
    hint = (f'<p class="hint">{len(groups)} group(s) of hosts in the job\'s order; each line the median over a group\'s '
            f"ranks at each step" + (f"; the {drawn} worst straggling rank(s) drawn on their own, on top" if drawn else "")
            + (f" ({len(slow) - drawn} more straggling: the table above)" if len(slow) > drawn else "") + ".</p>")
    return hint + "\n".join(charts)


def render_host_table(report: dict, names: list, host_medians: dict) -> str:
    """Every host in one line: its status, CPU, memory and its ranks' median compute."""
    hosts = html._mapping(report.get("hosts"))
    rows = []
    for name in names:
        host = html._mapping(hosts.get(name))
        series = html._mapping(host.get("series"))
        cpu = [v for v in map(html._number, html._list(series.get("cpu_pct"))) if v is not None]
        rss = [v for v in map(html._number, html._list(series.get("tree_rss_mb"))) if v is not None]
        status = "missing" if host.get("status") == "missing" or not host else "reported"
        cells = [html._text(name), status, html._format_number(statistics.fmean(cpu)) if cpu else "",
                 html._format_number(max(rss), 0) if rss else "", html._format_number(host_medians.get(name))]
        tds = "".join(f'<td class="{"num" if i >= 2 else "txt"}">{c}</td>' for i, c in enumerate(cells))
        mark = ' class="slowhost"' if status == "missing" else ""
        rows.append(f"<tr{mark}>{tds}</tr>")
    head = "".join(f"<th>{c}</th>" for c in ("host", "figures", "cpu %", "job MB (max)", "compute ms (median)"))
    return (f'<details><summary>Every host ({len(names):,})</summary><div class="ranks-box tall">'
            f'<table class="ranks"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>'
            f"</details>")


def decide_panel_hosts(report: dict, names: list, stragglers: list, host_medians: dict) -> list:
    """The hosts whose timelines are drawn: the straggling and the missing ones, then the
    slowest, HOST_PANELS in all at least; in the job's order."""
    hosts = html._mapping(report.get("hosts"))
    chosen = set(html._straggler_hosts(stragglers))
    chosen |= {html._plain(s.get("host")) for s in stragglers if s.get("kind") == "rank"}
    chosen |= {n for n in names if html._mapping(hosts.get(n)).get("status") == "missing" or not hosts.get(n)}
    for host, _ in sorted(host_medians.items(), key=lambda item: -item[1]):
        if len(chosen) >= HOST_PANELS:
            break
        chosen.add(host)
    for name in names:  # a job without step figures: its first hosts
        if len(chosen) >= HOST_PANELS:
            break
        chosen.add(name)
    return [n for n in names if n in chosen]


def render_hosts(report: dict, job: dict, names: list, stragglers: list, host_medians: dict) -> str:
    drawn = decide_panel_hosts(report, names, stragglers, host_medians)
    panels = html._render_host_panels({**report, "hosts": {n: html._mapping(report.get("hosts")).get(n)
                                                           for n in drawn if n in html._mapping(report.get("hosts"))}},
                                      {**job, "hosts": drawn})
    hint = (f'<p class="hint">The timelines of {len(drawn)} of {len(names):,} hosts: the straggling, the missing and '
            f"the slowest. Every host's figures are in report.json.</p>")
    return render_host_table(report, names, host_medians) + hint + panels


STRAGGLERS_SHOWN = 5  # named in the box; the rest folded under it


def render_stragglers(stragglers: list) -> str:
    """The small page's box, its first STRAGGLERS_SHOWN named and the rest folded: a slow host's
    8 ranks are 9 lines, 30 such hosts would push everything else off the first screen."""
    if len(stragglers) <= STRAGGLERS_SHOWN:
        return html._render_stragglers(stragglers)
    shown = html._render_stragglers(stragglers[:STRAGGLERS_SHOWN]).replace(
        f"Stragglers ({STRAGGLERS_SHOWN})", f"Stragglers ({len(stragglers):,})", 1)
    items = "".join(f"<li>{html._text(s.get('line') or html._describe_straggler(s))}</li>"
                    for s in stragglers[STRAGGLERS_SHOWN:])
    more = (f'<details><summary>{len(stragglers) - STRAGGLERS_SHOWN:,} more</summary><ul>{items}</ul>'
            f"</details></section>")
    return shown[:-len("</section>")] + more


def render_notes(notes: list) -> list:
    """At most GLANCE notes in the header; the rest folded."""
    return list(notes[:GLANCE])


def build_large_page(report: dict) -> str:
    """The whole page of a large job (jobreport/page.py chooses it)."""
    report = html._mapping(report)
    job = html._mapping(report.get("job"))
    ranks = [r for r in html._list(report.get("ranks")) if isinstance(r, dict)]
    stragglers = [s for s in html._list(report.get("stragglers")) if isinstance(s, dict)]
    return html.build_page(report, job, build_large_body(report, job, ranks, stragglers, decide_host_names(report)))


def decide_host_names(report: dict) -> list:
    """The job's hosts in its order, then any other host with figures."""
    job = html._mapping(report.get("job"))
    names = [h for h in html._list(job.get("hosts")) if isinstance(h, str)]
    return names + [h for h in html._mapping(report.get("hosts")) if isinstance(h, str) and h not in names]


def build_large_body(report: dict, job: dict, ranks: list, stragglers: list, names: list) -> list:
    """The sections of a large job's page, in order (html.build_page wraps them)."""
    host_medians = decide_host_medians(ranks)
    notes = html._list(report.get("notes"))
    folded = ""
    if len(notes) > GLANCE:
        items = "".join(f"<li>{html._text(n)}</li>" for n in notes[GLANCE:])
        folded = (f'<section><details><summary>{len(notes) - GLANCE:,} more notes</summary><ul>{items}</ul>'
                  f"</details></section>")
    brief = {**job, "hosts": (names[:3] + ["…"] + names[-1:]) if len(names) > 4 else names}
    header = html._render_header(brief, render_notes(notes)).replace(
        f"<dd>{len(brief['hosts'])}: ", f"<dd>{len(names):,}: ", 1)
    return [
        f"<style>{CSS}</style>",
        header,
        folded,
        html._render_restarts([r for r in html._list(report.get("restarts")) if isinstance(r, dict)]),
        render_stragglers(stragglers),
        render_glance(ranks, host_medians) if ranks else "",
        html._section("Ranks", render_rank_table(ranks, stragglers)) if ranks else
        html._section("Ranks", '<p class="empty">No PyTorch step figures: host figures only.</p>'),
        html._section("Step times", render_step_charts(ranks, stragglers, names)) if ranks else "",
        html._section("Hosts", render_hosts(report, job, names, stragglers, host_medians)),
    ]

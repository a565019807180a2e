"""The job report's page (index.html) for a report.json: the small page (jobreport/html.py: a line
per rank, a panel per host) up to at_scale.LARGE_RANKS ranks and LARGE_HOSTS hosts, the large
one (jobreport/at_scale.py: bounded, whatever the number of ranks) above. Pure."""

from __future__ import annotations

from entrypoint.jobreport import at_scale, html


def build_report_page(report: dict) -> str:
    ranks = [r for r in html._list(html._mapping(report).get("ranks")) if isinstance(r, dict)]
    if at_scale.is_large(ranks, at_scale.decide_host_names(html._mapping(report))):
        return at_scale.build_large_page(report)
    return html.build_report_html(report)

"""The job report at scale: the leader's build of report.json's content and of index.html from
every host's figures, for a job of H hosts × R ranks, measured on this machine.

    .venv/bin/python benchmarks/report_scale.py --hosts 256 --ranks-per-host 8 [--hosts 1024] [--repeats 1]

Each host count runs in a process of its own (peak memory is that process's). The figures are
synthetic but of the real shape and size (what a host sends the leader, jobreport/figures.py):
10 minutes sampled every second with 8 GPUs a host, 500 steps a rank, one slow rank and one
slow host. What is timed is the leader's own work: jobreport.build.build_report (stragglers,
DDP adjustment) and jobreport.page.build_report_page, not the figures' trip over the network.

Ends with one JSON line per host count: {"hosts", "ranks", "build_s", "html_bytes", "peak_rss_mb"}.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

def measure(hosts: int, ranks_per_host: int) -> dict:
    from entrypoint.jobreport.build import build_report
    from entrypoint.jobreport.page import build_report_page

    from support.big_report import build_figures

    figures = build_figures(hosts, ranks_per_host)
    names = tuple(figures)
    started = time.perf_counter()
    report = build_report(f"torchrun on {hosts} host(s)", names[0], names, 0, figures, [])
    page = build_report_page(report)
    build_s = time.perf_counter() - started
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"hosts": hosts, "ranks": hosts * ranks_per_host, "build_s": round(build_s, 2),
            "html_bytes": len(page.encode("utf-8")), "peak_rss_mb": round(peak_mb, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", action="append", type=int, help="host counts (repeat, or 256,1024)")
    parser.add_argument("--ranks-per-host", type=int, default=8)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child: measure this host count
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.ranks_per_host)))
        return 0
    results = []
    for hosts in args.hosts or [256]:
        done = subprocess.run([sys.executable, __file__, "--one", str(hosts), "--ranks-per-host",
                               str(args.ranks_per_host)], capture_output=True, text=True, check=True)
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print("| hosts | ranks | build s | index.html | peak RSS |")
    print("|---|---|---|---|---|")
    for r in results:
        print(f"| {r['hosts']} | {r['ranks']} | {r['build_s']:.2f} | {r['html_bytes'] / 1e6:.2f} MB | "
              f"{r['peak_rss_mb']:.0f} MB |")
    for r in results:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())

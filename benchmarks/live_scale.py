"""The leader's live view at scale: what one tick of its live thread costs when H hosts × R ranks
send their live figures, and what the view shows, measured on this machine.

    .venv/bin/python benchmarks/live_scale.py --hosts 256 --hosts 1024 [--ranks-per-host 8] [--ticks 3]

Each worker's update is made by the real code (jobreport/live/update.py: build_update, then
fit_update to settings.live_figures_bytes) from one interval of synthetic figures (10 samples
a host with 8 GPUs, 20 steps a rank, one rank slower), and handed to the real LiveLoop as the
job port's handler would (take_remote); then the leader's tick runs: its own update, the
workers', the view, the TensorBoard events file and the status line. What is left out: the job
port (its bytes and threads), and the leader's own sampler.

Ends with one JSON line per host count: {"hosts", "ranks", "tick_cpu_s", "live_cpu_pct",
"hosts_shown", "rank_series", "series", "notes"}: live_cpu_pct is the tick's CPU over the live
interval (10 s), hosts_shown the hosts whose figures the last tick wrote, series the events'
distinct tags.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

INTERVAL_S = 10.0
SAMPLES = 10
STEPS = 20
GPUS = 8


def host_points(t0: float, h: int) -> list[dict]:
    return [{"time": t0 + i, "cpu_pct": 80.0 + math.sin(i + h), "tree_cpu_pct": 900.0, "tree_rss_mb": 30000.0 + i,
             "cgroup_mb": 50000.0, "net_rx_mbps": 1500.0, "net_tx_mbps": 1400.0, "disk_read_mbps": 2.0,
             "disk_write_mbps": 1.0, "gpu_util_pct": [90.0 + g for g in range(GPUS)],
             "gpu_mem_mb": [70000.0 + g for g in range(GPUS)], "gpu_power_w": [600.0] * GPUS}
            for i in range(SAMPLES)]


def rank_raw(rank: int, first_step: int) -> dict:
    slow = 1.5 if rank == 37 else 1.0 + 0.03 * math.sin(rank)
    steps = list(range(first_step, first_step + STEPS))
    return {"rank": str(rank), "steps": steps[-1], "ddp": False,
            "series": {"step": steps, "step_ms": [480.0] * STEPS, "wait_ms": [480.0 - 300.0 * slow] * STEPS,
                       "backward_ms": [100.0] * STEPS, "data_wait_ms": [0.0] * STEPS, "samples": [32] * STEPS}}


class Sampler:
    def __init__(self, t0: float):
        self.t0 = t0
        self.phases = {"entrypoint start": t0}
        self.points: list[dict] = []

    def snapshot(self):
        return list(self.points), dict(self.phases)


class NoThroughput:
    def median(self):
        return None


def count_tags(folder: Path) -> tuple[int, int]:
    """(distinct tags, those under rank/) in the events files of folder."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = set()
    for path in folder.rglob("events.out.tfevents.*"):
        acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
        acc.Reload()
        tags.update(acc.Tags().get("scalars", []))
    return len(tags), sum(t.startswith("rank/") for t in tags)


def measure(hosts: int, ranks_per_host: int, ticks: int) -> dict:
    from entrypoint.decide.job_report import ReportSpec
    from entrypoint.jobreport.live.loop import LiveLoop
    from entrypoint.jobreport.live.update import Notes, build_update, fit_update
    from entrypoint.jobreport.live.view import decide_points_sent
    from entrypoint.settings import DEFAULTS

    with tempfile.TemporaryDirectory() as tmp:
        ranks_dir = Path(tmp) / "ranks"
        ranks_dir.mkdir()
        for local in range(ranks_per_host):  # the leader's own ranks
            (ranks_dir / f"rank-{local}.json").write_text(json.dumps(rank_raw(local, 1)))
        t0 = time.time() - 3600
        sampler = Sampler(t0)
        logged: list[str] = []
        spec = ReportSpec(str(ranks_dir), 1.0, GPUS, 0, str(Path(tmp) / "tb" / "byoc-job"), INTERVAL_S, INTERVAL_S)
        loop = LiveLoop(spec, "algo-1", sampler, NoThroughput(), logged.append)
        sent = [dict() for _ in range(hosts)]
        cpu = []
        for tick in range(ticks):
            start = t0 + tick * INTERVAL_S
            sampler.points = host_points(start, 0)
            for h in range(1, hosts):
                raws = [rank_raw(h * ranks_per_host + local, 1 + tick * STEPS) for local in range(ranks_per_host)]
                update = build_update(f"algo-{h + 1}", host_points(start, h), raws, sent[h], None, Notes())
                # As a worker of this job sends it (jobreport/live/loop.py: its newest points only, over 16 hosts).
                loop.take_remote(f"algo-{h + 1}", fit_update(update, DEFAULTS.live_figures_bytes,
                                                             decide_points_sent(hosts)))
            loop.next_status = 0.0
            before = time.thread_time()
            loop.tick()
            cpu.append(time.thread_time() - before)
        shown = len(loop.view.hosts_shown)
        loop.stop()
        series, rank_series = count_tags(Path(tmp) / "tb" / "byoc-job")
    tick_cpu = sorted(cpu)[len(cpu) // 2]
    return {"hosts": hosts, "ranks": hosts * ranks_per_host, "tick_cpu_s": round(tick_cpu, 3),
            "live_cpu_pct": round(100 * tick_cpu / INTERVAL_S, 2), "hosts_shown": shown,
            "rank_series": rank_series, "series": series,
            "notes": [line for line in logged if line.startswith("job report (live)")][:5]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", action="append", type=int)
    parser.add_argument("--ranks-per-host", type=int, default=8)
    parser.add_argument("--ticks", type=int, default=3)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.ranks_per_host, args.ticks)))
        return 0
    results = []
    for hosts in args.hosts or [256]:
        done = subprocess.run([sys.executable, __file__, "--one", str(hosts), "--ranks-per-host",
                               str(args.ranks_per_host), "--ticks", str(args.ticks)],
                              capture_output=True, text=True, check=True)
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print("| hosts | ranks | a tick's CPU | of a core | hosts shown | series (rank/) |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['hosts']} | {r['ranks']} | {r['tick_cpu_s']:.2f} s | {r['live_cpu_pct']:.1f}% | "
              f"{r['hosts_shown']} | {r['series']} ({r['rank_series']}) |")
    for r in results:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A large job's figures, as every host would send them to the leader (jobreport/figures.py's
shape and size): what benchmarks/report_scale.py times and tests/entrypoint/jobreport/
test_report_at_scale.py reads. 10 minutes sampled every second with 8 GPUs a host, 500 steps
a rank; ranks differ a little (±4%, fixed by the rank); one host is 30% slower, one rank 50%."""

from __future__ import annotations

import math

START = 1764130000.0
SAMPLES = 600  # 10 minutes at the default BYOC_REPORT_INTERVAL_S (1 s)
STEPS = 500
GPUS = 8
SLOW_RANK = 37


def wave(i: int, base: float, swing: float, period: float = 7.0) -> float:
    return base + swing * math.sin(i / period * 2 * math.pi) * math.cos(i / 3.1)


def build_host(h: int, host: str, ranks_per_host: int, slow_host: bool, samples: int = SAMPLES,
               steps: int = STEPS) -> dict:
    series = {
        "time": [START + i + 0.01 * h for i in range(samples)],
        "cpu_pct": [round(wave(i + h, 80, 8), 1) for i in range(samples)],
        "tree_cpu_pct": [round(wave(i + h, 900, 50, 5), 1) for i in range(samples)],
        "core_pct": [[round(wave(i + c, 70, 25, 3), 1) for c in range(4)] for i in range(samples)],
        "tree_rss_mb": [30000 + 3 * i for i in range(samples)],
        "cgroup_mb": [50000 + 3 * i for i in range(samples)],
        "net_rx_mbps": [round(wave(i, 1500, 120, 3), 1) for i in range(samples)],
        "net_tx_mbps": [round(wave(i, 1400, 120, 4), 1) for i in range(samples)],
        "disk_read_mbps": [round(wave(i, 2.5, 2.4, 5), 2) for i in range(samples)],
        "disk_write_mbps": [round(wave(i, 1.0, 0.9, 6), 2) for i in range(samples)],
        "gpu_util_pct": [[round(wave(i + 3 * g, 90, 8, 4 + g), 1) for g in range(GPUS)] for i in range(samples)],
        "gpu_mem_mb": [[70000 + 20 * g + i for g in range(GPUS)] for i in range(samples)],
        "gpu_power_w": [[round(wave(i, 600, 40, 5), 1) for g in range(GPUS)] for i in range(samples)],
    }
    ranks = []
    for local in range(ranks_per_host):
        rank = h * ranks_per_host + local
        # Ranks differ a little (±4%, fixed by the rank), one host is 30% slower, one rank 50%.
        jitter = 1.0 + 0.04 * math.sin(rank * 2.39996)
        compute = round(300.0 * jitter * (1.3 if slow_host else 1.0) * (1.5 if rank == SLOW_RANK else 1.0), 1)
        ranks.append({"rank": rank, "host": host, "local_rank": local, "steps": steps,
                      "step_ms": round(480.0 + 0.1 * compute, 1),
                      "compute_ms": compute, "wait_ms": 480.0 - compute, "data_wait_ms": None,
                      "compute_source": "step minus collectives", "samples_per_s": None,
                      "series": {"step": list(range(steps)),
                                 "step_ms": [round(wave(i + rank, 480, 6, 6), 3) for i in range(steps)],
                                 "compute_ms": [round(wave(i + rank, compute, 5, 5), 3) for i in range(steps)]}})
    phases = [{"host": host, "name": name, "time": START + t} for name, t in
              (("entrypoint start", 0.0), ("job read", 0.2), ("hosts resolved", 0.5), ("peers ready", 2.0),
               ("processes started", 2.5), ("first training step", 30.0), ("end", samples + 1.0))]
    return {"status": "reported", "interval_s": 1.0, "cores": 96, "sampler_cpu_s": 1.2, "samples_per_s": None,
            "series": series, "phases": phases, "ranks": ranks}





def build_figures(hosts: int, ranks_per_host: int = 8, samples: int = SAMPLES, steps: int = STEPS) -> dict:
    """host name -> its figures, for algo-1 … algo-<hosts>; the slow host is the third's."""
    names = [f"algo-{h + 1}" for h in range(hosts)]
    return {name: build_host(h, name, ranks_per_host, h == hosts // 3, samples, steps) for h, name in enumerate(names)}

"""The deep health check (BYOC_HEALTH_CHECK=deep), decided (pure): which processes this host
runs, what bus bandwidth it should reach, and the verdict on what they measured.

Before the training starts, every host runs one process per GPU (rank/allreduce_check.py):
an all-reduce within each host, then one across every host. Bus bandwidth is nccl-tests'
(github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md): algbw = bytes / seconds, and for an
all-reduce over n ranks busbw = algbw x 2(n-1)/n, in GB/s of 10^9 bytes; it is comparable to
the hardware's one-way link bandwidth whatever the rank count. A host fails the check when a
figure is below BYOC_HEALTH_CHECK_MIN_FRACTION x the expected one; the verdict is the same on
every host (every host sees every host's figures) so all of them stop together.

Imported only when the check is on: a job without it never loads this module.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from entrypoint.decide.specs import ProcessSpec
from entrypoint.settings import LaunchSettings

ALLREDUCE_CHECK = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "rank",
                               "allreduce_check.py")
RESULT_FILE = "health-check.json"
GB = 1e9  # nccl-tests' GB/s

# The expected bus bandwidth, GB/s, DERIVED (not measured here) from documented link speeds:
# within a host, NVIDIA's per-GPU NVLink bandwidth (nvidia.com/en-us/data-center/nvlink: V100
# NVLink 2 300 GB/s, A100 NVLink 3 600 GB/s, H100/H200 NVLink 4 900 GB/s, B200 NVLink 5
# 1.8 TB/s, each both directions together) halved to the one-way figure busbw compares with;
# across hosts, AWS's network bandwidth per instance (aws.amazon.com/ec2/instance-types/p3,
# /p4, /p5, /p6: 25, 100, 400 and 3200 Gbps) / 8, no more than the host's own figure. NVLink
# SHARP (NVLS, H100 on) can take an all-reduce's busbw above the one-way NVLink figure.
# Types without NVLink between all their GPUs (g4dn, g5, g6, g6e: PCIe) have no entry: the
# check measures and reports there, and judges only with BYOC_HEALTH_CHECK_HOST_GBPS set.
EXPECTED_GBPS = {  # instance type: (within a host, across hosts)
    "ml.p3.16xlarge": (150.0, 3.125),  # 8 V100, NVLink 2; 25 Gbps
    "ml.p3dn.24xlarge": (150.0, 12.5),  # 8 V100, NVLink 2; 100 Gbps EFA
    "ml.p4d.24xlarge": (300.0, 50.0),  # 8 A100, NVLink 3; 400 Gbps EFA
    "ml.p4de.24xlarge": (300.0, 50.0),
    "ml.p5.48xlarge": (450.0, 400.0),  # 8 H100, NVLink 4; 3200 Gbps EFA
    "ml.p5e.48xlarge": (450.0, 400.0),  # 8 H200, NVLink 4; 3200 Gbps EFA
    "ml.p5en.48xlarge": (450.0, 400.0),  # 8 H200, NVLink 4; 3200 Gbps EFA
    "ml.p6-b200.48xlarge": (900.0, 400.0),  # 8 B200, NVLink 5; 3200 Gbps EFA
}
SOURCE = "derived from NVIDIA's NVLink and AWS's network bandwidth (docs/reliability.md)"


class HealthCheck(NamedTuple):
    processes: tuple[ProcessSpec, ...]  # this host's ranks of the check
    result_file: str  # where local rank 0 writes the timings
    hosts: tuple[str, ...]  # the hosts taking part, in rank order
    leader: str  # whose port the rendezvous is on (a name to resolve when hosts > 1)
    backend: str  # nccl on GPUs, gloo on CPUs
    ranks_per_host: int
    instance_type: str
    expected_host_gbps: float | None  # None: nothing to judge against
    expected_job_gbps: float | None
    source: str  # where the expected figures come from
    min_fraction: float
    mib: int


def decide_expected(instance_type: str, settings: LaunchSettings) -> tuple[float | None, float | None, str]:
    """(within a host, across hosts, where from): the job's own figures win over the table's."""
    table_host, table_job = EXPECTED_GBPS.get(instance_type, (None, None))
    host = settings.health_check_host_gbps or table_host
    job = settings.health_check_job_gbps or table_job
    if settings.health_check_host_gbps or settings.health_check_job_gbps:
        source = "BYOC_HEALTH_CHECK_HOST_GBPS / BYOC_HEALTH_CHECK_JOB_GBPS" + (f", else {SOURCE}" if table_host else "")
    else:
        source = SOURCE if table_host else f"no figure for {instance_type}: measured, not judged"
    return host, job, source


def build_health_check(settings: LaunchSettings, python: str, instance_type: str, hosts: tuple[str, ...],
                       current_host: str, leader: str, ranks_per_host: int, gpus: bool,
                       folder: str) -> HealthCheck:
    """This host's ranks of the check: one per GPU (or CPU rank), numbered host by host. One host
    rendezvouses on the loopback address, several on the leader's name."""
    node = hosts.index(current_host)
    result_file = os.path.join(folder, RESULT_FILE)
    backend = "nccl" if gpus else "gloo"
    argv = (python, ALLREDUCE_CHECK, "--backend", backend, "--mib", str(settings.health_check_mib),
            "--warmup", str(settings.health_check_warmup), "--iterations", str(settings.health_check_iterations),
            "--timeout-s", f"{settings.health_check_timeout_s:g}", "--result", result_file)
    common = (("WORLD_SIZE", str(len(hosts) * ranks_per_host)), ("LOCAL_WORLD_SIZE", str(ranks_per_host)),
              ("MASTER_ADDR", leader if len(hosts) > 1 else "127.0.0.1"),
              ("MASTER_PORT", str(settings.health_check_port)))
    processes = tuple(
        ProcessSpec(f"health-check{node * ranks_per_host + local}", argv,
                    env=common + (("RANK", str(node * ranks_per_host + local)), ("LOCAL_RANK", str(local))), cwd="/")
        for local in range(ranks_per_host))
    host_gbps, job_gbps, source = decide_expected(instance_type, settings)
    return HealthCheck(processes, result_file, hosts, leader, backend, ranks_per_host, instance_type,
                       host_gbps, job_gbps, source, settings.health_check_min_fraction, settings.health_check_mib)


def decide_not_run(gpu_count: int, neuron_core_count: int, hosts: int, ranks_per_host: int) -> str | None:
    """Why BYOC_HEALTH_CHECK=deep runs nothing on this job, or None when it runs."""
    if neuron_core_count and not gpu_count:
        return ("BYOC_HEALTH_CHECK=deep runs on NVIDIA GPUs (NCCL) only; not on this Neuron host "
                "(Neuron's own collective test is nccom-test)")
    if hosts * ranks_per_host < 2:
        return "BYOC_HEALTH_CHECK=deep: one process on one host, no all-reduce to measure; not run"
    return None


def describe_health_check(check: HealthCheck) -> str:
    """The plan's line for the check."""
    def expected(gbps):
        return f"{gbps:g} GB/s" if gbps else "no expected figure"

    across = (f", then across {len(check.hosts)} hosts ({len(check.hosts) * check.ranks_per_host} ranks, "
              f"{expected(check.expected_job_gbps)})" if len(check.hosts) > 1 else "")
    return (f"deep health check (BYOC_HEALTH_CHECK=deep) before the training: a {check.mib} MiB {check.backend} "
            f"all-reduce across each host's {check.ranks_per_host} rank(s) ({expected(check.expected_host_gbps)})"
            f"{across}; a host fails below {check.min_fraction:g} x the expected bus bandwidth "
            f"(BYOC_HEALTH_CHECK_MIN_FRACTION); expected figures: {check.source}")


class Figure(NamedTuple):
    what: str  # "within algo-1", "across 2 hosts"
    ranks: int
    bus_gbps: float
    expected_gbps: float | None
    correct: bool
    host: str | None  # the host this figure is that host's own, None across hosts


def build_bus_gbps(size_bytes: int, seconds: float, ranks: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce: algbw x 2(n-1)/n, GB/s of 10^9 bytes."""
    if seconds <= 0 or ranks < 2:
        return 0.0
    return size_bytes / seconds / GB * 2 * (ranks - 1) / ranks


def build_figures(check: HealthCheck, result: dict) -> list[Figure]:
    size = result["bytes"]
    figures = [Figure(f"within {host}", f["ranks"], build_bus_gbps(size, f["seconds"], f["ranks"]),
                      check.expected_host_gbps if f["ranks"] > 1 else None, f["correct"], host)
               for host, f in zip(check.hosts, result.get("host") or [])]
    job = result.get("job")
    if job:
        expected = min(filter(None, (check.expected_host_gbps, check.expected_job_gbps)), default=None)
        figures.append(Figure(f"across {len(check.hosts)} hosts", job["ranks"],
                              build_bus_gbps(size, job["seconds"], job["ranks"]), expected, job["correct"], None))
    return figures


def describe_figure(figure: Figure, min_fraction: float) -> str:
    if not figure.correct:
        return f"{figure.what}: the all-reduce's sums were WRONG over {figure.ranks} ranks"
    if figure.ranks < 2:
        return f"{figure.what}: one rank, nothing crosses a link (bus bandwidth 0 by definition): not judged"
    line = f"{figure.what}: {figure.bus_gbps:.1f} GB/s bus bandwidth over {figure.ranks} ranks"
    if not figure.expected_gbps:
        return line + " (no expected figure: not judged)"
    floor = min_fraction * figure.expected_gbps
    verdict = "OK" if figure.bus_gbps >= floor else "TOO LOW"
    return line + (f" ({figure.bus_gbps / figure.expected_gbps:.0%} of the expected {figure.expected_gbps:g} GB/s; "
                   f"at least {floor:.1f} needed): {verdict}")


def decide_failed(figures: list[Figure], min_fraction: float) -> list[Figure]:
    return [f for f in figures if not f.correct
            or (f.expected_gbps and f.bus_gbps < min_fraction * f.expected_gbps)]


def build_health_failure(check: HealthCheck, figures: list[Figure], current_host: str) -> str | None:
    """output/failure's text when a figure fails, the same words on every host; None: passed."""
    failed = decide_failed(figures, check.min_fraction)
    if not failed:
        return None
    bad_hosts = [f.host for f in failed if f.host]
    where = (f"host(s) {', '.join(bad_hosts)}" if bad_hosts else f"the network between the {len(check.hosts)} hosts")
    here = ("this host is one of them" if current_host in bad_hosts
            else f"this host ({current_host}) passed; it stops too, as every host does")
    fixes = []
    if bad_hosts:
        fixes.append("a GPU interconnect below its expected speed is a degraded instance (an NVLink or NVSwitch "
                     "fault; or NCCL kept off NVLink by NCCL_P2P_DISABLE / NCCL_P2P_LEVEL): run the job again, "
                     "which gets new instances, and report the instance to AWS Support if it recurs")
    if not all(f.host for f in failed):
        fixes.append("a slow all-reduce across hosts is a network NCCL cannot use at speed (EFA not used: "
                     "NCCL_DEBUG=INFO's \"Using network\" line should name AWS Libfabric, not Socket; an EFA "
                     "device missing): see the pre-flight's EFA lines in the log")
    fixes.append("if the expected figure is wrong for this job, set BYOC_HEALTH_CHECK_HOST_GBPS / "
                 "BYOC_HEALTH_CHECK_JOB_GBPS or BYOC_HEALTH_CHECK_MIN_FRACTION; unset BYOC_HEALTH_CHECK to skip it")
    short = "; ".join(f"{f.what}: sums wrong" if not f.correct else
                      f"{f.what}: {f.bus_gbps:.1f} GB/s, below {check.min_fraction:g} x {f.expected_gbps:g} GB/s"
                      for f in failed)
    lines = [f"Deep health check (BYOC_HEALTH_CHECK=deep) failed on {where} ({short}), the training never "
             f"started; {here}. "
             f"A {check.mib} MiB {check.backend} all-reduce, bus bandwidth as nccl-tests computes it "
             f"(algbw x 2(n-1)/n); expected figures {check.source}, for {check.instance_type}:"]
    lines += [f"  {describe_figure(f, check.min_fraction)}" for f in figures]
    lines.append("The fix: " + "; ".join(fixes) + ".")
    return "\n".join(lines) + "\n"

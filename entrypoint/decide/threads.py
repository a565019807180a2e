"""Each process's share of this machine's cores, decided once (pure): OMP_NUM_THREADS, and
MKL_NUM_THREADS where the image has a separate MKL, for every process the launch starts.

Why: torch starts one compute thread per core the process sees. With P ranks on a host, each
sees every core: P x cores threads on `cores` cores. An OpenMP parallel region ends in a
barrier that waits for its slowest thread, and a thread that lost its core waits a scheduler
slice (milliseconds) for it, on every region. SageMaker's local mode is worse: every host is
a container on this one machine, sees all of its cores, and knows nothing of the others
(issue 38: the main job's MPI backends 6-7x slower than alone). torchrun sets
OMP_NUM_THREADS=1 when it starts several processes; mpirun and a plain process set nothing.

The rule (docs/training.md, "Threads per rank"):
- cores: the fewest of the machine's count (nproc), this process's affinity (a cpuset) and
  the cgroup's CPU quota (cpu.max, rounded down, at least 1);
- processes: what this launch starts on the machine: 1 for one process, the processes per
  host under mpirun and torchrun, the workers plus the server for the parameter server;
  in local mode, summed over every host of the job (they all share the machine);
- threads = max(1, cores // processes).
A job that sets OMP_NUM_THREADS or MKL_NUM_THREADS itself keeps its own values: then nothing
is set, and the plan says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, NamedTuple

if TYPE_CHECKING:
    from entrypoint.decide.topology import Topology
    from entrypoint.job.probe import MachineFacts

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
# SageMaker local mode's instance types: every host is a container on the one machine.
LOCAL_INSTANCE_TYPES = ("local", "local_gpu")


class CpuFacts(NamedTuple):
    """What the machine says about its cores (entrypoint/job/probe.py reads them)."""

    count: int  # os.cpu_count(): every core of the machine
    affinity: int | None = None  # cores this process may run on; None: unknown
    quota: float | None = None  # the cgroup's CPU quota in cores; None: no limit
    mkl: bool = False  # a shared MKL library is in the image (torch's own MKL follows OMP_NUM_THREADS)


class ThreadBudget(NamedTuple):
    cores: int  # the cores this machine gives the job
    processes: int  # the processes of the job on this machine
    threads: int  # each process's share
    env: tuple[tuple[str, str], ...]  # what the plan adds; () when the job set its own
    note: str


def decide_cores(cpu: CpuFacts) -> int:
    """The cores the job may really use: a quota of 1.5 cores runs 1 thread without throttling."""
    cores = max(1, cpu.count)
    if cpu.affinity:
        cores = min(cores, cpu.affinity)
    if cpu.quota is not None:
        cores = min(cores, max(1, int(cpu.quota)))
    return cores


def decide_machine_processes(hosts: tuple[str, ...], current_host: str, instance_type: str,
                             per_host: dict[str, int]) -> tuple[int, int]:
    """(processes on this machine, hosts sharing it). `per_host` gives each host's processes;
    in local mode every host of the job runs here, elsewhere only the current one."""
    sharing = hosts if instance_type in LOCAL_INSTANCE_TYPES and current_host in hosts else (current_host,)
    return sum(per_host.get(h, 1) for h in sharing), len(sharing)


def describe_cores(cpu: CpuFacts, cores: int) -> str:
    limits = [f"nproc {cpu.count}"]
    if cpu.affinity is not None:
        limits.append(f"affinity {cpu.affinity}")
    if cpu.quota is not None:
        limits.append(f"cgroup quota {cpu.quota:g}")
    return f"{cores} core(s) ({', '.join(limits)})"


def decide_thread_budget(environ: Mapping[str, str], cpu: CpuFacts, processes: int, sharing_hosts: int) -> ThreadBudget:
    """Each process's threads, the variables that say it, and the plan's note."""
    cores = decide_cores(cpu)
    processes = max(1, processes)
    threads = max(1, cores // processes)
    where = (f"{processes} process(es) of {sharing_hosts} local-mode hosts on this machine" if sharing_hosts > 1
             else f"{processes} process(es) on this host")
    own = {k: environ[k] for k in THREAD_VARIABLES if k in environ}
    if own:
        chosen = ", ".join(f"{k}={v}" for k, v in sorted(own.items()))
        return ThreadBudget(cores, processes, threads, (), f"threads per process: as the job's environment sets "
                            f"them ({chosen}); the budget would be {threads} ({describe_cores(cpu, cores)}, {where})")
    names = THREAD_VARIABLES if cpu.mkl else THREAD_VARIABLES[:1]
    env = tuple((name, str(threads)) for name in names)
    return ThreadBudget(cores, processes, threads, env,
                        f"threads per process: {threads} ({' and '.join(names)}): {describe_cores(cpu, cores)} "
                        f"shared by {where}")


def build_thread_env(environ: Mapping[str, str], facts: MachineFacts, topo: Topology, instance_type: str,
                     host_processes: dict[str, int]) -> tuple[dict[str, str], str]:
    """(the variables for every process of the plan, the plan's note). host_processes: what
    each host of the job starts (its launcher family's decide_host_processes)."""
    cpu = CpuFacts(facts.cpu_count, facts.cpu_affinity, facts.cpu_quota, facts.mkl)
    processes, sharing = decide_machine_processes(topo.hosts, topo.current_host, instance_type, host_processes)
    budget = decide_thread_budget(environ, cpu, processes, sharing)
    return dict(budget.env), budget.note

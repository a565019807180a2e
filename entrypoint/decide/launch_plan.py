"""The launch plan's record and what every launcher family builds it with (pure): the plan
(LaunchPlan), this host's role in it (Role), the first half every family completes
(PlanBasis, build_plan), and the environment every distributed launch shares. The families'
own parts (argv, processes, their role) are theirs: decide/launchers/."""

from __future__ import annotations

import os
from enum import StrEnum
from typing import TYPE_CHECKING, NamedTuple

from entrypoint.decide import topology
from entrypoint.job.config import JobConfig
from entrypoint.job.json_text import build_json
from entrypoint.decide.compile_cache import CompileCache
from entrypoint.job.probe import MachineFacts
from entrypoint.job.program import CodeSource, EntryPoint
from entrypoint.decide.specs import ProcessSpec, RuntimeFiles, build_sha256_hex
# The ranks read them: the plan sets them in the rank's own copy of the job port's words.
from entrypoint.rank.record_errors import JOB_KEY_ENV, JOB_KEY_OLD_ENV, JOB_PORTS_ENV
from entrypoint.decide.job_report import ReportSpec
from entrypoint.settings import LaunchSettings

if TYPE_CHECKING:  # decide/health.py is imported only when the job asks for the check
    from entrypoint.decide.health import HealthCheck

RECORD_ERRORS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "rank", "record_errors.py")
# torchrun itself, run by path: it also reports a rank killed by a signal as the root cause.
LAUNCH_TORCHRUN = os.path.join(os.path.dirname(RECORD_ERRORS), "launch_torchrun.py")
NEURON_ROOT_COMM_PORT = 46820


class Runtime(NamedTuple):
    """Facts about this image and host, not the job's definition: where python is, where the
    job's runtime files go (specs.RuntimeFiles)."""

    python: str
    files: RuntimeFiles


class Role(StrEnum):
    """What this host does in the job: the closed set every launch decision ends in."""

    SINGLE = "single"  # one process, one host
    OUTSIDE_DISTRIBUTION = "outside-distribution"  # a host not in the distribution's instance group
    MPI_LEADER = "mpi-leader"  # runs mpirun over SSH to the other hosts
    MPI_WORKER = "mpi-worker"  # serves SSH to the leader until the leader reports the outcome
    TORCHRUN = "torchrun"  # torchrun on every host
    PARAMETER_SERVER = "parameter-server"  # a server and workers on every host


# The roles whose processes take part in a job across hosts (a multi-host wait and watch).
DISTRIBUTED_ROLES = (Role.MPI_LEADER, Role.TORCHRUN, Role.PARAMETER_SERVER)
# ... and the hosts of such a job, an MPI worker (whose ranks are mpirun's) among them.
JOB_HOST_ROLES = (*DISTRIBUTED_ROLES, Role.MPI_WORKER)


class LaunchPlan(NamedTuple):
    role: Role
    launcher: str  # process | mpi | pytorchddp | torch_distributed | smdataparallel | parameter_server
    current_host: str
    hosts: tuple[str, ...]  # hosts taking part in the distribution, in SageMaker's order
    leader: str
    interface: str
    processes_per_host: int
    cwd: str
    code: CodeSource
    entry: EntryPoint
    install: tuple[tuple[str, ...], ...]
    processes: tuple[ProcessSpec, ...]
    env: tuple[tuple[str, str], ...]
    settings: LaunchSettings
    files: RuntimeFiles  # the job's runtime folders and the files in them
    notes: tuple[str, ...] = ()
    health_check: HealthCheck | None = None  # BYOC_HEALTH_CHECK=deep: run before the training
    report: ReportSpec | None = None  # the job report (BYOC_REPORT); None: off
    compile_cache: CompileCache | None = None  # torch.compile's caches kept (decide/compile_cache.py)
    # When this host stops its processes itself (epoch s), a training plan's capacity ending
    # (decide/capacity.py); None without one. Decided once, here: every role reads this.
    capacity_stop_at: float | None = None
    # The job port's key (hosts/job_port.py) where the ranks do not get it: an MPI job's hosts
    # sign their words with it (roles/mpi.py). Elsewhere it is BYOC_JOB_PORT_KEY, in env.
    job_key: str = ""

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)

    # Read off the plan's own fields (decided once by topology.decide_topology), so no room
    # works them out again.
    @property
    def is_leader(self) -> bool:
        return self.current_host == self.leader

    @property
    def multi_host(self) -> bool:
        """A launch whose processes take part in one job across several hosts."""
        return self.role in DISTRIBUTED_ROLES and len(self.hosts) > 1

    @property
    def peers(self) -> tuple[str, ...]:
        """The hosts this one talks to: the leader's workers, or a worker's leader; none for a
        launch on one host."""
        if len(self.hosts) < 2:
            return ()
        if self.is_leader:
            return tuple(h for h in self.hosts if h != self.current_host)
        return (self.leader,)




def build_job_key(job: JobConfig, hosts: tuple[str, ...], secret: str | None = None) -> str:
    """The key the ranks sign their root causes with, the same on every host with no
    message between them: derived from what every host of this job is given and nothing
    outside the job has — its name, hosts and hyperparameters — and BYOC_JOB_SECRET when the
    user sets one (a random value makes the key underivable by anyone without it)."""
    material = build_json({
        "job": job.environ.get("TRAINING_JOB_NAME", ""),
        "hosts": list(hosts),
        "hyperparameters": job.hyperparameters.values,
        "secret": secret or "",  # BYOC_JOB_SECRET (settings.job_secret)
    }, sort_keys=True, default=str)
    return build_sha256_hex(b"byoc-job-report-key-v1\0" + material.encode("utf-8"))


def build_hostname_env(job: JobConfig, facts: MachineFacts) -> dict[str, str]:
    """Ranks must see gethostname() == current_host (MPI and NCCL group ranks by host name;
    a container's own name is random). The shim reads /opt/ml/input/config/resourceconfig.json,
    so it only applies when the job's root is /opt/ml."""
    if (
        facts.gethostname_shim is None
        or not facts.hostname
        or facts.hostname == job.resource.current_host
        or job.paths.base != "/opt/ml"
    ):
        return {}
    preload = job.environ.get("LD_PRELOAD")
    return {"LD_PRELOAD": f"{facts.gethostname_shim}:{preload}" if preload else facts.gethostname_shim}


def build_rendezvous_env(job: JobConfig, topo: topology.Topology, settings: LaunchSettings) -> dict[str, str]:
    """What the PyTorch DLC's toolkit exports for EVERY job, launcher or not
    (sagemaker_pytorch_container.training: MASTER_ADDR = the first distribution host, else the
    first host; MASTER_PORT = 7777; NCCL_SOCKET_IFNAME = the interface). A script without a
    `distribution=` that calls init_process_group(init_method="env://", rank=<host index>,
    world_size=<hosts>) relies on it. The DLC sets no RANK or WORLD_SIZE there; neither do we.
    A value the user set in the job's environment wins."""
    env = {
        "NCCL_SOCKET_IFNAME": topo.interface,
        "MASTER_ADDR": topo.leader,
        "MASTER_PORT": str(settings.master_port),
    }
    return {k: v for k, v in env.items() if k not in job.environ}


def build_launcher_env(job: JobConfig, facts: MachineFacts, topo: topology.Topology, settings: LaunchSettings) -> dict[str, str]:
    """Variables the collective libraries need. A value the user set in the job's environment
    wins: these are defaults, never overrides."""
    env = build_rendezvous_env(job, topo, settings)
    if facts.efa:
        env["FI_PROVIDER"] = "efa"
        env["RDMAV_FORK_SAFE"] = "1"
        env["FI_EFA_FORK_SAFE"] = "1"
        if facts.neuron_core_count:
            # Every trn1/trn1n EFA device does device RDMA; on GPU instances libfabric
            # detects it itself (forcing it breaks EFA devices without RDMA).
            env["FI_EFA_USE_DEVICE_RDMA"] = "1"
    if facts.neuron_core_count:
        env["PJRT_DEVICE"] = "NEURON"
        env["CCOM_SOCKET_IFNAME"] = topo.interface
        if len(topo.distribution_hosts) > 1:
            env["NEURON_RT_ROOT_COMM_ID"] = f"{topo.leader}:{NEURON_ROOT_COMM_PORT}"
    return {k: v for k, v in env.items() if k not in job.environ}


def build_job_port_env(job: JobConfig, topo: topology.Topology, settings: LaunchSettings) -> dict[str, str]:
    """Ranks report their exception to every host's job port (hosts/job_port.py), the
    leader's first: each host's output/failure can then lead with the job's first failure."""
    env = {}
    hosts = topo.distribution_hosts
    if len(hosts) > 1 and JOB_PORTS_ENV not in job.environ:
        env[JOB_PORTS_ENV] = ",".join(f"{h}:{settings.job_port}" for h in hosts)
    if JOB_PORTS_ENV in env or JOB_PORTS_ENV in job.environ:
        env[JOB_KEY_ENV] = env[JOB_KEY_OLD_ENV] = build_job_key(job, hosts, settings.job_secret)  # the old name for one release
    return env


class PlanBasis(NamedTuple):
    """What every plan of a job has whatever this host's role: decide's first half, which each
    launcher family's decide_plan completes (decide/launchers/)."""

    job: JobConfig
    topo: topology.Topology
    launcher: str
    code: CodeSource
    entry: EntryPoint
    install: tuple
    env: dict[str, str]
    settings: LaunchSettings
    runtime: Runtime
    notes: list[str]
    capacity_stop_at: float | None = None  # decided once: the plan's, and its note's


def build_plan(shared: PlanBasis, role: Role, processes: tuple[ProcessSpec, ...], extra_env: dict[str, str],
               hosts: tuple[str, ...] | None = None) -> LaunchPlan:
    topo = shared.topo
    one_process = role in (Role.SINGLE, Role.OUTSIDE_DISTRIBUTION)
    return LaunchPlan(
        role=role,
        launcher=shared.launcher,
        current_host=shared.job.resource.current_host,
        hosts=topo.distribution_hosts if hosts is None else hosts,
        leader=topo.leader,
        interface=topo.interface,
        processes_per_host=1 if one_process else topo.processes_per_host,
        cwd=shared.job.paths.code_dir,
        code=shared.code,
        entry=shared.entry,
        install=shared.install,
        processes=processes,
        env=tuple(sorted({**shared.env, **extra_env}.items())),
        settings=shared.settings,
        files=shared.runtime.files,
        notes=tuple(shared.notes),
        capacity_stop_at=shared.capacity_stop_at,
    )


def decide_distribution_processes(topo: topology.Topology, beside: int = 0) -> dict[str, int]:
    """What each host of a distributed launch starts (for its threads' share: decide/threads.py):
    the launcher's processes per host, and `beside` more, on a host of the distribution; the
    script once on a host outside it."""
    return {h: (topo.processes_per_host + beside if h in topo.distribution_hosts else 1) for h in topo.hosts}


def describe_job_port_restarts(settings: LaunchSettings, host_count: int, what: str) -> list[str]:
    """A job-port family's note on BYOC_MAX_RESTARTS across hosts (what: what the leader starts
    again on every host); none on one host or without restarts."""
    if not settings.max_restarts or host_count < 2:
        return []
    return [f"BYOC_MAX_RESTARTS={settings.max_restarts} on {host_count} hosts: after a failure the leader restarts "
            f"{what} on every host, once every host's processes of the failed attempt are gone, each attempt with "
            f"a rendezvous of its own; a lost host is not replaced (the job fails)"]


# The role objects (roles/) a family's decide_role names: (module, class, keyword arguments).
ONE_HOST_ROLE = ("entrypoint.roles.single", "SingleHost", {})


def decide_job_port_role(plan: LaunchPlan, watch_rendezvous: bool) -> tuple[str, str, dict]:
    """A job-port family's role here (torchrun, the parameter server): on one host, the one
    host's; else the leader's or a worker's (roles/job_port.py)."""
    if not plan.multi_host:
        return ONE_HOST_ROLE
    if plan.is_leader:
        return "entrypoint.roles.job_port", "JobPortLeader", {}
    return "entrypoint.roles.job_port", "JobPortWorker", {"watch_rendezvous": watch_rendezvous}

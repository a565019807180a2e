"""Decide how to launch: one pure function from what was read to a LaunchPlan.

The plan holds exact argv tuples and the environment to add; `--dry-run` prints it and
entrypoint.orchestrate runs it. Nothing here touches the machine.
"""

from __future__ import annotations

import os
from enum import StrEnum
from typing import TYPE_CHECKING, NamedTuple

from entrypoint.decide import threads, topology
from entrypoint.job.config import JobConfig
from entrypoint.job.json_text import build_json
from entrypoint.decide.distribution import MPI_BASED, Distribution
from entrypoint.decide.restarts import ATTEMPT_ENV, build_attempt_rendezvous_id
from entrypoint.decide.settings import decide_capacity_stop_at
from entrypoint.errors import JobDefinitionError
from entrypoint.decide.gpu_env import build_gpu_env
from entrypoint.decide.neuron_env import build_neuron_cache_env
from entrypoint.decide.compile_cache import CompileCache, decide_compile_cache
from entrypoint.job.probe import MachineFacts
from entrypoint.job.program import (
    CodeFacts,
    CodeSource,
    EntryPoint,
    build_install_steps,
    build_program_argv,
    decide_entry_point,
)
from entrypoint.decide.smenv import build_sm_env, build_user_args
from entrypoint.decide.specs import ProcessSpec, RuntimeFiles, build_sha256_hex
# The ranks read them: the plan sets them in the rank's own copy of the job port's words.
from entrypoint.rank.record_errors import JOB_KEY_ENV, JOB_KEY_OLD_ENV, JOB_PORTS_ENV
from entrypoint.decide.job_report import REPORT_DIR_ENV, ReportSpec, decide_report_spec, decide_tensorboard_dir
from entrypoint.settings import DEFAULTS, LaunchSettings

if TYPE_CHECKING:  # decide/health.py is imported only when the job asks for the check
    from entrypoint.decide.health import HealthCheck

RECORD_ERRORS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "rank", "record_errors.py")
# torchrun itself, run by path: it also reports a rank killed by a signal as the root cause.
LAUNCH_TORCHRUN = os.path.join(os.path.dirname(RECORD_ERRORS), "launch_torchrun.py")
NEURON_ROOT_COMM_PORT = 46820

# Environment names forwarded to remote ranks by `mpirun -x NAME` (the value never appears on
# the command line), besides everything the plan itself adds.
FORWARDED_NAMES = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "LANG", "LC_ALL", "TRAINING_JOB_NAME")
FORWARDED_PREFIXES = ("NCCL_", "FI_", "TORCH_", "CUDA_", "OMP_", "MKL_", "HF_", "PYTHON", "BYOC_", "AWS_", "NEURON_", "XLA_")


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


# Options that change what Open MPI writes of the ranks' output: a user who sets one keeps
# --tag-output's forwarding (the files would hold their tags or timestamps).
_OUTPUT_OPTIONS = frozenset({"output-filename", "tag-output", "timestamp-output", "xml", "merge-stderr-to-stdout",
                             "orte_output_filename", "orte_tag_output", "orte_timestamp_output", "orte_xml_output"})


def decide_rank_output(topo: topology.Topology, custom_options: tuple[str, ...], runtime: Runtime) -> str:
    """Where mpirun's daemons write each rank's output, or "" for --tag-output (a user's own
    output option). Each host's daemon writes its ranks' files (run/rank_output.py), which hold
    each rank's text as written, where --tag-output's tags cannot be told from the same text
    inside a rank's line (run/tagged_lines.py). The folder's path is the same on every host
    (runtime_dirs.py): the leader follows its own, and each worker follows its own in an SSH
    session that streams the lines to the leader (hosts/worker_output.py)."""
    named = {token.lstrip("-").split("=")[0] for token in custom_options if token.startswith("-")}
    named |= {value for option, value in zip(custom_options, custom_options[1:]) if option in ("-mca", "--mca")}
    if named & _OUTPUT_OPTIONS:
        return ""
    return runtime.files.rank_output


def build_output_options(topo: topology.Topology, custom_options: tuple[str, ...], runtime: Runtime) -> list[str]:
    folder = decide_rank_output(topo, custom_options, runtime)
    # nocopy: the daemon forwards nothing to mpirun, whose own messages alone remain on its pipes.
    return ["--output-filename", f"{folder}:nocopy"] if folder else ["--tag-output"]


def decide_launch_radix(hosts: int) -> int:
    """How many hosts each Open MPI daemon starts (routed_radix, with tree spawn): the fewest
    that reach every worker in two levels (r + r^2), about the square root, so at 256 hosts
    mpirun opens 16 SSH sessions and each of those daemons at most 16 more (sshd's MaxStartups,
    10:30:100 by default, counts a host's unauthenticated connections at once: one parent each
    stays far below it)."""
    workers, radix = max(0, hosts - 1), 1
    while radix + radix * radix < workers:
        radix += 1
    return radix


def build_mpirun_argv(
    topo: topology.Topology,
    num_processes: int,
    forwarded: tuple[str, ...],
    custom_options: tuple[str, ...],
    program_argv: tuple[str, ...],
    runtime: Runtime,
    efa: bool,
) -> tuple[str, ...]:
    """The toolkit's proven mpirun flags; environment forwarded by name only."""
    interface = topo.interface
    argv = [
        "mpirun",
        "--host", ",".join(f"{h}:{topo.processes_per_host}" for h in topo.distribution_hosts),
        "-np", str(num_processes),
        "--allow-run-as-root",
        *build_output_options(topo, custom_options, runtime),
        "-mca", "plm_rsh_agent", f"ssh -F {runtime.files.ssh_config}",
        "-mca", "btl_tcp_if_include", interface,
        "-mca", "oob_tcp_if_include", interface,
        # Tree spawn: mpirun reaches launch_radix hosts itself, and each host's daemon the next
        # ones (every host trusts every host's per-job key: roles/mpi.py). One ssh per host
        # from mpirun cost the leader ~150 ms of CPU a host (docs/benchmarks-multihost.md).
        "-mca", "plm_rsh_no_tree_spawn", "0",
        "-mca", "routed_radix", str(decide_launch_radix(len(topo.distribution_hosts))),
        "-bind-to", "none",
        "-map-by", "slot",
        "-mca", "pml", "ob1",
        # Without EFA, also leave out Open MPI's ofi btl: it adds ~1 s to MPI_Finalize and
        # ~0.3 s to MPI_Init here, for nothing (Debian's default list excludes it too).
        "-mca", "btl", "^openib" if efa else "^openib,ofi",
        "-mca", "orte_abort_on_non_zero_status", "1",
        "-mca", "btl_vader_single_copy_mechanism", "none",
        # How long Open MPI waits between the signals when it tears a job down after a rank
        # failed. Open MPI 4 sleeps it unconditionally, twice (SIGCONT, wait, SIGTERM, wait,
        # SIGKILL), first on the leader and then on every worker: tying it to the 90 s grace
        # period made a failed rank take 6 minutes to end the job. The grace period is for
        # stop requests, which every host's entrypoint forwards to its own ranks directly
        # (ProcessSpec.signal_ranks, roles/mpi.forward_stop_to_ranks). Open MPI's default, 1.
        "-mca", "odls_base_sigkill_timeout", str(DEFAULTS.mpi_teardown_signal_gap_s),
    ]
    for name in forwarded:
        argv += ["-x", name]
    argv += list(custom_options)
    argv += list(program_argv)
    return tuple(argv)


def build_torchrun_argv(
    python: str,
    topo: topology.Topology,
    settings: LaunchSettings,
    program_argv: tuple[str, ...],
) -> tuple[str, ...]:
    """The same command on every host; node rank from the host order.

    One host: --standalone (a free local port, so two single-host jobs on one machine never
    collide). program_argv's python runs under torchrun's own interpreter."""
    argv = [python, LAUNCH_TORCHRUN]  # `python -m torch.distributed.run`, reporting signal deaths
    hosts, leader = topo.distribution_hosts, topo.leader
    if len(hosts) == 1:
        argv += ["--standalone", "--nnodes", "1"]
    else:
        # The static rendezvous, one per attempt: a restart across hosts is the entrypoint's
        # (roles/attempts.py), which starts every host's torchrun again only once every
        # process of the failed attempt is gone, with the attempt's own --rdzv_id (torchrun
        # keeps its store's keys under it). torch's elastic restarts across hosts handed a
        # restarted rank the failed attempt's peers (gloo: Connection refused / Read error).
        argv += [
            "--nnodes", str(len(hosts)),
            "--node_rank", str(topo.node_rank),
            "--master_addr", leader,
            "--master_port", str(settings.master_port),
            "--rdzv_id", build_attempt_rendezvous_id(1),
        ]
    # One host: torchrun restarts its ranks itself; several: the entrypoint does (0 here).
    restarts = settings.max_restarts if len(hosts) == 1 else 0
    argv += ["--nproc_per_node", str(topo.processes_per_host), "--max_restarts", str(restarts)]
    if program_argv[:1] == (python,):
        argv += list(program_argv[1:])  # torchrun starts the python itself
    else:
        argv += ["--no-python", *program_argv]
    if settings.neuron_parallel_compile:
        argv = ["neuron_parallel_compile", *argv]
    return tuple(argv)


def build_parameter_server_processes(
    python: str,
    topo: topology.Topology,
    program_argv: tuple[str, ...],
) -> tuple[ProcessSpec, ...]:
    """One PS shard per host (torch.distributed.rpc ranks 0..H-1) plus the worker processes
    (ranks H..). Rendezvous: MASTER_ADDR/MASTER_PORT from the plan's env."""
    host_index, workers_per_host = topo.node_rank, topo.processes_per_host
    n_hosts = len(topo.distribution_hosts)
    n_workers = n_hosts * workers_per_host
    common = (
        ("WORLD_SIZE", str(n_hosts + n_workers)),
        ("BYOC_PS_SERVERS", ",".join(f"ps{i}" for i in range(n_hosts))),
        ("BYOC_NUM_WORKERS", str(n_workers)),
    )
    server = ProcessSpec(
        name=f"ps{host_index}",
        argv=(python, "-m", "train.ps_server"),
        env=common + (("RANK", str(host_index)), ("LOCAL_RANK", "0"), ("BYOC_PS_ROLE", "server")),
        # Not the code folder: a user's train.py there would shadow our train package.
        cwd="/",
    )
    workers = []
    for local in range(workers_per_host):
        worker_rank = host_index * workers_per_host + local
        workers.append(
            ProcessSpec(
                name=f"worker{worker_rank}",
                argv=program_argv,
                env=common
                + (
                    ("RANK", str(n_hosts + worker_rank)),
                    ("LOCAL_RANK", str(local)),
                    ("BYOC_PS_ROLE", "worker"),
                    ("BYOC_WORKER_RANK", str(worker_rank)),
                ),
            )
        )
    return (server, *workers)


def forwarded_names(plan_env: dict[str, str], environ: dict[str, str]) -> tuple[str, ...]:
    names = set(plan_env)
    names.update(n for n in environ if n in FORWARDED_NAMES or n.startswith(FORWARDED_PREFIXES))
    return tuple(sorted(names))


class _Shared(NamedTuple):
    """What every plan of a job has whatever this host's role: decide's first half."""

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


def build_plan(shared: _Shared, role: Role, processes: tuple[ProcessSpec, ...], extra_env: dict[str, str],
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


def decide_launcher_kind(dist: Distribution, facts: MachineFacts) -> tuple[str, list[str]]:
    """The launcher that runs the job here: smdataparallel without AWS's SMDDP library runs
    with torchrun."""
    if dist.launcher == "smdataparallel" and not facts.smddprun:
        return "torch_distributed", [
            "smdistributed dataparallel requested but AWS's SMDDP library is not in this image; "
            "launching with torchrun instead (use backend \"nccl\", not \"smddp\", in the script)"]
    return dist.launcher, []


def describe_restart_limits(settings: LaunchSettings, launcher: str, launcher_kind: str, host_count: int) -> list[str]:
    if not settings.max_restarts or host_count < 2 or launcher_kind != "torch_distributed" and \
            launcher != "parameter_server":
        return []
    what = "the parameter server's processes" if launcher == "parameter_server" else "torchrun"
    return [f"BYOC_MAX_RESTARTS={settings.max_restarts} on {host_count} hosts: after a failure the leader restarts "
            f"{what} on every host, once every host's processes of the failed attempt are gone, each attempt with "
            f"a rendezvous of its own; a lost host is not replaced (the job fails)"]


def describe_capacity_end(settings: LaunchSettings, stop_at: float | None) -> list[str]:
    from entrypoint.decide.capacity import CAPACITY_END_ENV, describe_utc

    if settings.capacity_end_unreadable is not None:
        return [f"{CAPACITY_END_ENV}={settings.capacity_end_unreadable!r} is not a time this image reads (epoch "
                f"seconds, epoch milliseconds or ISO 8601): the job is not stopped before the training plan's "
                f"capacity ends"]
    if stop_at is None:
        return []
    return [f"training plan: the capacity ends at {describe_utc(settings.capacity_ends_at)} and its instances are "
            f"terminated from 30 minutes before; every host stops its processes at {describe_utc(stop_at)} (SIGTERM, "
            f"then {settings.grace_period_s:g} s, BYOC_GRACE_PERIOD_S; BYOC_CAPACITY_STOP_LEAD_S moves it)"]


def decide(
    job: JobConfig,
    dist: Distribution,
    facts: MachineFacts,
    settings: LaunchSettings,
    runtime: Runtime,
    code: CodeSource,
    code_facts: CodeFacts,
    program: str,
) -> LaunchPlan:
    notes = list(dist.notes)
    topo = topology.decide_topology(job, facts, dist)
    if topo.interface_note:
        notes.append(topo.interface_note)
    code_dir = job.paths.code_dir
    if job.sdk_v3 is not None:  # an SDK v3 ModelTrainer job: v3's rules for the program (decide/v3_launch.py)
        from entrypoint.decide import v3_launch

        entry, program_argv, install = v3_launch.decide_v3_program(job, code_facts, runtime.python, RECORD_ERRORS)
    else:
        entry = decide_entry_point(program, code_dir, code_facts)
        program_argv = build_program_argv(entry, runtime.python, code_facts, build_user_args(job.hyperparameters.user),
                                          RECORD_ERRORS)
        install = build_install_steps(runtime.python, code_dir, code_facts)
    gpu_env, gpu_notes = build_gpu_env(job.environ, facts, topo.interface)
    notes.extend(gpu_notes)
    neuron_env, neuron_notes = build_neuron_cache_env(job.environ, facts.neuron_core_count,
                                                      settings.neuron_parallel_compile, job.checkpoint)
    notes.extend(neuron_notes)
    compile_cache, compile_env, compile_notes = decide_compile_cache(
        job.environ, job.checkpoint, job.resource.hosts.index(job.resource.current_host), settings.compile_cache,
        settings.compile_cache_max_mb, settings.compile_cache_save_every_s, settings.compile_cache_dir)
    notes.extend(compile_notes)
    launcher_kind, kind_notes = decide_launcher_kind(dist, facts)
    notes.extend(kind_notes)
    notes.extend(n for n in (topo.gpu_share_note, topo.processes_per_host_note) if n)
    notes.extend(describe_restart_limits(settings, dist.launcher, launcher_kind, len(topo.distribution_hosts)))
    capacity_stop_at = decide_capacity_stop_at(settings)
    notes.extend(describe_capacity_end(settings, capacity_stop_at))
    tensorboard_dir = decide_tensorboard_dir(settings.tensorboard, job.tensorboard_path,
                                             os.path.join(job.paths.output_dir, "tensorboard"))
    thread_env, thread_note = threads.build_thread_env(job.environ, facts, topo, job.resource.current_instance_type,
                                                       launcher_kind)
    notes.append(thread_note)
    report = decide_report_spec(settings.report, settings.report_interval_s, runtime.files.folder, facts.gpu_count,
                                facts.neuron_core_count, tensorboard_dir, settings.live_interval_s,
                                settings.status_interval_s)
    report_env = {REPORT_DIR_ENV: report.rank_folder} if report else {}
    sm_env = build_sm_env(job, facts, topo)
    if job.sdk_v3 is not None:
        sm_env.update(v3_launch.build_v3_env(job, topo, sm_env, settings.master_port))
    shared = _Shared(job, topo, dist.launcher, code, entry, install,
                     {**sm_env, **gpu_env, **topology.build_gpu_share_env(topo), **neuron_env,
                      **compile_env, **report_env, **thread_env}, settings, runtime, notes, capacity_stop_at)
    plan = decide_role_plan(shared, dist, facts, launcher_kind, program_argv)._replace(report=report,
                                                                                       compile_cache=compile_cache)
    return decide_health_check(plan, job, facts, topo, runtime.python) if settings.health_check else plan


def decide_health_check(plan: LaunchPlan, job: JobConfig, facts: MachineFacts, topo: topology.Topology,
                        python: str) -> LaunchPlan:
    """BYOC_HEALTH_CHECK=deep: the check's processes on this host, in the plan. The hosts of a
    distributed launch check together (across hosts too); any other host checks on its own."""
    from entrypoint.decide import health

    together = plan.role in DISTRIBUTED_ROLES or plan.role == Role.MPI_WORKER
    hosts = topo.distribution_hosts if together else (plan.current_host,)
    ranks = (len(topo.gpu_share) if topo.gpu_share else facts.gpu_count) or topo.processes_per_host
    why_not = health.decide_not_run(facts.gpu_count, facts.neuron_core_count, len(hosts), ranks)
    if why_not:
        return plan._replace(notes=plan.notes + (why_not,))
    check = health.build_health_check(plan.settings, python, job.resource.current_instance_type, hosts,
                                      plan.current_host, topo.leader, ranks, bool(facts.gpu_count), plan.files.folder)
    return plan._replace(health_check=check, notes=plan.notes + (health.describe_health_check(check),))


def decide_role_plan(shared: _Shared, dist: Distribution, facts: MachineFacts, launcher_kind: str,
                     program_argv: tuple[str, ...]) -> LaunchPlan:
    job, topo, settings = shared.job, shared.topo, shared.settings
    rendezvous_env = build_rendezvous_env(job, topo, settings)
    script = (ProcessSpec("script", program_argv),)
    if dist.launcher == "process":
        return build_plan(shared, Role.SINGLE, script, rendezvous_env, hosts=(job.resource.current_host,))
    if not topo.in_distribution:
        shared.notes.append(
            f"{job.resource.current_host} is in instance group \"{job.resource.current_group_name}\", "
            f"outside the distribution's groups ({', '.join(topo.distribution_groups)}); "
            f"running the script once here, as the toolkit does"
        )
        return build_plan(shared, Role.OUTSIDE_DISTRIBUTION, script, rendezvous_env)

    launcher_env = {**build_launcher_env(job, facts, topo, settings), **build_hostname_env(job, facts)}
    if launcher_kind in MPI_BASED:
        return decide_mpi_plan(shared, dist, facts, launcher_kind, program_argv, launcher_env)
    launcher_env.update(build_job_port_env(job, topo, settings))
    if launcher_kind == "torch_distributed":
        argv = build_torchrun_argv(shared.runtime.python, topo, settings=settings, program_argv=program_argv)
        return build_plan(shared, Role.TORCHRUN, (ProcessSpec("torchrun", argv),), launcher_env)
    if launcher_kind == "parameter_server":
        processes = build_parameter_server_processes(shared.runtime.python, topo, program_argv)
        return build_plan(shared, Role.PARAMETER_SERVER, processes, launcher_env)
    raise AssertionError(f"unhandled launcher {launcher_kind}")  # parse_distribution lists them all


def decide_mpi_plan(shared: _Shared, dist: Distribution, facts: MachineFacts, launcher_kind: str,
                    program_argv: tuple[str, ...], launcher_env: dict[str, str]) -> LaunchPlan:
    topo, runtime = shared.topo, shared.runtime
    if dist.np_option is not None:  # SDK v3's -np: the plan's count, or the job is refused (on every host)
        from entrypoint.decide.v3_launch import check_v3_process_count

        check_v3_process_count(dist.np_option, dist.processes_per_host is not None, topo)
    np_ = topo.world_size
    if dist.num_processes is not None:
        if dist.num_processes > topo.world_size:
            raise JobDefinitionError(
                f"sagemaker_mpi_num_processes is {dist.num_processes}, more than the "
                f"{topo.world_size} slots of {len(topo.distribution_hosts)} host(s) x {topo.processes_per_host} "
                f"process(es) per host. Lower it or raise sagemaker_mpi_num_of_processes_per_host."
            )
        np_ = dist.num_processes
    if len(topo.distribution_hosts) > 1 and runtime.files.key_note:
        shared.notes.append(runtime.files.key_note)
    # Each host's ranks take that host's own SM_* values (entrypoint/roles/mpi.py).
    launcher_env["BYOC_HOST_ENV_FILE"] = runtime.files.host_env
    # The job port's key, for the hosts' words (readiness, keys, asks, the outcome): not in the
    # ranks' environment under mpirun (their root causes reach the leader with their output).
    job_key = build_job_key(shared.job, topo.distribution_hosts, shared.settings.job_secret)
    if not topo.is_leader:
        return build_plan(shared, Role.MPI_WORKER, (), launcher_env)._replace(job_key=job_key)
    if program_argv[1:2] != (RECORD_ERRORS,):
        # A shell script or an executable: the rank wrapper applies the host's values, then
        # becomes the program (record_errors.py --exec), as it does for a Python rank.
        program_argv = (runtime.python, RECORD_ERRORS, "--exec", *program_argv)
    if launcher_kind == "smdataparallel":
        program_argv = ("smddprun", *program_argv)
    # BYOC_ATTEMPT: each attempt's mpirun has it (restarts.build_attempt_processes); every
    # host's ranks see the same number only if it is forwarded.
    forwarded = forwarded_names({**shared.env, **launcher_env, ATTEMPT_ENV: ""}, dict(shared.job.environ))
    argv = build_mpirun_argv(topo, np_, forwarded, dist.custom_mpi_options, program_argv, runtime, efa=facts.efa)
    spec = ProcessSpec("mpirun", argv, signal_ranks=True,
                       rank_output=decide_rank_output(topo, dist.custom_mpi_options, runtime))
    return build_plan(shared, Role.MPI_LEADER, (spec,), launcher_env)._replace(job_key=job_key)


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

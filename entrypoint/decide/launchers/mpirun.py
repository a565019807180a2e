"""The mpirun family (mpi, pytorchddp, smdataparallel): the leader runs mpirun, which starts
every host's ranks over SSH as a tree; each worker serves SSH until the leader's outcome. Its
plan (the argv, what is forwarded, where the ranks' output goes), its roles (roles/mpi.py),
whether it restarts (the leader relaunches mpirun: every rank is its), and its wording."""

from __future__ import annotations

from entrypoint.decide import topology
from entrypoint.decide.distribution import MPI_BASED, Distribution
from entrypoint.decide.launch_plan import (ONE_HOST_ROLE, RECORD_ERRORS, LaunchPlan, PlanBasis, Role, Runtime,
                                           build_job_key, build_plan, decide_distribution_processes)
from entrypoint.decide.restarts import ATTEMPT_ENV
from entrypoint.decide.specs import ProcessSpec
from entrypoint.errors import JobDefinitionError
from entrypoint.job.probe import MachineFacts
from entrypoint.settings import DEFAULTS, LaunchSettings

NAME = "mpirun"
KINDS = MPI_BASED
ROLES = (Role.MPI_LEADER, Role.MPI_WORKER)

# Environment names forwarded to remote ranks by `mpirun -x NAME` (the value never appears on
# the command line), besides everything the plan itself adds.
FORWARDED_NAMES = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "LANG", "LC_ALL", "TRAINING_JOB_NAME")
FORWARDED_PREFIXES = ("NCCL_", "FI_", "TORCH_", "CUDA_", "OMP_", "MKL_", "HF_", "PYTHON", "BYOC_", "AWS_", "NEURON_", "XLA_")


def describe(plan: LaunchPlan) -> str:
    if plan.role == Role.MPI_LEADER:
        return f"mpirun on {len(plan.hosts)} host(s)"
    return f"{plan.entry.program} ({plan.role})"


def decide_relaunched(plan: LaunchPlan) -> bool:
    """The leader starts mpirun again after a failure (every rank of the job is its); a
    worker's ranks are mpirun's."""
    return plan.role == Role.MPI_LEADER


def describe_restart_limits(settings: LaunchSettings, host_count: int) -> list[str]:
    return []


def decide_role(plan: LaunchPlan) -> tuple[str, str, dict]:
    if plan.role == Role.MPI_WORKER:
        return "entrypoint.roles.mpi", "MpiWorker", {}
    return ("entrypoint.roles.mpi", "MpiLeader", {}) if plan.multi_host else ONE_HOST_ROLE


def decide_host_processes(topo: topology.Topology) -> dict[str, int]:
    return decide_distribution_processes(topo)


def forwarded_names(plan_env: dict[str, str], environ: dict[str, str]) -> tuple[str, ...]:
    names = set(plan_env)
    names.update(n for n in environ if n in FORWARDED_NAMES or n.startswith(FORWARDED_PREFIXES))
    return tuple(sorted(names))


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


def decide_teardown_gap_s(max_restarts: int) -> int:
    """Open MPI's gap between the signals of its teardown after a rank failed: its default (1 s,
    slept twice on every host: 4-6 s of a restart here, docs/benchmarks-training.md), or none
    where the job restarts in place (BYOC_MAX_RESTARTS): the failed attempt's ranks are thrown
    away and nothing of theirs is kept, so nothing needs that grace. A stop request does not use
    it (each host signals its own ranks, with the grace period); only the ranks of a script that
    exit on a stop without agreeing on it first are ended at once when one exits, not a second
    later (train/'s trainers write the stop's checkpoint, then meet at a barrier, then exit)."""
    return 0 if max_restarts > 0 else DEFAULTS.mpi_teardown_signal_gap_s


def build_mpirun_argv(
    topo: topology.Topology,
    num_processes: int,
    forwarded: tuple[str, ...],
    custom_options: tuple[str, ...],
    program_argv: tuple[str, ...],
    runtime: Runtime,
    efa: bool,
    teardown_gap_s: int = DEFAULTS.mpi_teardown_signal_gap_s,
) -> tuple[str, ...]:
    """The toolkit's proven mpirun flags; environment forwarded by name only. teardown_gap_s:
    decide_teardown_gap_s."""
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
        # (ProcessSpec.signal_ranks, run/supervise.Adopted). Open MPI's default, 1;
        # 0 where the failed attempt is restarted (decide_teardown_gap_s).
        "-mca", "odls_base_sigkill_timeout", str(teardown_gap_s),
    ]
    for name in forwarded:
        argv += ["-x", name]
    argv += list(custom_options)
    argv += list(program_argv)
    return tuple(argv)


def decide_plan(shared: PlanBasis, dist: Distribution, facts: MachineFacts, launcher_kind: str,
                program_argv: tuple[str, ...], launcher_env: dict[str, str]) -> LaunchPlan:
    """mpirun on the leader, over SSH to every host (roles/mpi.py); each worker serves it."""
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
    argv = build_mpirun_argv(topo, np_, forwarded, dist.custom_mpi_options, program_argv, runtime, efa=facts.efa,
                             teardown_gap_s=decide_teardown_gap_s(shared.settings.max_restarts))
    spec = ProcessSpec("mpirun", argv, signal_ranks=True,
                       rank_output=decide_rank_output(topo, dist.custom_mpi_options, runtime))
    return build_plan(shared, Role.MPI_LEADER, (spec,), launcher_env)._replace(job_key=job_key)

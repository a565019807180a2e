"""Every timeout, interval and port of a launch, in one record (a value: it imports nothing of
the project).

SETTINGS declares each setting a job sets in its environment once, as torch's launcher and
TorchX declare their options: its field, environment name, kind, default, bounds and one line
of help. decide/settings.py reads the environment by walking it (a bad value is a bad job
definition), LaunchSettings takes its first group of fields and their defaults from it, and
tests/docs/test_settings_table.py holds the docs' settings tables to it. The record's second
group is fixed: numbers no job sets, each with why it is that value. A module that waits,
polls or gives up takes its number from a LaunchSettings (the plan's, `plan.settings`) or,
where no plan reaches it (a helper that runs without one, a probe of the machine before the
plan), from DEFAULTS, so no number hides as a module constant or a bare literal
(tests/entrypoint/test_layout.py holds both). It sits below every room (LAYERS), so the reads
(job/) take their timeouts from it too.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Setting(NamedTuple):
    """One setting of the job's environment (a row of SETTINGS)."""

    field: str  # LaunchSettings' field
    env: str  # the environment variable
    # int, float: a number by decide/numbers.py's one rule, within low..high; bool: a switch
    # (1/on/true/yes, 0/off/false/no); str: words, read by its `parser`
    kind: type
    default: Any  # when the variable is unset or empty
    help: str  # one line: what it sets
    low: float | None = None  # a number's bounds, both included; no high: none
    high: float | None = None
    old_env: str = ""  # the name it had before, read when env is unset or empty
    # The default is this field's value + offset when that is within high (a port beside
    # another), else `default`.
    follows: str = ""
    offset: int = 0
    zero_is_off: bool = False  # 0 turns it off, though below low
    none_means: str = ""  # what a default of None stands for
    parser: str = ""  # a reader of its own in decide/settings.py (PARSERS): not a number or a switch


# The longest duration any setting may give, seconds (SageMaker's longest MaxRuntimeInSeconds:
# 28 days).
# Every deadline and timer is built from a setting within it, so none overflows what the clock
# and the kernel hold (BYOC_PEER_WAIT_TIMEOUT_S=1e10 once passed and then crashed the finish).
MAX_DURATION = 28 * 24 * 3600.0

SETTINGS: tuple[Setting, ...] = (
    Setting("master_port", "BYOC_MASTER_PORT", int, 7777, "torchrun's (and rpc's) rendezvous port on the leader",
            1, 65535),
    # Restarts in place are for transient crashes; a job failing the same way a hundred times
    # is not transient. BYOC_TORCHRUN_MAX_RESTARTS: its name from before restarts covered every
    # launcher.
    Setting("max_restarts", "BYOC_MAX_RESTARTS", int, 0, "restarts in place after a rank fails (decide/restarts.py)",
            0, 100, old_env="BYOC_TORCHRUN_MAX_RESTARTS"),
    # A torchrun that has imported torch forks its ranks (decide/launchers/torchrun.py): a rank
    # starts, and a restart comes back, without its own import of torch (1-2 s a start); the
    # rank wrapper makes a forked rank what a started one is (rank/record_errors.py).
    Setting("fork_ranks", "BYOC_FORK_RANKS", bool, True,
            "torchrun forks its Python ranks, torch imported, instead of starting each one's interpreter"),
    Setting("grace_period_s", "BYOC_GRACE_PERIOD_S", float, 90.0,
            "SIGTERM to SIGKILL when the job is stopped (StopTrainingJob allows 120 s)", 0.0, MAX_DURATION),
    Setting("host_resolution_timeout_s", "BYOC_HOST_RESOLUTION_TIMEOUT_S", float, 300.0,
            "how long a multi-host launch waits for its hosts' names to resolve", 0.0, MAX_DURATION),
    Setting("neuron_parallel_compile", "RUN_NEURON_PARALLEL_COMPILE", bool, False,
            "Neuron's own: 1 pre-compiles the graphs (neuron_parallel_compile); anything else is off",
            parser="exactly_one"),
    Setting("ssh_port", "BYOC_SSH_PORT", int, 22, "sshd's port on every host (mpirun)", 1, 65535),
    Setting("peer_wait_timeout_s", "BYOC_PEER_WAIT_TIMEOUT_S", float, 300.0,
            "a peer's first answer (SSH, the leader's ports), and a host's last word at the end", 0.0, MAX_DURATION),
    Setting("host_lost_timeout_s", "BYOC_HOST_LOST_TIMEOUT_S", float, 30.0,
            "silence on its port after which a host counts as lost", 1.0, 60.0),
    Setting("job_port", "BYOC_JOB_PORT", int, 7778, "each host's liveness port, which takes the hosts' signed words",
            1, 65535, follows="master_port", offset=1),
    Setting("hang_timeout_s", "BYOC_HANG_TIMEOUT_S", float, 0.0,
            "output silence after which the job counts as hung (stacks, exit 124); 0: off", 0.0, MAX_DURATION),
    # The deep health check before the training (decide/health.py, run/health_check.py).
    Setting("health_check", "BYOC_HEALTH_CHECK", str, "",
            "\"deep\": an all-reduce across the GPUs before the training; \"\" or \"off\": none",
            parser="health_check"),
    Setting("health_check_min_fraction", "BYOC_HEALTH_CHECK_MIN_FRACTION", float, 0.5,
            "the deep health check fails below this fraction of the expected bus bandwidth", 0.0, 1.0),
    Setting("health_check_host_gbps", "BYOC_HEALTH_CHECK_HOST_GBPS", float, 0.0,
            "the bus bandwidth expected within a host, GB/s; 0: the instance table's", 0.0),
    Setting("health_check_job_gbps", "BYOC_HEALTH_CHECK_JOB_GBPS", float, 0.0,
            "the bus bandwidth expected across hosts, GB/s; 0: the instance table's", 0.0),
    Setting("health_check_mib", "BYOC_HEALTH_CHECK_MIB", int, 1024, "the deep health check's all-reduce, MiB",
            1, 65536),
    Setting("health_check_port", "BYOC_HEALTH_CHECK_PORT", int, 7779, "the deep health check's rendezvous port",
            1, 65535, follows="master_port", offset=2),
    Setting("health_check_timeout_s", "BYOC_HEALTH_CHECK_TIMEOUT_S", float, 600.0,
            "the whole deep health check, the wait for the other hosts included", 1.0, MAX_DURATION),
    # The job report (entrypoint/jobreport/, docs/job-report.md).
    Setting("report", "BYOC_REPORT", bool, True, "the job report (output/data/report/)"),
    Setting("report_interval_s", "BYOC_REPORT_INTERVAL_S", float, 1.0, "how often the job report samples each host",
            0.1, 60.0),
    # The job watched live (jobreport/live/, docs/job-report.md).
    Setting("tensorboard", "BYOC_TENSORBOARD", bool, None,
            "the live TensorBoard scalars: 1 on without a TensorBoard output config, 0 off with one",
            none_means="the config"),
    Setting("live_interval_s", "BYOC_LIVE_INTERVAL_S", float, 10.0,
            "how often the TensorBoard scalars and a worker's live figures move", 0.5, 3600.0),
    Setting("status_interval_s", "BYOC_STATUS_INTERVAL_S", float, 300.0, "how often the status line is logged; 0: off",
            1.0, 86400.0, zero_is_off=True),
    # torch.compile's caches kept between jobs (decide/compile_cache.py, run/compile_cache.py).
    Setting("compile_cache", "BYOC_COMPILE_CACHE", bool, True, "torch.compile's caches kept in the checkpoint folder"),
    Setting("compile_cache_max_mb", "BYOC_COMPILE_CACHE_MAX_MB", int, 1024,
            "the compile cache folder's bound, MB: least recently used files go first", 1, 1 << 20),
    Setting("compile_cache_save_every_s", "BYOC_COMPILE_CACHE_SAVE_EVERY_S", float, 600.0,
            "how often the compile cache's archive is written; 0: only at the end and on a stop", 0.0, MAX_DURATION),
    # The training plan's capacity end (epoch s, decide/capacity.py): None without one; the raw
    # value when it could not be read (the plan says so, and nothing is stopped).
    Setting("capacity_ends_at", "SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP", float, None,
            "SageMaker's: when the training plan's capacity ends", none_means="no end", parser="capacity_end"),
    Setting("capacity_end_unreadable", "SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP", str, None,
            "the capacity's end as given, when it is no time this image reads", none_means="readable",
            parser="capacity_end_unreadable"),
    Setting("capacity_stop_lead", "BYOC_CAPACITY_STOP_LEAD_S", float, None,
            "how long before the capacity's termination begins every host stops its processes", 0.0, MAX_DURATION,
            none_means="the grace period"),
    # Folders and words (parser "folder": an absolute path; "text": any words).
    Setting("runtime_dir", "BYOC_RUNTIME_DIR", str, None,
            "where each job's own folder job-<id> goes (run/runtime_dirs.py)", none_means="/run/byoc",
            parser="folder"),
    Setting("compile_cache_dir", "BYOC_COMPILE_CACHE_DIR", str, None,
            "the host-local folder torch.compile works in (decide/compile_cache.py)",
            none_means="/var/tmp/byoc-compile-cache", parser="folder"),
    Setting("job_secret", "BYOC_JOB_SECRET", str, None, "mixed into the job port's key, the same on every host",
            none_means="(none)", parser="text"),
    # train/ddp_train.py's process group: a collective waiting for a peer that never joins fails
    # after this. The entrypoint refuses a bad value before the launch; the rank reads it by
    # the same row (decide/settings.parse_collective_timeout_s).
    Setting("collective_timeout_s", "BYOC_COLLECTIVE_TIMEOUT_S", float, None,
            "train/'s DDP: how long a collective waits for the other ranks, seconds", 1.0, MAX_DURATION,
            none_means="30 min"),
    Setting("collective_timeout_min", "BYOC_COLLECTIVE_TIMEOUT_MIN", float, None,
            "the same in minutes, when BYOC_COLLECTIVE_TIMEOUT_S is unset", 0.05, MAX_DURATION / 60,
            none_means="30 min"),
    # SDK v3: "sdk" hands a v3 job to v3's own drivers (job/v3_definition.py); read first of all.
    Setting("sdk_v3_drivers", "BYOC_SDK_V3_DRIVERS", str, None,
            "\"sdk\": SDK v3's own drivers run a v3 job; anything else: this image's launcher",
            none_means="ours", parser="v3_drivers"),
)
SETTINGS_BY_FIELD = {row.field: row for row in SETTINGS}


def _default(field: str) -> Any:
    return SETTINGS_BY_FIELD[field].default


class LaunchSettings(NamedTuple):
    # --- from the job's environment: SETTINGS, in its order (parse_launch_settings) ------------
    master_port: int = _default("master_port")
    max_restarts: int = _default("max_restarts")
    fork_ranks: bool = _default("fork_ranks")
    grace_period_s: float = _default("grace_period_s")
    host_resolution_timeout_s: float = _default("host_resolution_timeout_s")
    neuron_parallel_compile: bool = _default("neuron_parallel_compile")
    ssh_port: int = _default("ssh_port")
    peer_wait_timeout_s: float = _default("peer_wait_timeout_s")
    host_lost_timeout_s: float = _default("host_lost_timeout_s")
    job_port: int = _default("job_port")
    hang_timeout_s: float = _default("hang_timeout_s")
    health_check: str = _default("health_check")
    health_check_min_fraction: float = _default("health_check_min_fraction")
    health_check_host_gbps: float = _default("health_check_host_gbps")
    health_check_job_gbps: float = _default("health_check_job_gbps")
    health_check_mib: int = _default("health_check_mib")
    health_check_port: int = _default("health_check_port")
    health_check_timeout_s: float = _default("health_check_timeout_s")
    report: bool = _default("report")
    report_interval_s: float = _default("report_interval_s")
    tensorboard: bool | None = _default("tensorboard")
    live_interval_s: float = _default("live_interval_s")
    status_interval_s: float = _default("status_interval_s")
    compile_cache: bool = _default("compile_cache")
    compile_cache_max_mb: int = _default("compile_cache_max_mb")
    compile_cache_save_every_s: float = _default("compile_cache_save_every_s")
    capacity_ends_at: float | None = _default("capacity_ends_at")
    capacity_end_unreadable: str | None = _default("capacity_end_unreadable")
    capacity_stop_lead: float | None = _default("capacity_stop_lead")
    runtime_dir: str | None = _default("runtime_dir")
    compile_cache_dir: str | None = _default("compile_cache_dir")
    job_secret: str | None = _default("job_secret")
    collective_timeout_s: float | None = _default("collective_timeout_s")
    collective_timeout_min: float | None = _default("collective_timeout_min")
    sdk_v3_drivers: str | None = _default("sdk_v3_drivers")

    # --- fixed ----------------------------------------------------------------------------------
    # The longest a run goes without looking at its processes: an exit wakes it at once
    # (SIGCHLD posts ChildExited on the loop), so this only paces the hang check, the
    # capacity's stop time and an exit whose SIGCHLD the kernel handed another thread.
    process_poll_s: float = 0.1
    # How long after an attempt's processes started the next attempt's launcher is started
    # ahead, held (run/held.py): past this attempt's own start-up, so its import of torch does
    # not take the cores from this attempt's ranks as they import theirs.
    held_start_after_s: float = 10.0
    # How often a wait on something outside the process tree is polled (an MPI worker's
    # orphans, a process group that is ending).
    wait_poll_s: float = 0.05
    # How often a wait that nothing else wakes checks whether a stop signal arrived, or
    # retries a word to a peer.
    stop_check_s: float = 0.2
    # A host name that does not resolve yet is tried again after this, then twice as long each
    # time, up to resolve_longest_wait_s (SageMaker's DNS can lag at start: seconds, not minutes).
    resolve_first_wait_s: float = 0.1
    resolve_longest_wait_s: float = 5.0
    # How often a peer's port is probed (host-lost watch, a worker's last word, a closed port),
    # and how long one probe may take.
    peer_probe_every_s: float = 1.0
    peer_probe_timeout_s: float = 2.0
    # The probes a second a leader takes, at most (hosts/job_port.decide_probe_every_s spaces
    # the sweeps to keep it: at 1,024 hosts a sweep a second cost the leader a tenth of a core),
    # and the fewest within the time that makes a host lost.
    probes_a_second: float = 200.0
    probes_within_lost: int = 4
    # A worker host counts as gone (its part over, no word from it) when its port has not
    # answered for this long: one missed probe under load is not enough, and a word sent just
    # before the worker exited is read by then.
    worker_gone_after_s: float = 5.0
    # A worker retries this long to tell its leader that its part succeeded (not a refused
    # port: that leader has ended); a failing worker tries for host_done_failed_send_s, since its
    # leader may be what failed.
    host_done_send_s: float = 3.0
    host_done_failed_send_s: float = 1.0
    # A message signed before the job port opened is a replay; this much clock difference
    # between hosts is allowed.
    message_clock_skew_s: float = 60.0
    # How long the job port reads one connection's message.
    message_read_timeout_s: float = 5.0
    # How long the MPI leader waits for a worker's rank-output stream to open (hosts/worker_output.py).
    rank_stream_timeout_s: float = 30.0
    # How long a worker that has its outcome waits for the SSH sessions of its daemons to close.
    ssh_session_close_wait_s: float = 5.0
    # When one of the job's processes fails (or a host is lost), the others get SIGTERM, then
    # SIGKILL after this long. Not the grace period: that one is for a stop the platform asked
    # for (StopTrainingJob), where scripts checkpoint; every failure path ends within a minute.
    failure_stop_s: float = 10.0
    # A restart across the hosts of a job-port launch (roles/attempts.py): how long the leader
    # waits for every worker to say its processes of the failed attempt are gone (each ends
    # them within failure_stop_s, then its output within thread_join_s, then tells the leader).
    attempt_end_wait_s: float = 30.0
    # How long a tagged line's first piece (mpirun's output) waits for the rest.
    quiet_line_s: float = 0.5
    # A hung job: how long the ranks have to print their stacks, and the gap between asking
    # one rank and the next (their dumps would interleave).
    stack_wait_s: float = 3.0
    stack_request_gap_s: float = 0.1
    # Signals that come closer together than this are one burst: asked on and said once (a
    # script's loop of `kill -USR1` must not flood the log, nor ask the ranks 3,000 times); a
    # burst of stops is forwarded once (a second SIGTERM would kill a script that saved and is
    # ending: run/supervise.Supervisor.on_stop).
    signal_burst_s: float = 1.0
    # Open MPI's gap between SIGTERM and SIGKILL when it tears a failed job down
    # (odls_base_sigkill_timeout, whole seconds; see decide/launchers/mpirun.build_mpirun_argv).
    mpi_teardown_signal_gap_s: int = 1
    # One run of a machine tool at start (nvidia-smi, neuron-ls, fi_info).
    tool_probe_timeout_s: float = 20.0
    # How often SDK v3's SSH helper looks for its peers' keys (sdk_v3/peer_trust.py), and how
    # long one ssh-keyscan of a peer may take (its -T takes whole seconds): a peer's sshd answers
    # in milliseconds, and the helper tries again until BYOC_PEER_WAIT_TIMEOUT_S.
    v3_ssh_poll_s: float = 0.5
    v3_keyscan_timeout_s: int = 2
    # The MPI worker's ssh-keyscan of its leader's sshd (whole seconds: -T), and what the run of
    # the tool itself may take beyond it (ssh-keyscan's own timeout counts per read, not in all).
    keyscan_timeout_s: int = 3
    keyscan_margin_s: float = 5.0
    # Training plans begin terminating a capacity's instances this long before it ends.
    capacity_termination_lead_s: float = 1800.0
    # How long a helper thread (an output pump, a watch, the job report's sampler beyond its
    # interval) may take to end once told to.
    thread_join_s: float = 5.0
    # Stopping the live thread waits this long for a tick in progress (a worker's one send to the
    # leader, each connection within peer_probe_timeout_s; the leader's TensorBoard write), so
    # the last tick does not run beside it; a tick takes far less, so only a stuck disk waits it.
    live_stop_wait_s: float = 30.0
    # The deep health check's all-reduces: untimed ones first (NCCL's connections, warm caches),
    # then the timed ones (nccl-tests' defaults: 5 and 20).
    health_check_warmup: int = 5
    health_check_iterations: int = 20
    # A worker's figures for the job report: at most this many bytes of JSON (the job port
    # reads 64 KiB a connection, the signature and the word included).
    report_figures_bytes: int = 60000
    # How long the leader waits for workers' figures still missing when it writes the report.
    report_wait_s: float = 3.0
    # A worker's live figures (every live interval): at most this many bytes of JSON, so the
    # traffic to the leader is at most this a worker an interval.
    live_figures_bytes: int = 16000
    # The job's end after its outcome is written (run/finishing.py): the job report step (the
    # MPI leader's SSH reads of its workers' figures included) and closing, beyond the role's
    # own wait for its peers (peer_wait_timeout_s), each at most this long.
    finish_report_s: float = 60.0
    finish_close_s: float = 60.0
    # Closing after a stop came while finishing: what it releases on this host is released
    # either way; the words to other hosts get this long.
    finish_after_stop_s: float = 2.0


DEFAULTS = LaunchSettings()

"""Every timeout, interval and port of a launch, in one record (a value: it imports nothing).

The first group comes from the job's environment (BYOC_* variables, parsed and checked by
decide/settings.py: a bad value is a bad job definition); the second group is fixed. A module
that waits, polls or gives up takes its number from a LaunchSettings (the plan's,
`plan.settings`) or, where no plan reaches it (a helper that runs without one, a probe of the
machine before the plan), from DEFAULTS, so no number hides as a module constant or a bare
literal. It sits below every room (tests/entrypoint/test_layout.py: LAYERS), so the reads
(job/) take their timeouts from it too.
"""

from __future__ import annotations

from typing import NamedTuple


class LaunchSettings(NamedTuple):
    # --- from the job's environment (parse_launch_settings) -------------------------------------
    master_port: int = 7777  # BYOC_MASTER_PORT: torchrun's rendezvous, MASTER_PORT
    max_restarts: int = 0  # BYOC_MAX_RESTARTS: restarts in place after a rank fails (restarts.py)
    grace_period_s: float = 90.0  # BYOC_GRACE_PERIOD_S: SIGTERM to SIGKILL on a stop
    host_resolution_timeout_s: float = 300.0  # BYOC_HOST_RESOLUTION_TIMEOUT_S
    neuron_parallel_compile: bool = False  # RUN_NEURON_PARALLEL_COMPILE=1
    ssh_port: int = 22  # BYOC_SSH_PORT
    peer_wait_timeout_s: float = 300.0  # BYOC_PEER_WAIT_TIMEOUT_S: a peer's first answer, a host's last word
    host_lost_timeout_s: float = 30.0  # BYOC_HOST_LOST_TIMEOUT_S: silence that makes a host lost
    job_port: int = 7778  # BYOC_JOB_PORT (default: BYOC_MASTER_PORT + 1)
    hang_timeout_s: float = 0.0  # BYOC_HANG_TIMEOUT_S: output silence that makes a job hung; 0: off
    # The training plan's capacity end (epoch s) from SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP
    # (capacity.py), None without one; the raw value when it could not be read.
    capacity_ends_at: float | None = None
    capacity_end_unreadable: str | None = None
    # BYOC_CAPACITY_STOP_LEAD_S: how long before the capacity's termination begins the ranks get
    # SIGTERM; None: the grace period (capacity_stop_lead_s below gives the value in force).
    capacity_stop_lead: float | None = None
    # The deep health check before the training (decide/health.py, run/health_check.py).
    health_check: str = ""  # BYOC_HEALTH_CHECK: "deep", or "" (off)
    health_check_min_fraction: float = 0.5  # BYOC_HEALTH_CHECK_MIN_FRACTION of the expected bus bandwidth
    health_check_host_gbps: float = 0.0  # BYOC_HEALTH_CHECK_HOST_GBPS: expected within a host; 0: the table's
    health_check_job_gbps: float = 0.0  # BYOC_HEALTH_CHECK_JOB_GBPS: expected across hosts; 0: the table's
    health_check_mib: int = 1024  # BYOC_HEALTH_CHECK_MIB: the all-reduce's size
    health_check_port: int = 7779  # BYOC_HEALTH_CHECK_PORT (default: BYOC_MASTER_PORT + 2)
    health_check_timeout_s: float = 600.0  # BYOC_HEALTH_CHECK_TIMEOUT_S: every host's check, all of it
    # The job report (entrypoint/jobreport/, docs/job-report.md).
    report: bool = True  # BYOC_REPORT: 0 turns it off
    report_interval_s: float = 1.0  # BYOC_REPORT_INTERVAL_S: how often each host is sampled
    # The job watched live (jobreport/live/, docs/job-report.md).
    tensorboard: bool | None = None  # BYOC_TENSORBOARD: 1 on without a config, 0 off with one; None: the config
    live_interval_s: float = 10.0  # BYOC_LIVE_INTERVAL_S: TensorBoard events, a worker's figures to the leader
    status_interval_s: float = 300.0  # BYOC_STATUS_INTERVAL_S: the status line; 0: off
    # torch.compile's caches kept between jobs (decide/compile_cache.py, run/compile_cache.py).
    compile_cache: bool = True  # BYOC_COMPILE_CACHE: 0 turns it off
    compile_cache_max_mb: int = 1024  # BYOC_COMPILE_CACHE_MAX_MB: the folder's bound, oldest out first
    compile_cache_save_every_s: float = 600.0  # BYOC_COMPILE_CACHE_SAVE_EVERY_S: 0: only at the end and on a stop

    # --- fixed ----------------------------------------------------------------------------------
    # How often this host's process tree is polled (exits, deadlines, hang checks).
    process_poll_s: float = 0.01
    # How often a wait on something outside the process tree is polled (a file the leader
    # writes over SSH, a worker's SSH, a process group that is ending).
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
    # A worker host counts as gone (its part over, no word from it) when its port has not
    # answered for this long: one missed probe under load is not enough, and a word sent just
    # before the worker exited is read by then.
    worker_gone_after_s: float = 5.0
    # A worker retries this long to tell its leader that its part succeeded (not a refused
    # port: that leader has ended); a failing worker tries for host_done_failed_send_s, since its
    # leader may be what failed.
    host_done_send_s: float = 3.0
    host_done_failed_send_s: float = 1.0
    # A report signed before the job port opened is a replay; this much clock difference
    # between hosts is allowed.
    report_clock_skew_s: float = 60.0
    # How long the job port reads one connection's report.
    report_read_timeout_s: float = 5.0
    # The leader's probe of a worker's SSH port while it waits for the workers to accept it.
    ssh_probe_timeout_s: float = 1.0
    # One SSH session of the leader to a worker (telling the outcome, asking for stacks).
    ssh_session_timeout_s: float = 30.0
    # How long a worker that has its outcome waits for the leader's SSH sessions to close.
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
    # Open MPI's gap between SIGTERM and SIGKILL when it tears a failed job down
    # (odls_base_sigkill_timeout, whole seconds; see plan.build_mpirun_argv).
    mpi_teardown_signal_gap_s: int = 1
    # One run of a machine tool at start (nvidia-smi, neuron-ls, fi_info).
    tool_probe_timeout_s: float = 20.0
    # How often SDK v3's SSH helper looks for its peers' keys (sdk_v3/peer_trust.py).
    v3_ssh_poll_s: float = 0.5
    # Training plans begin terminating a capacity's instances this long before it ends.
    capacity_termination_lead_s: float = 1800.0
    # How long a helper thread (an output pump, a watch) may take to end once told to.
    thread_join_s: float = 5.0
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

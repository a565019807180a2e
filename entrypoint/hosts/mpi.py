"""The hosts' side of mpirun over SSH: sshd on every host, the leader waiting for its workers,
workers living exactly as long as the leader's job.

How a worker learns the outcome: when mpirun ends, the leader writes its exit code into the
worker's runtime folder over the same SSH channel mpirun used (`job-exit-code`), and, when
the job failed, its own output/failure first (`job-failure`). A worker exits with that code,
so no worker reports success for ranks that failed, and its output/failure leads with the
job's root cause too (SDK v2 local mode keeps only the last host's output/failure). A worker whose
leader stops answering on its SSH port for BYOC_HOST_LOST_TIMEOUT_S (default 30 s) exits
non-zero on its own. No fixed sleeps: every wait is a poll with a deadline.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass

from entrypoint.run import processes

from entrypoint.hosts import ssh
from entrypoint.outcome.failure import describe_job_outcome
from entrypoint.log import log as log_line
from entrypoint.jobreport.spec import HOST_FIGURES_FILE
from entrypoint.decide.plan import LaunchPlan
from entrypoint.job.paths import open_regular
from entrypoint.decide.settings import DEFAULTS, decide_capacity_stop_at
from entrypoint.hosts.job_port import PeerWatch
from entrypoint.rank.record_errors import build_readable_text
from entrypoint.run.supervise import StopRequest, stop_signals_set

# The leader's SSH sessions to its workers (probes, telling the outcome) run this many at a
# time: each is an ssh process (~5 MB, a key exchange), and a small leader instance with
# 255 workers should not start 255 at once. Open MPI's own orted launch has its own limit
# (plm_rsh_num_concurrent, 128 by default).
MAX_PARALLEL_SESSIONS = 64
# The leader's output/failure as it is written on each worker (over SSH, not the job port).
LEADER_REPORT_MAX_BYTES = 256 * 1024


@dataclass(frozen=True)
class WorkerOutcome:
    exit_code: int
    reason: str | None = None  # why, when it is not the leader's outcome
    leader_report: str | None = None  # the leader's output/failure, when the job failed


def start_sshd(files: ssh.SshFiles) -> subprocess.Popen:
    ssh.prepare_sshd_runtime()
    # sshd logs every bare TCP probe (the workers' liveness checks); keep that out of the job's
    # output, in the runtime folder.
    with open(os.path.join(files.folder, "sshd.log"), "ab") as log_file:
        return subprocess.Popen(
            list(ssh.sshd_argv(files)), stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file,
            start_new_session=True,
        )


# Set by mpirun/orted for each rank, or by the shell: never taken from the host's environment.
RANK_OWNED_PREFIXES = ("OMPI_", "PMIX_", "OPAL_", "ORTE_", "HYDRA_")
RANK_OWNED_NAMES = frozenset({"PWD", "OLDPWD", "SHLVL", "_"})


def build_host_env(environ: dict[str, str], plan_env: dict[str, str]) -> dict[str, str]:
    """What a rank started on this host by mpirun must see of this host: the container's own
    environment (what the platform gave it: the estimator's `environment=`, AWS settings) and
    this host's SM_* and launcher values. mpirun forwards only the leader's values of the names
    it is given (`-x`), and a rank on algo-2 must not be told SM_CURRENT_HOST=algo-1."""
    own = {k: v for k, v in environ.items()
           if not k.startswith(RANK_OWNED_PREFIXES) and k not in RANK_OWNED_NAMES}
    return {**own, **plan_env}


def write_host_env(plan: LaunchPlan) -> None:
    """build_host_env for this host, where record_errors.py lays it over the forwarded values
    (mode 0600: it may hold the job's credentials, as the container's environment does)."""
    path = plan.files.host_env
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(build_host_env(dict(os.environ), plan.env_dict), f)
    os.replace(path + ".tmp", path)


def ssh_argv(files: ssh.SshFiles, host: str, remote_command: str) -> list[str]:
    return ["ssh", "-F", files.client_config, host, remote_command]


# --- leader ------------------------------------------------------------------------------------


def start_leader(plan: LaunchPlan, stop: StopRequest, log) -> tuple[subprocess.Popen, str | None]:
    """Start sshd (workers fetch our key from it) and wait until every worker accepts us.
    Returns sshd and, on failure, a one-line reason."""
    files = plan.files.ssh
    ssh.write_host_key_and_configs(files, plan.settings.ssh_port)
    write_host_env(plan)
    sshd = start_sshd(files)
    workers = list(plan.peers)
    started = time.monotonic()
    deadline = started + plan.settings.peer_wait_timeout_s
    pending = list(workers)
    log(f"waiting for SSH on {', '.join(workers)}")
    while pending:
        accepted = probe_workers(files, pending, plan.settings.ssh_port, plan.settings.ssh_probe_timeout_s)
        pending = [h for h in pending if h not in accepted]
        if not pending:
            break
        if stop.signal_name:
            return sshd, f"stopped by {stop.signal_name} while waiting for the workers' SSH"
        if time.monotonic() >= deadline:
            return sshd, (
                f"host(s) {', '.join(pending)} did not accept SSH within "
                f"{plan.settings.peer_wait_timeout_s:g} s (BYOC_PEER_WAIT_TIMEOUT_S)"
            )
        time.sleep(plan.settings.wait_poll_s)
    log(f"every worker accepts SSH ({len(workers)} host(s), {time.monotonic() - started:.2f} s)")
    return sshd, None


def stop_leader(plan: LaunchPlan, sshd: subprocess.Popen | None) -> None:
    """The workers know the outcome: stop our sshd, remove the job's key."""
    processes.stop_process(sshd)
    ssh.remove_private_key(plan.files.ssh)


def probe_workers(files: ssh.SshFiles, hosts: list[str], port: int,
                  timeout_s: float = DEFAULTS.ssh_probe_timeout_s) -> set[str]:
    """The hosts that accept our SSH login now, probed in parallel (at most
    MAX_PARALLEL_SESSIONS at a time), so the wait does not grow with the host count the way
    one-after-another probes did (0.3-0.4 s each). A host whose port does not answer yet
    costs a TCP connect, not an ssh process."""
    def accepts(host: str) -> bool:
        if not ssh.can_connect(host, port, timeout_s=timeout_s):
            return False
        done = subprocess.run(ssh_argv(files, host, "true"), capture_output=True, stdin=subprocess.DEVNULL)
        return done.returncode == 0

    return {host for host, ok in zip(hosts, run_per_host(accepts, hosts)) if ok}


def run_per_host(action, hosts: list[str]) -> list:
    """action(host) for every host, at most MAX_PARALLEL_SESSIONS at a time; the results in
    the hosts' order."""
    from concurrent.futures import ThreadPoolExecutor  # imports logging: only where it is used

    if not hosts:
        return []
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_SESSIONS, len(hosts))) as pool:
        return list(pool.map(action, hosts))


def build_tell_command(plan: LaunchPlan, exit_code: int) -> str:
    """The remote command that stores the outcome on a worker: the report (stdin, possibly
    empty) first, then the exit code, whose file's appearance is what the worker waits for.
    Only our integer and constant paths appear in it."""
    code_file, report_file = shlex.quote(plan.files.outcome), shlex.quote(plan.files.leader_report)
    return (
        f"cat > {report_file}.tmp && mv {report_file}.tmp {report_file} && "
        f"printf %s {int(exit_code)} > {code_file}.tmp && mv {code_file}.tmp {code_file}"
    )


def tell_workers(plan: LaunchPlan, exit_code: int, report: str | None, log) -> None:
    """Write the job's outcome on every worker; a dead worker is skipped."""
    # Readable first (record_errors.build_readable_text): a lone surrogate arrives escaped, not as "?".
    payload = build_readable_text(report or "").encode("utf-8")[:LEADER_REPORT_MAX_BYTES] if exit_code != 0 else b""
    run_on_workers(plan, build_tell_command(plan, exit_code), payload, "tell {host} the outcome", log)


def ask_workers_for_stacks(plan: LaunchPlan, log) -> None:
    """SIGUSR1 to every worker's entrypoint (its PID is in its job folder's owner file, the
    same path on every host), which passes it to its ranks; their stacks reach the leader's
    log through mpirun. Only our constant path appears in the command."""
    owner = shlex.quote(plan.files.owner)
    run_on_workers(plan, f"kill -USR1 \"$(cut -d' ' -f1 {owner})\"", b"", "ask {host} for its ranks' stacks", log)


def collect_worker_figures(plan: LaunchPlan, log) -> dict[str, str]:
    """Each worker's figures for the job report (host -> their JSON): SIGUSR2 to its
    entrypoint, which writes them in its job folder (jobreport/host.write_figures_file), then
    read back, over the same SSH the job already trusts. Only our constant paths appear in
    the command; a worker that has none within 5 s is left out (the report says so)."""
    owner = shlex.quote(plan.files.owner)
    figures = shlex.quote(os.path.join(plan.report.rank_folder, HOST_FIGURES_FILE))
    command = (f"rm -f {figures}; kill -USR2 \"$(cut -d' ' -f1 {owner})\" && for i in $(seq 50); do "
               f"[ -s {figures} ] && exec cat {figures}; sleep 0.1; done; echo 'no figures within 5 s' >&2; exit 1")
    got = run_on_workers(plan, command, b"", "read {host}'s figures for the job report", log)
    return {host: out.decode("utf-8", "replace") for host, out in got.items()}


def run_on_workers(plan: LaunchPlan, command: str, payload: bytes, what: str, log) -> dict[str, bytes]:
    """One SSH session to every worker, running `command` with `payload` on its stdin, in
    parallel (MAX_PARALLEL_SESSIONS at a time); a worker that fails or times out is logged
    ("could not " + what) and skipped. Returns each other worker's stdout."""
    files = plan.files.ssh
    timeout_s = plan.settings.ssh_session_timeout_s

    def on(host: str) -> bytes | None:
        try:
            done = subprocess.run(ssh_argv(files, host, command), input=payload, capture_output=True, timeout=timeout_s)
            if done.returncode != 0:
                log(f"could not {what.format(host=host)}: {done.stderr.decode(errors='replace').strip()}")
                return None
            return done.stdout
        except subprocess.TimeoutExpired:
            log(f"could not {what.format(host=host)}: timed out")
            return None

    hosts = list(plan.peers)
    return {host: out for host, out in zip(hosts, run_per_host(on, hosts)) if out is not None}


# --- worker ------------------------------------------------------------------------------------


def run_worker_host(plan: LaunchPlan, env: dict[str, str]) -> tuple[int, str | None]:
    """This host's whole part in an MPI job led by another host: serve SSH to the leader
    until it reports the outcome. Returns the job's exit code and, when it failed, the text of
    this host's output/failure (the caller writes it)."""
    log_line(f"{plan.current_host}: MPI worker for the leader {plan.leader}")
    stop = StopRequest()

    def on_stack_request(_signum, _frame) -> None:
        # The ranks mpirun started here (under orted, which we adopted as subreaper).
        asked = processes.signal_ranks_below([os.getpid()], signal.SIGUSR1)
        log_line(f"SIGUSR1: asked {len(asked)} rank process(es) on {plan.current_host} for their Python stacks")

    previous = signal.signal(signal.SIGUSR1, on_stack_request)
    try:
        with stop_signals_set(stop):
            outcome = run_worker(plan, stop, log_line)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    if outcome.exit_code == 0:
        log_line(f"{plan.current_host}: the leader reports success")
        return 0, None
    return outcome.exit_code, describe_job_outcome(build_worker_failure_reason(plan, outcome), env)


def build_worker_failure_reason(plan: LaunchPlan, outcome: WorkerOutcome) -> str:
    """What a worker's output/failure says when the job failed."""
    if outcome.reason is not None:
        return outcome.reason
    if outcome.leader_report:
        # The leader's report, whose first lines are the job's root cause: SDK v2 local mode
        # keeps only the last host's output/failure, and that is a worker's.
        return (f"{outcome.leader_report.rstrip()}\n\n({plan.current_host} ended with the job; "
                f"this report is the leader {plan.leader}'s.)")
    return (f"The MPI job failed: the leader {plan.leader} reported exit code {outcome.exit_code}. "
            f"The leader's output/failure names the first failing host, rank and exception.")


def run_worker(plan: LaunchPlan, stop: StopRequest, log) -> WorkerOutcome:
    """Authorize the leader, serve SSH until the leader reports the outcome."""
    files = plan.files.ssh
    settings = plan.settings
    for path in (plan.files.outcome, plan.files.leader_report):
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
    sshd = None
    try:
        ssh.write_host_key_and_configs(files, settings.ssh_port)
        deadline = time.monotonic() + settings.peer_wait_timeout_s
        key = None
        while key is None:
            key = ssh.scan_host_key(plan.leader, settings.ssh_port)
            if key is not None:
                break
            if stop.signal_name:
                return WorkerOutcome(143, f"stopped by {stop.signal_name} before the leader {plan.leader} started")
            if time.monotonic() >= deadline:
                return WorkerOutcome(1, (
                    f"the leader {plan.leader} did not serve SSH within {settings.peer_wait_timeout_s:g} s "
                    f"(BYOC_PEER_WAIT_TIMEOUT_S)"
                ))
            time.sleep(settings.wait_poll_s)
        addresses = ssh.resolve_addresses(plan.leader)
        write_host_env(plan)
        ssh.authorize(files, key, addresses)
        processes.become_subreaper()
        sshd = start_sshd(files)
        log(f"serving SSH to the leader {plan.leader} ({', '.join(addresses)})")
        outcome = _wait_for_outcome(plan, stop, log, sshd)
        if outcome.reason is None:
            # The outcome file appears while the leader's session that wrote it is still
            # closing; stopping sshd then cuts that session and the leader logs a false
            # "could not tell algo-N the outcome: Connection ... closed by remote host".
            processes.wait_for_descendants_to_end(sshd.pid, settings.ssh_session_close_wait_s, settings.wait_poll_s)
        return outcome
    finally:
        processes.stop_process_and_descendants(sshd, min(plan.settings.grace_period_s, plan.settings.failure_stop_s))
        ssh.remove_private_key(files)


def forward_stop_to_ranks(signal_name: str, log) -> None:
    """A stop request reaches the ranks on this host directly, at once: the platform stops
    every host, and each host's ranks get the whole grace period to checkpoint. (Signalling
    orted would start Open MPI's teardown instead, with its short kill timeout.)"""
    table = processes.load_process_table()
    groups = processes.decide_rank_groups(table, processes.decide_launcher_pids(table, os.getpid(), ("orted",)))
    processes.signal_groups(groups, signal.Signals[signal_name])
    log(f"forwarded {signal_name} to {len(groups)} rank(s) on this host")


def load_leader_report(plan: LaunchPlan) -> str | None:
    try:
        with open_regular(plan.files.leader_report) as f:  # in the job's folder, which its ranks can write
            return f.read() or None
    except OSError:
        return None


def _wait_for_outcome(plan: LaunchPlan, stop: StopRequest, log, sshd: subprocess.Popen) -> WorkerOutcome:
    settings = plan.settings
    lost: list[str] = []
    watch = PeerWatch([plan.leader], settings.ssh_port, settings.host_lost_timeout_s, settings.host_lost_timeout_s,
                      lambda host, reason: lost.append(host), seen_at_start=True, settings=settings)
    try:
        return _serve_until_outcome(plan, stop, log, sshd, lost)
    finally:
        watch.close()


def _serve_until_outcome(plan: LaunchPlan, stop: StopRequest, log, sshd: subprocess.Popen, lost: list[str]) -> WorkerOutcome:
    settings = plan.settings
    stop_deadline = None
    capacity_stop = decide_capacity_stop_at(settings)  # every host stops its own ranks then (capacity.py)
    while True:
        if os.path.exists(plan.files.outcome):
            try:
                with open_regular(plan.files.outcome) as f:
                    text = f.read().strip()
            except OSError:  # not a file the leader wrote: the job failed, and that is all we know
                text = ""
            code = int(text) if text.lstrip("-").isdigit() else 1
            return WorkerOutcome(code, None, load_leader_report(plan) if code != 0 else None)
        now = time.monotonic()
        if capacity_stop is not None and stop.signal_name is None and time.time() >= capacity_stop:
            log(f"{plan.current_host}: stopping this host's ranks before the training plan's capacity ends")
            stop.signal_name = "SIGTERM"  # as if the platform had stopped the job: its ranks checkpoint
        if stop.signal_name and stop_deadline is None:
            forward_stop_to_ranks(stop.signal_name, log)
            # The ranks have the grace period; then the leader reports how the job ended.
            stop_deadline = now + settings.grace_period_s
        if stop_deadline is not None and now >= stop_deadline:
            return WorkerOutcome(143, f"stopped by {stop.signal_name}; the leader did not report an outcome within the grace period")
        if lost:
            return WorkerOutcome(1, (
                f"lost the leader {plan.leader}: no answer on its SSH port for "
                f"{settings.host_lost_timeout_s:g} s (BYOC_HOST_LOST_TIMEOUT_S)"
            ))
        # As subreaper (and PID 1 in a container) we inherit orted, the ranks and the leader's
        # ended SSH sessions: collect them while the job runs, or they stay defunct until it ends.
        # sshd is Popen's to collect (poll), and an exited one must not block the others.
        sshd.poll()
        processes.reap_orphans(set() if sshd.returncode is not None else {sshd.pid})
        time.sleep(settings.wait_poll_s)

"""The MPI launch family: mpirun on the leader starts every rank over SSH.

- MpiLeader: sshd, then waits until every worker accepts its SSH; runs mpirun; after its
  outcome is written, writes that outcome on every worker (hosts/mpi_wire.py), then stops sshd.
- MpiWorker: start() authorizes the leader and starts sshd; run() serves SSH until the leader
  writes the outcome; close() stops sshd.

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
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from entrypoint.decide.plan import LaunchPlan
from entrypoint.hosts import mpi_wire, ssh
from entrypoint.hosts.job_port import PeerLost, PeerWatch
from entrypoint.hosts.net import resolve_addresses
from entrypoint.job.paths import open_regular
from entrypoint.log import log
from entrypoint.outcome.hosts import describe_job_outcome, describe_worker_failure
from entrypoint.outcome.records import SUCCESS, Outcome
from entrypoint.outcome.writer import load_failure_file, render_reason
from entrypoint.roles.base import HostRole, MultiHostRole
from entrypoint.loop import Burst, HostLoop
from entrypoint.run import processes

@dataclass(frozen=True)
class WorkerOutcome:
    exit_code: int
    reason: str | None = None  # why, when it is not the leader's outcome
    leader_failure: str | None = None  # the leader's output/failure, when the job failed


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


def start_leader(plan: LaunchPlan, loop: HostLoop) -> tuple[subprocess.Popen, str | None]:
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
        accepted = mpi_wire.probe_workers(files, pending, plan.settings.ssh_port, plan.settings.ssh_probe_timeout_s)
        pending = [h for h in pending if h not in accepted]
        if not pending:
            break
        if time.monotonic() >= deadline:
            return sshd, (
                f"host(s) {', '.join(pending)} did not accept SSH within "
                f"{plan.settings.peer_wait_timeout_s:g} s (BYOC_PEER_WAIT_TIMEOUT_S)"
            )
        if not loop.pause(plan.settings.wait_poll_s):
            return sshd, f"stopped by {loop.stop_name} while waiting for the workers' SSH"
    log(f"every worker accepts SSH ({len(workers)} host(s), {time.monotonic() - started:.2f} s)")
    return sshd, None


def stop_leader(plan: LaunchPlan, sshd: subprocess.Popen | None) -> None:
    """The workers know the outcome: stop our sshd, remove the job's key."""
    processes.stop_process(sshd)
    ssh.remove_private_key(plan.files.ssh)


def start_worker(plan: LaunchPlan, loop: HostLoop) -> tuple[subprocess.Popen | None, WorkerOutcome | None]:
    """Learn the leader's key from its sshd, authorize it, start ours: (sshd, None), or (None,
    why this host's part ended before it began)."""
    files, settings = plan.files.ssh, plan.settings
    for path in (plan.files.outcome, plan.files.leader_failure):
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
    ssh.write_host_key_and_configs(files, settings.ssh_port)
    deadline = time.monotonic() + settings.peer_wait_timeout_s
    while (key := ssh.scan_host_key(plan.leader, settings.ssh_port)) is None:
        if time.monotonic() >= deadline:
            return None, WorkerOutcome(1, f"the leader {plan.leader} did not serve SSH within "
                                          f"{settings.peer_wait_timeout_s:g} s (BYOC_PEER_WAIT_TIMEOUT_S)")
        if not loop.pause(settings.wait_poll_s):
            return None, WorkerOutcome(128 + loop.stop_signum,
                                       f"stopped by {loop.stop_name} before the leader {plan.leader} started")
    addresses = resolve_addresses(plan.leader)
    write_host_env(plan)
    ssh.authorize(files, key, addresses)
    processes.become_subreaper()
    sshd = start_sshd(files)
    log(f"serving SSH to the leader {plan.leader} ({', '.join(addresses)})")
    return sshd, None


def stop_worker(plan: LaunchPlan, sshd: subprocess.Popen | None) -> None:
    """The outcome is known: stop sshd (and what the leader's sessions left), remove our key."""
    try:
        processes.stop_process_and_descendants(sshd, min(plan.settings.grace_period_s, plan.settings.failure_stop_s))
    finally:
        ssh.remove_private_key(plan.files.ssh)


def forward_stop_to_ranks(signal_name: str, log) -> None:
    """A stop request reaches the ranks on this host directly, at once: the platform stops
    every host, and each host's ranks get the whole grace period to checkpoint. (Signalling
    orted would start Open MPI's teardown instead, with its short kill timeout.)"""
    table = processes.load_process_table()
    groups = processes.decide_rank_groups(table, processes.decide_launcher_pids(table, os.getpid(), ("orted",)))
    processes.signal_groups(groups, signal.Signals[signal_name])
    log(f"forwarded {signal_name} to {len(groups)} rank(s) on this host")


def load_leader_failure(plan: LaunchPlan) -> str | None:
    try:
        with open_regular(plan.files.leader_failure) as f:  # in the job's folder, which its ranks can write
            return f.read() or None
    except OSError:
        return None


def wait_for_outcome(plan: LaunchPlan, loop: HostLoop, sshd: subprocess.Popen) -> WorkerOutcome:
    """Serve SSH until the leader writes the outcome here; a stop goes to this host's ranks."""
    settings = plan.settings
    lost: list[str] = []  # the PeerWatch's PeerLost, taken on the loop
    handlers = loop.on({PeerLost: lambda event: lost.append(event.host)})
    watch = PeerWatch([plan.leader], settings.ssh_port, settings.host_lost_timeout_s, settings.host_lost_timeout_s,
                      loop.post, seen_at_start=True, settings=settings, job_hosts=len(plan.hosts))
    try:
        outcome = _serve_until_outcome(plan, loop, sshd, lost)
    finally:
        watch.close()
        loop.off(handlers)
    if outcome.reason is None:
        # The outcome file appears while the leader's session that wrote it is still
        # closing; stopping sshd then cuts that session and the leader logs a false
        # "could not tell algo-N the outcome: Connection ... closed by remote host".
        processes.wait_for_descendants_to_end(sshd.pid, settings.ssh_session_close_wait_s, settings.wait_poll_s)
    return outcome


def load_outcome(plan: LaunchPlan) -> WorkerOutcome | None:
    """The outcome the leader wrote here, once it has."""
    if not os.path.exists(plan.files.outcome):
        return None
    try:
        with open_regular(plan.files.outcome) as f:
            text = f.read().strip()
    except OSError:  # not a file the leader wrote: the job failed, and that is all we know
        text = ""
    code = int(text) if text.lstrip("-").isdigit() else 1
    return WorkerOutcome(code, None, load_leader_failure(plan) if code != 0 else None)


def _serve_until_outcome(plan: LaunchPlan, loop: HostLoop, sshd: subprocess.Popen, lost: list[str]) -> WorkerOutcome:
    settings = plan.settings
    stopping, stop_deadline = None, None
    while (outcome := load_outcome(plan)) is None:
        now = time.monotonic()
        if stopping is None:
            stopping = loop.stop_name
            if stopping is None and plan.capacity_stop_at is not None and time.time() >= plan.capacity_stop_at:
                log(f"{plan.current_host}: stopping this host's ranks before the training plan's capacity ends")
                stopping = "SIGTERM"  # as if the platform had stopped the job: its ranks checkpoint
            if stopping is not None:
                forward_stop_to_ranks(stopping, log)
                # The ranks have the grace period; then the leader reports how the job ended.
                stop_deadline = now + settings.grace_period_s
        if stop_deadline is not None and now >= stop_deadline:
            return WorkerOutcome(143, f"stopped by {stopping}; the leader did not report an outcome within the grace period")
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
        loop.take(settings.wait_poll_s)  # the outcome is a file the leader writes over SSH: looked at each tick
    return outcome


class MpiLeader(MultiHostRole):
    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.sshd = None

    def start_beside(self) -> Outcome | None:
        self.sshd, problem = start_leader(self.plan, self.loop)
        return self.start_problem(problem, self.loop.stop_name) if problem else None

    def start_watches(self) -> list[PeerWatch]:
        plan, settings = self.plan, self.plan.settings
        # seen_at_start: start_leader has just reached every worker over SSH.
        return [PeerWatch(plan.peers, settings.ssh_port, settings.host_lost_timeout_s, settings.peer_wait_timeout_s,
                          self.loop.post, seen_at_start=True, settings=settings, job_hosts=len(plan.hosts))]

    def before_processes_start(self, supervisor) -> None:
        """Each run's workers stream their ranks' files here from before mpirun starts to after
        it ended (hosts/worker_output.py): their lines then count here as this host's ranks' do."""
        folder = self.plan.processes[0].rank_output if self.plan.processes else ""
        if folder and self.plan.peers:
            from entrypoint.hosts.worker_output import start_worker_output

            sinks = {"stdout": sys.stdout.buffer, "stderr": sys.stderr.buffer}
            # sys.executable: the image's python, the ranks' own (plan.Runtime.python), on every host.
            supervisor.followers.append(start_worker_output(self.plan, folder, sys.executable, self.collector,
                                                            self.loop, sinks, log))

    def ask_other_hosts(self) -> None:
        """Each worker's entrypoint (SIGUSR1 over SSH) has its ranks print their stacks, which
        reach this host's log through their rank files' sessions (hosts/worker_output.py), or
        mpirun's own forwarding under a user's output option."""
        mpi_wire.ask_workers_for_stacks(self.plan, log)

    def job_report(self, outcome: Outcome) -> None:
        """The workers' figures are read over SSH (they have no job port here), while they
        still serve it: before close tells them the outcome."""
        if self.report_part is None:
            return
        others = {}
        # Not when the workers were never all reached (no sshd here) or one was lost: SSH to a
        # host that is gone waits for its timeout, and the report is not worth that wait.
        if self.resolved and self.sshd is not None and self.lost is None and self.plan.peers:
            from entrypoint.jobreport.figures import parse_host_figures

            for host, text in mpi_wire.collect_worker_figures(self.plan, log).items():
                figures = parse_host_figures(text, host)
                if figures is not None:
                    others[host] = figures
        self.write_job_report(outcome, others)

    def close(self, outcome: Outcome) -> None:
        """The outcome is written here first: a worker exits as soon as it has the outcome, and
        SDK v2 local mode then stops this container. Workers are told what this host reports:
        the script's own failure file if it wrote one, else ours."""
        self.close_watches()
        if not self.resolved:
            return  # nothing started here; the workers give up on a leader they never reach
        try:
            reason = (load_failure_file(self.paths) or outcome.reason) if outcome.exit_code else None
            mpi_wire.tell_workers(self.plan, outcome.exit_code, render_reason(reason, self.collector.secrets), log)
        finally:
            stop_leader(self.plan, self.sshd)


class MpiWorker(HostRole):
    """start: authorize the leader, start sshd; run: serve SSH until the leader writes the
    outcome here (mpirun on the leader starts this host's ranks over it); close: stop sshd."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.sshd: subprocess.Popen | None = None
        self.stack_requests = Burst()  # the leader's asks (SIGUSR1): a burst asks the ranks once

    def start_live(self) -> None:
        """None here: an MPI worker's figures reach the leader over SSH, at the end only."""

    def start(self) -> Outcome | None:
        log(f"{self.plan.current_host}: MPI worker for the leader {self.plan.leader}")
        self.sshd, ended = start_worker(self.plan, self.loop)
        return None if ended is None else self.build_outcome(ended)

    def run(self, launch) -> Outcome:
        """Not the plan's processes: the leader's words (hosts/mpi_wire.py) arrive as signals,
        which only post LeaderAsked; the loop's handler answers."""
        handlers = self.loop.on({mpi_wire.LeaderAsked: self.on_leader_asked})
        posting = lambda signum, _frame: self.loop.post(mpi_wire.LeaderAsked(signum, time.monotonic()))  # noqa: E731
        previous = {sig: signal.signal(sig, posting) for sig in (mpi_wire.STACKS_SIGNAL, mpi_wire.FIGURES_SIGNAL)}
        try:
            return self.build_outcome(wait_for_outcome(self.plan, self.loop, self.sshd))
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.loop.off(handlers)

    def on_leader_asked(self, asked: mpi_wire.LeaderAsked) -> None:
        if asked.signum == mpi_wire.STACKS_SIGNAL:
            self.ask_ranks_for_stacks(asked.at)
        elif self.report_part is not None:
            self.write_figures()

    def build_outcome(self, ended: WorkerOutcome) -> Outcome:
        if ended.exit_code == 0:
            log(f"{self.plan.current_host}: the leader reports success")
            return SUCCESS
        return Outcome(ended.exit_code, describe_job_outcome(describe_worker_failure(
            self.plan.current_host, self.plan.leader, ended.exit_code, ended.reason, ended.leader_failure)))

    def ask_ranks_for_stacks(self, at: float | None = None) -> None:
        """The ranks mpirun started here (under orted, which we adopted as subreaper) that can
        answer; a burst of asks is one (at: when the ask came)."""
        said = self.stack_requests.take(self.plan.settings.signal_burst_s, at)
        if said is None:
            return
        asked = processes.signal_ranks_below([os.getpid()], mpi_wire.STACKS_SIGNAL)
        log(f"SIGUSR1{said}: asked {len(asked.asked)} rank process(es) on {self.plan.current_host} for their "
            f"Python stacks" + (f"; not asked, still starting: {', '.join(asked.starting)}" if asked.starting else ""))

    def write_figures(self) -> None:
        try:
            self.report_part.write_figures_file(self.plan.settings.report_figures_bytes)
        except Exception as exc:  # noqa: BLE001 - the leader reports this host's figures missing
            log(f"job report: could not write this host's figures: {type(exc).__name__}: {exc}")

    def job_report(self, outcome: Outcome) -> None:
        """Never written here: the leader read this host's figures before it told the outcome."""
        if self.report_part is not None:
            self.report_part.sampler.stop()
            self.report_part.stop_live()

    def close(self, outcome: Outcome) -> None:
        stop_worker(self.plan, self.sshd)

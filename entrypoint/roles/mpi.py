"""The MPI launch family: mpirun on the leader starts every rank over SSH, as a tree (each
host's Open MPI daemon starts the next ones': decide/launchers/mpirun.decide_launch_radix). Everything
else between the hosts travels on their job ports (hosts/job_port.py), signed with the job's
key and checked against the sender's address: no SSH session per host per step.

- Start: every host makes a fresh key (its host key and client identity). A worker starts
  sshd with nothing authorized and tells the leader its key (MPI-READY); once every worker
  has, the leader sends each every host's key (PEER-KEYS); each worker authorizes them, each
  from its own host's addresses, pins them in known_hosts and says so (MPI-READY, trusted).
  Then the leader runs mpirun.
- Run: the leader's asks (LEADER-ASK: the ranks' stacks; the figures for the job report) and
  the outcome (JOB-OUTCOME, with the leader's output/failure when the job failed) reach every
  worker at once (send_to_each: bounded, each with its own deadline). Before each mpirun the
  leader asks every worker to stream its ranks' lines (FOLLOW-RANKS: hosts/worker_output.py).
  A worker exits with the job's exit code, so no worker reports success for ranks that
  failed, and its output/failure leads with the job's root cause too (SDK v2 local mode keeps
  only the last host's).
- Liveness: the job ports, both ways (PeerWatch). A worker whose leader stops answering for
  BYOC_HOST_LOST_TIMEOUT_S (default 30 s) exits non-zero on its own.

Every wait is on the host's loop, with its deadline; a stop ends it.
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
from entrypoint.hosts import job_port, ssh
from entrypoint.hosts.job_port import (Ask, FollowRanks, HostFigures, JobOutcome, LeaderAsk, MpiReady, PeerKeys,
                                       PeerLost, PeerWatch)
from entrypoint.hosts.net import can_connect, resolve_addresses
from entrypoint.log import log
from entrypoint.loop import Burst, StacksRequested, Waited
from entrypoint.outcome.hosts import describe_job_outcome, describe_worker_failure
from entrypoint.outcome.records import SUCCESS, Outcome
from entrypoint.outcome.stops import decide_stop_exit_code
from entrypoint.outcome.writer import load_failure_file, render_reason
from entrypoint.roles.job_port import NOBODY_WAITS, JobPortRole
from entrypoint.run import processes

# Every host's key in messages of at most this many (PEER-KEYS): ~130 bytes each, so one
# message stays well inside the port's 64 KiB.
KEYS_PER_MESSAGE = 256


@dataclass(frozen=True)
class WorkerOutcome:
    exit_code: int
    reason: str | None = None  # why, when it is not the leader's outcome
    leader_failure: str | None = None  # the leader's output/failure, when the job failed


def start_sshd(files: ssh.SshFiles) -> subprocess.Popen:
    ssh.prepare_sshd_runtime()
    # sshd logs what does not concern the job's output (a refused login): in the runtime folder.
    with open(os.path.join(files.folder, "sshd.log"), "ab") as log_file:
        return subprocess.Popen(
            list(ssh.sshd_argv(files)), stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file,
            start_new_session=True,
        )


def build_key_parts(keys: list) -> list[PeerKeys]:
    """Every host's (host, addresses, key) in PEER-KEYS messages of at most KEYS_PER_MESSAGE."""
    chunks = [tuple(keys[i:i + KEYS_PER_MESSAGE]) for i in range(0, len(keys), KEYS_PER_MESSAGE)] or [()]
    return [PeerKeys(n, len(chunks), chunk) for n, chunk in enumerate(chunks, 1)]


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


def stop_worker(plan: LaunchPlan, sshd: subprocess.Popen | None) -> None:
    """The outcome is known: stop sshd (and what its sessions left), remove our key."""
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


class MpiRole(JobPortRole):
    """What both MPI hosts share: the job port (opened by JobPortRole.start_beside, signed with
    the plan's job_key), this host's fresh key and SSH configuration, and its environment for
    the ranks mpirun starts here."""

    def start_beside(self) -> Outcome | None:
        problem = super().start_beside()
        if problem is not None:
            return problem
        files = self.plan.files.ssh
        ssh.write_host_key_and_configs(files, self.plan.settings.ssh_port)
        write_host_env(self.plan)
        return self.start_ssh()

    def start_ssh(self) -> Outcome | None:
        return None


class MpiLeader(MpiRole):
    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.keys: dict[str, str] = {}  # each worker's public key, from its MPI-READY
        self.trusted: set[str] = set()  # the workers that authorized every host's key
        self.ready = False  # every worker trusts every host: mpirun may start

    def start_ssh(self) -> Outcome | None:
        """Every worker's key (MPI-READY), then every host's to every worker (PEER-KEYS), then
        every worker's word that it trusts them: within BYOC_PEER_WAIT_TIMEOUT_S."""
        plan, settings = self.plan, self.plan.settings
        self.loop.on({MpiReady: self.on_ready})
        workers = list(plan.peers)
        started = time.monotonic()
        deadline = started + settings.peer_wait_timeout_s
        log(f"waiting for {len(workers)} worker(s) to serve SSH")
        problem = self.wait_for_workers_to(lambda h: h in self.keys, "say they serve SSH", deadline)
        if problem is None:
            keys = [(plan.current_host, tuple(resolve_addresses(plan.current_host)), ssh.public_key(plan.files.ssh)),
                    *((h, tuple(self.peer_addresses(h)), self.keys[h]) for h in workers)]
            ssh.write_job_keys(plan.files.ssh, keys, settings.ssh_port, authorized=())
            parts = build_key_parts(keys)
            for part in parts:
                taken = self.send_to_each_host(workers, lambda _h, part=part: part, settings.peer_wait_timeout_s)
                missed = [h for h in workers if not taken.get(h)]
                if missed:
                    problem = f"host(s) {', '.join(missed)} could not be sent the job's SSH keys"
                    break
        if problem is None:
            problem = self.wait_for_workers_to(lambda h: h in self.trusted, "trust the job's SSH keys", deadline)
        if problem is not None:
            return self.start_problem(problem, self.loop.stop_name)
        self.ready = True
        log(f"every worker is ready ({len(workers)} host(s), {time.monotonic() - started:.2f} s)")
        return None

    def wait_for_workers_to(self, done, what: str, deadline: float) -> str | None:
        """Until done(host) for every worker: None, or why not (a stop, the deadline)."""
        workers = self.plan.peers  # a property that builds the tuple: once, not at every event
        waited = self.loop.wait(lambda: all(done(h) for h in workers), deadline)
        if waited is Waited.DONE:
            return None
        if self.loop.stopped():
            return f"stopped by {self.loop.stop_name} while waiting for the workers to {what}"
        pending = [h for h in workers if not done(h)]
        return (f"host(s) {', '.join(pending)} did not {what} within {self.plan.settings.peer_wait_timeout_s:g} s "
                f"(BYOC_PEER_WAIT_TIMEOUT_S)")

    def on_ready(self, ready: MpiReady) -> None:
        host = ready.host
        if ready.sender not in self.peer_addresses(host):  # no addresses: not one of this leader's workers
            self.refuse(ready.sender, f"an MPI worker's readiness for {host!r}: not one of this leader's workers")
            return
        if ready.trusted:
            if self.keys.get(host) == ready.public_key:
                self.trusted.add(host)
            return
        self.keys.setdefault(host, ready.public_key)  # the first key stands: a replay cannot change it

    def start_watches(self) -> list[PeerWatch]:
        plan, settings = self.plan, self.plan.settings
        # seen_at_start: every worker has just said it is ready.
        return [PeerWatch(plan.peers, settings.job_port, settings.host_lost_timeout_s, settings.peer_wait_timeout_s,
                          self.loop.post, seen_at_start=True, settings=settings, job_hosts=len(plan.hosts))]

    def before_processes_start(self, supervisor) -> None:
        """Each run's workers stream their ranks' files here from before mpirun starts to after
        it ended (hosts/worker_output.py): their lines then count here as this host's ranks' do."""
        folder = self.plan.processes[0].rank_output if self.plan.processes else ""
        if folder and self.plan.peers:
            from entrypoint.hosts.worker_output import start_worker_output

            sinks = {"stdout": sys.stdout.buffer, "stderr": sys.stderr.buffer}
            addresses = {host: frozenset(self.peer_addresses(host)) for host in self.plan.peers}
            supervisor.followers.append(start_worker_output(self.plan, self.collector, self.loop, sinks, log,
                                                            self.ask_each_worker, addresses, self.job_key))

    def ask_each_worker(self, message_of, within_s: float) -> dict[str, bool]:
        return self.send_to_each_host(self.plan.peers, message_of, within_s)

    def ask_other_hosts(self) -> None:
        """Each worker's entrypoint (LEADER-ASK) has its ranks print their stacks, which reach
        this host's log through their rank-output streams (hosts/worker_output.py), or
        mpirun's own forwarding under a user's output option. Sent off the loop, to every
        worker at once; nobody waits for it."""
        plan = self.plan
        job_port.send_to_each(plan.peers, plan.settings.job_port, self.job_key, lambda _h: LeaderAsk(Ask.STACKS),
                              plan.settings.host_done_failed_send_s, self.loop, NOBODY_WAITS, plan.settings)

    def job_report(self, outcome: Outcome) -> None:
        """The workers' figures (LEADER-ASK figures, each answering with HOST-FIGURES), while
        they still serve: before close tells them the outcome. Not when the workers were never
        all ready or one was lost; a bounded wait (settings.report_wait_s) for the rest."""
        if self.report_part is None:
            return
        plan, settings = self.plan, self.plan.settings
        if self.ready and self.lost is None and plan.peers:
            self.send_to_each_host(plan.peers, lambda _h: LeaderAsk(Ask.FIGURES), settings.host_done_failed_send_s)
            self.loop.wait(lambda: all(h in self.worker_figures for h in plan.peers),
                           time.monotonic() + settings.report_wait_s)
        self.write_job_report(outcome, dict(self.worker_figures))

    def close(self, outcome: Outcome) -> None:
        """The outcome is written here first: a worker exits as soon as it has the outcome, and
        SDK v2 local mode then stops this container. Workers are told what this host reports:
        the script's own failure file if it wrote one, else ours."""
        self.close_watches()
        try:
            if self.resolved and self.port is not None:
                reason = (load_failure_file(self.paths) or outcome.reason) if outcome.exit_code else None
                self.tell_workers(outcome.exit_code, render_reason(reason, self.collector.secrets) if reason else "")
        finally:
            ssh.remove_private_key(self.plan.files.ssh)
            super().close(outcome)

    def tell_workers(self, exit_code: int, report: str) -> None:
        """The outcome to every worker at once, each tried until its deadline; one that cannot
        be told is named (it notices this host go)."""
        settings = self.plan.settings
        message = job_port.build_job_outcome(exit_code, report)
        taken = self.send_to_each_host(self.plan.peers, lambda _h: message,
                                       settings.host_done_send_s if exit_code == 0 else settings.host_done_failed_send_s)
        for host in self.plan.peers:
            if not taken.get(host):
                log(f"could not tell {host} the outcome (it has ended, or is unreachable)")


class MpiWorker(MpiRole):
    """start: serve SSH with every host's key authorized (from the leader, on the job port);
    run: until the leader's outcome (mpirun on the leader starts this host's ranks over SSH);
    close: stop sshd."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.sshd: subprocess.Popen | None = None
        self.stack_requests = Burst()  # the leader's asks: a burst asks the ranks once
        self.key_parts: dict[int, tuple] = {}  # PEER-KEYS so far: part -> its keys
        self.key_parts_expected = 0
        self.told: WorkerOutcome | None = None  # the leader's JOB-OUTCOME
        self.rank_stream = None  # run/rank_stream.RankStream: this run's ranks' lines to the leader

    def start_live(self) -> None:
        """None here: an MPI worker's figures reach the leader at the end only."""

    def start(self) -> Outcome | None:
        log(f"{self.plan.current_host}: MPI worker for the leader {self.plan.leader}")
        return super().start()

    def start_ssh(self) -> Outcome | None:
        """Serve SSH, tell the leader this host's key, and authorize every host's once the
        leader sends them: (None), or why this host's part ended before it began."""
        plan, settings = self.plan, self.plan.settings
        self.loop.on({PeerKeys: self.on_keys, LeaderAsk: self.on_leader_asked, JobOutcome: self.on_outcome,
                      FollowRanks: self.on_follow_ranks})
        processes.become_subreaper()
        self.sshd = start_sshd(plan.files.ssh)
        not_serving = self.wait_for_sshd()
        if not_serving is not None:
            return self.ended_before_start(not_serving)
        key = ssh.public_key(plan.files.ssh)
        if not self.send(plan.leader, MpiReady(plan.current_host, key), settings.peer_wait_timeout_s, until_open=True):
            return self.ended_before_start(f"the leader {plan.leader} did not answer on its job port (port "
                                           f"{settings.job_port}) within {settings.peer_wait_timeout_s:g} s "
                                           f"(BYOC_PEER_WAIT_TIMEOUT_S)")
        # The leader took our key, so its own wait for the workers began before now and ends by
        # now + BYOC_PEER_WAIT_TIMEOUT_S; then it sends the keys, or why it gives up, within
        # host_done_failed_send_s. Waiting that long, this host never gives up first.
        deadline = time.monotonic() + settings.peer_wait_timeout_s + settings.host_done_failed_send_s
        waited = self.loop.wait(lambda: self.told is not None or self.has_every_key(), deadline)
        if self.told is not None:
            return self.build_outcome(self.told)
        if waited is not Waited.DONE:
            return self.ended_before_start(f"the leader {plan.leader} did not send the job's SSH keys within "
                                           f"{settings.peer_wait_timeout_s:g} s (BYOC_PEER_WAIT_TIMEOUT_S)")
        # The leader's addresses as this host resolves them (its words came from one of them),
        # not as the leader resolved its own name: that may be a loopback address of its own.
        leader = tuple(self.peer_addresses(plan.leader))
        keys = [(host, leader if host == plan.leader and leader else addresses, key)
                for part in sorted(self.key_parts) for host, addresses, key in self.key_parts[part]]
        ssh.write_job_keys(plan.files.ssh, keys, settings.ssh_port, authorized=set(plan.hosts) - {plan.current_host})
        if not self.send(plan.leader, MpiReady(plan.current_host, key, True), settings.peer_wait_timeout_s):
            return self.ended_before_start(f"the leader {plan.leader} could not be told this host trusts the job's "
                                           f"SSH keys")
        log(f"serving SSH to the leader {plan.leader} and {len(keys) - 2} other host(s)"
            if len(keys) > 2 else f"serving SSH to the leader {plan.leader}")
        return None

    def wait_for_sshd(self) -> str | None:
        """Until this host's sshd accepts connections: only then may the leader hear that it
        serves (sshd binds its port a moment after it starts: a session opened before is
        refused). None, or why not (a stop says None: the caller words it)."""
        settings = self.plan.settings
        deadline = time.monotonic() + settings.peer_wait_timeout_s
        while not can_connect("127.0.0.1", settings.ssh_port, settings.peer_probe_timeout_s):
            if self.sshd.poll() is not None:
                return (f"sshd exited with code {self.sshd.returncode} before it served "
                        f"(its log: {os.path.join(self.plan.files.ssh.folder, 'sshd.log')})")
            if time.monotonic() >= deadline:
                return f"sshd did not serve on port {settings.ssh_port} within {settings.peer_wait_timeout_s:g} s"
            if not self.loop.pause(settings.wait_poll_s):
                return "stopped"
        return None

    def ended_before_start(self, why: str) -> Outcome:
        if self.loop.stopped():
            return self.build_outcome(WorkerOutcome(decide_stop_exit_code(self.loop.stop_signum), f"stopped by {self.loop.stop_name} "
                                                    f"before the leader {self.plan.leader} started"))
        return self.build_outcome(WorkerOutcome(1, why))

    def from_leader(self, sender: str, what: str) -> bool:
        if sender in self.peer_addresses(self.plan.leader):
            return True
        self.refuse(sender, f"{what}: not from this host's leader")
        return False

    def has_every_key(self) -> bool:
        return self.key_parts_expected > 0 and len(self.key_parts) == self.key_parts_expected

    def on_keys(self, keys: PeerKeys) -> None:
        if not self.from_leader(keys.sender, "the job's SSH keys") or keys.part in self.key_parts:
            return
        self.key_parts_expected = keys.parts
        self.key_parts[keys.part] = keys.keys

    def on_outcome(self, told: JobOutcome) -> None:
        if self.told is None and self.from_leader(told.sender, "the job's outcome"):
            self.told = WorkerOutcome(told.exit_code, None, (told.report or None) if told.exit_code else None)

    def begin_running(self) -> None:
        """Nothing to say: this host's ranks are mpirun's, started from the leader (no success
        line of its own either: the leader reports the job's)."""
        return None

    def run_attempt(self, env: dict[str, str], stop_at, on_stopping, held=None) -> Outcome:
        """Not the plan's processes: serve SSH until the leader's outcome; a stop goes to this
        host's ranks; a SIGUSR1 here, or the leader's ask (on_leader_asked), asks them for their stacks."""
        handlers = self.loop.on({StacksRequested: lambda event: self.ask_ranks_for_stacks(event.at)})
        try:
            return self.build_outcome(self.wait_for_outcome())
        finally:
            self.loop.off(handlers)

    def wait_for_outcome(self) -> WorkerOutcome:
        plan, settings = self.plan, self.plan.settings
        lost: list[str] = []  # the PeerWatch's PeerLost, taken on the loop
        handlers = self.loop.on({PeerLost: lambda event: lost.append(event.reason)})
        watch = PeerWatch([plan.leader], settings.job_port, settings.host_lost_timeout_s, settings.host_lost_timeout_s,
                          self.loop.post, seen_at_start=True, settings=settings, job_hosts=len(plan.hosts))
        try:
            outcome = self.serve_until_outcome(lost)
        finally:
            watch.close()
            self.loop.off(handlers)
        if outcome.reason is None:
            # mpirun has ended before the leader tells the outcome; the SSH sessions of this
            # host's daemon (its parent's, and its own to its children) may still be closing.
            processes.wait_for_descendants_to_end(self.sshd.pid, settings.ssh_session_close_wait_s, settings.wait_poll_s)
        return outcome

    def serve_until_outcome(self, lost: list[str]) -> WorkerOutcome:
        plan, settings, sshd = self.plan, self.plan.settings, self.sshd
        stopping, stop_deadline = None, None
        while self.told is None:
            now = time.monotonic()
            if stopping is None:
                stopping = self.loop.stop_name
                if stopping is None and plan.capacity_stop_at is not None and time.time() >= plan.capacity_stop_at:
                    log(f"{plan.current_host}: stopping this host's ranks before the training plan's capacity ends")
                    stopping = "SIGTERM"  # as if the platform had stopped the job: its ranks checkpoint
                if stopping is not None:
                    forward_stop_to_ranks(stopping, log)
                    # The ranks have the grace period; then the leader reports how the job ended.
                    stop_deadline = now + settings.grace_period_s
            if stop_deadline is not None and now >= stop_deadline:
                return WorkerOutcome(143, f"stopped by {stopping}; the leader did not report an outcome within the "
                                          f"grace period")
            if lost:
                return WorkerOutcome(1, f"lost the leader {plan.leader}: no answer on its job port for "
                                        f"{settings.host_lost_timeout_s:g} s (BYOC_HOST_LOST_TIMEOUT_S)")
            # As subreaper (and PID 1 in a container) we inherit orted, the ranks and their
            # ended SSH sessions: collect them while the job runs, or they stay defunct until it ends.
            # sshd is Popen's to collect (poll), and an exited one must not block the others.
            sshd.poll()
            processes.reap_orphans(set() if sshd.returncode is not None else {sshd.pid})
            self.loop.take(settings.wait_poll_s)  # the outcome is an event; orphans are looked at each tick
        return self.told

    def on_leader_asked(self, asked: LeaderAsk) -> None:
        if not self.from_leader(asked.sender, f"an ask for {asked.ask.value}"):
            return
        if asked.ask is Ask.STACKS:
            self.ask_ranks_for_stacks(time.monotonic())
        elif self.report_part is not None:
            self.send_figures()

    def on_follow_ranks(self, asked: FollowRanks) -> None:
        """A run's start: stream this host's ranks' lines to the leader, at the address the ask
        came from (hosts/worker_output.py). An earlier run's stream ends first: its files are
        cleared for the new run. The folder is this host's plan's (the leader asks only when its
        mpirun writes the ranks' files there: no output option of the user's)."""
        folder = self.plan.files.rank_output
        if not self.from_leader(asked.sender, "an ask to stream its ranks' output"):
            return
        from entrypoint.hosts.worker_output import build_opening
        from entrypoint.run.rank_stream import RankStream

        self.end_rank_stream()
        opening = build_opening(self.job_key, self.plan.current_host, asked.nonce, time.time())
        self.rank_stream = RankStream(folder, asked.sender, asked.port, opening, log, self.plan.settings).start()

    def end_rank_stream(self) -> None:
        if self.rank_stream is not None:
            self.rank_stream.end(self.plan.settings.ssh_session_close_wait_s)
            self.rank_stream = None

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
        asked = processes.signal_ranks_below([os.getpid()], signal.SIGUSR1)
        log(f"SIGUSR1{said}: asked {len(asked.asked)} rank process(es) on {self.plan.current_host} for their "
            f"Python stacks" + (f"; not asked, still starting: {', '.join(asked.starting)}" if asked.starting else ""))

    def send_figures(self) -> None:
        """This host's figures so far, to the leader, off the loop (nobody here waits for it)."""
        plan, settings = self.plan, self.plan.settings
        try:
            _, text = self.report_part.build_figures(settings.report_figures_bytes)
        except Exception as exc:  # noqa: BLE001 - the leader reports this host's figures missing
            log(f"job report: could not make this host's figures: {type(exc).__name__}: {exc}")
            return
        job_port.send_to_each([plan.leader], settings.job_port, self.job_key,
                              lambda _h: HostFigures(plan.current_host, text), settings.host_done_failed_send_s,
                              self.loop, NOBODY_WAITS, settings)

    def job_report(self, outcome: Outcome) -> None:
        """Never written here: the leader asked for this host's figures before it told the outcome."""
        if self.report_part is not None:
            self.report_part.sampler.stop()
            self.report_part.stop_live()

    def close(self, outcome: Outcome) -> None:
        try:
            self.end_rank_stream()
            stop_worker(self.plan, self.sshd)
        finally:
            super().close(outcome)  # JobPortRole's: the watches, then the port

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
import subprocess
import sys
import time
from dataclasses import dataclass

from entrypoint.decide.plan import LaunchPlan
from entrypoint.hosts import job_port, ssh
from entrypoint.hosts.job_port import (Ask, FollowRanks, HostFigures, HostLive, JobOutcome, LeaderAsk, MpiReady,
                                       PeerKeys, PeerLost, PeerWatch)
from entrypoint.hosts.net import can_connect, resolve_addresses
from entrypoint.log import log
from entrypoint.loop import StacksRequested, Waited
from entrypoint.outcome.hosts import describe_job_outcome, describe_worker_failure
from entrypoint.outcome.records import SUCCESS, Outcome
from entrypoint.outcome.stops import decide_stop_exit_code
from entrypoint.outcome.writer import load_failure_file, render_reason
from entrypoint.roles.base import HostRole, begin_run, write_job_report
from entrypoint.roles.peers import Peers, start_problem, take_worker_figures, take_worker_live
from entrypoint.run import processes
from entrypoint.run.supervise import Adopted, RunHooks, run_processes

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


def prepare_mpi_host(host) -> None:
    """What both MPI hosts make once the job port is open: this host's fresh key and SSH
    configuration, and its environment for the ranks mpirun starts here."""
    ssh.write_host_key_and_configs(host.plan.files.ssh, host.plan.settings.ssh_port)
    write_host_env(host.plan)


class MpiLeader(HostRole):
    """start: every worker's key, then every host's to every worker, then their trust; run:
    mpirun; close: the outcome to every worker."""

    def __init__(self) -> None:
        self.peers = Peers()
        self.keys: dict[str, str] = {}  # each worker's public key, from its MPI-READY
        self.trusted: set[str] = set()  # the workers that authorized every host's key
        self.ready = False  # every worker trusts every host: mpirun may start
        self.worker_figures: dict[str, dict] = {}  # each worker's figures, as they arrive

    def start(self, host) -> Outcome | None:
        return self.peers.start(host, self.take_words, self.start_ssh)

    def take_words(self, host) -> None:
        peers = self.peers
        host.loop.on({MpiReady: self.on_ready,
                      HostFigures: lambda figures: take_worker_figures(host, peers, self.worker_figures, figures),
                      HostLive: lambda live: take_worker_live(host, peers, live)})

    def start_ssh(self, host) -> Outcome | None:
        """Every worker's key (MPI-READY), then every host's to every worker (PEER-KEYS), then
        every worker's word that it trusts them: within BYOC_PEER_WAIT_TIMEOUT_S."""
        plan, settings = host.plan, host.plan.settings
        prepare_mpi_host(host)
        workers = list(plan.peers)
        started = time.monotonic()
        deadline = started + settings.peer_wait_timeout_s
        log(f"waiting for {len(workers)} worker(s) to serve SSH")
        problem = self.wait_for_workers_to(host, lambda h: h in self.keys, "say they serve SSH", deadline)
        if problem is None:
            keys = [(plan.current_host, tuple(resolve_addresses(plan.current_host)), ssh.public_key(plan.files.ssh)),
                    *((h, tuple(self.peers.peer_addresses(h)), self.keys[h]) for h in workers)]
            ssh.write_job_keys(plan.files.ssh, keys, settings.ssh_port, authorized=())
            for part in build_key_parts(keys):
                taken = self.peers.send_to_each_host(host, workers, lambda _h, part=part: part,
                                                     settings.peer_wait_timeout_s)
                missed = [h for h in workers if not taken.get(h)]
                if missed:
                    problem = f"host(s) {', '.join(missed)} could not be sent the job's SSH keys"
                    break
        if problem is None:
            problem = self.wait_for_workers_to(host, lambda h: h in self.trusted, "trust the job's SSH keys", deadline)
        if problem is not None:
            return start_problem(host, problem, host.loop.stop_name)
        self.ready = True
        log(f"every worker is ready ({len(workers)} host(s), {time.monotonic() - started:.2f} s)")
        return None

    def wait_for_workers_to(self, host, done, what: str, deadline: float) -> str | None:
        """Until done(host) for every worker: None, or why not (a stop, the deadline)."""
        workers = host.plan.peers  # a property that builds the tuple: once, not at every event
        waited = host.loop.wait(lambda: all(done(h) for h in workers), deadline)
        if waited is Waited.DONE:
            return None
        if host.loop.stopped():
            return f"stopped by {host.loop.stop_name} while waiting for the workers to {what}"
        pending = [h for h in workers if not done(h)]
        return (f"host(s) {', '.join(pending)} did not {what} within {host.plan.settings.peer_wait_timeout_s:g} s "
                f"(BYOC_PEER_WAIT_TIMEOUT_S)")

    def on_ready(self, ready: MpiReady) -> None:
        worker = ready.host
        if not self.peers.is_from(ready.sender, worker):  # no addresses: not one of this leader's workers
            self.peers.refuse(ready.sender, f"an MPI worker's readiness for {worker!r}: not one of this leader's "
                                            f"workers")
            return
        if ready.trusted:
            if self.keys.get(worker) == ready.public_key:
                self.trusted.add(worker)
            return
        self.keys.setdefault(worker, ready.public_key)  # the first key stands: a replay cannot change it

    def start_watches(self, host) -> list[PeerWatch]:
        plan, settings = host.plan, host.plan.settings
        # seen_at_start: every worker has just said it is ready.
        return [PeerWatch(plan.peers, settings.job_port, settings.host_lost_timeout_s, settings.peer_wait_timeout_s,
                          host.loop.post, seen_at_start=True, settings=settings, job_hosts=len(plan.hosts))]

    def build_run_hooks(self, host, hooks):
        """mpirun's run: a SIGUSR1 or a hang asks every worker's ranks too (ask_other_hosts), and
        each run's workers stream their ranks' lines here (before_start)."""
        return super().build_run_hooks(host, hooks)._replace(
            ask_other_hosts=lambda: self.ask_other_hosts(host),
            before_start=lambda supervisor: self.follow_worker_output(host, supervisor))

    def on_processes_started(self, host, supervisor) -> None:
        begin_run(host, supervisor)
        self.peers.watch(host, supervisor, self.start_watches)

    def follow_worker_output(self, host, supervisor) -> None:
        """Each run's workers stream their ranks' files here from before mpirun starts to after
        it ended (hosts/worker_output.py): their lines then count here as this host's ranks' do."""
        plan = host.plan
        folder = plan.processes[0].rank_output if plan.processes else ""
        if folder and plan.peers:
            from entrypoint.hosts.worker_output import start_worker_output

            sinks = {"stdout": sys.stdout.buffer, "stderr": sys.stderr.buffer}
            addresses = {peer: frozenset(self.peers.peer_addresses(peer)) for peer in plan.peers}
            ask = lambda message_of, within_s: self.peers.send_to_each_host(host, plan.peers, message_of,  # noqa: E731
                                                                            within_s)
            supervisor.add_follower(start_worker_output(plan, host.collector, host.loop, sinks, log, ask, addresses,
                                                        self.peers.key))

    def ask_other_hosts(self, host) -> None:
        """Each worker's entrypoint (LEADER-ASK) has its ranks print their stacks, which reach
        this host's log through their rank-output streams (hosts/worker_output.py), or mpirun's
        own forwarding under a user's output option. Sent off the loop, to every worker at once;
        nobody waits for it."""
        self.peers.send_off_the_loop(host, host.plan.peers, lambda _h: LeaderAsk(Ask.STACKS),
                                     host.plan.settings.host_done_failed_send_s)

    def job_report(self, host, outcome: Outcome) -> None:
        """The workers' figures (LEADER-ASK figures, each answering with HOST-FIGURES), while
        they still serve: before close tells them the outcome. Not when the workers were never
        all ready or one was lost; a bounded wait (settings.report_wait_s) for the rest."""
        if host.report is None:
            return
        plan, settings = host.plan, host.plan.settings
        if self.ready and host.lost is None and plan.peers:
            self.peers.send_to_each_host(host, plan.peers, lambda _h: LeaderAsk(Ask.FIGURES),
                                         settings.host_done_failed_send_s)
            host.loop.wait(lambda: all(h in self.worker_figures for h in plan.peers),
                           time.monotonic() + settings.report_wait_s)
        write_job_report(host, outcome, dict(self.worker_figures))

    def close(self, host, outcome: Outcome) -> None:
        """The outcome is written here first: a worker exits as soon as it has the outcome, and
        SDK v2 local mode then stops this container. Workers are told what this host reports:
        the script's own failure file if it wrote one, else ours."""
        self.peers.close_watches()
        try:
            if host.resolved and self.peers.port is not None:
                reason = (load_failure_file(host.paths) or outcome.reason) if outcome.exit_code else None
                self.tell_workers(host, outcome.exit_code,
                                  render_reason(reason, host.collector.secrets) if reason else "")
        finally:
            ssh.remove_private_key(host.plan.files.ssh)
            self.peers.close()

    def tell_workers(self, host, exit_code: int, report: str) -> None:
        """The outcome to every worker at once, each tried until its deadline; one that cannot be
        told is named (it notices this host go)."""
        settings = host.plan.settings
        message = job_port.build_job_outcome(exit_code, report)
        taken = self.peers.send_to_each_host(host, host.plan.peers, lambda _h: message,
                                             settings.host_done_send_s if exit_code == 0 else
                                             settings.host_done_failed_send_s)
        for peer in host.plan.peers:
            if not taken.get(peer):
                log(f"could not tell {peer} the outcome (it has ended, or is unreachable)")


class MpiWorker(HostRole):
    """start: serve SSH with every host's key authorized (from the leader, on the job port);
    run: until the leader's outcome (mpirun on the leader starts this host's ranks over SSH);
    close: stop sshd."""

    def __init__(self) -> None:
        self.peers = Peers()
        self.sshd: subprocess.Popen | None = None
        self.key_parts: dict[int, tuple] = {}  # PEER-KEYS so far: part -> its keys
        self.key_parts_expected = 0
        self.told: WorkerOutcome | None = None  # the leader's JOB-OUTCOME
        self.rank_stream = None  # run/rank_stream.RankStream: this run's ranks' lines to the leader

    def start_live(self, host) -> None:
        """None here: an MPI worker's figures reach the leader at the end only."""

    def start(self, host) -> Outcome | None:
        log(f"{host.plan.current_host}: MPI worker for the leader {host.plan.leader}")
        return self.peers.start(host, self.take_words, self.start_ssh)

    def take_words(self, host) -> None:
        host.loop.on({PeerKeys: lambda keys: self.on_keys(host, keys),
                      LeaderAsk: lambda asked: self.on_leader_asked(host, asked),
                      JobOutcome: lambda told: self.on_outcome(host, told),
                      FollowRanks: lambda asked: self.on_follow_ranks(host, asked)})

    def start_ssh(self, host) -> Outcome | None:
        """Serve SSH, tell the leader this host's key, and authorize every host's once the
        leader sends them: (None), or why this host's part ended before it began."""
        plan, settings = host.plan, host.plan.settings
        prepare_mpi_host(host)
        processes.become_subreaper()
        self.sshd = start_sshd(plan.files.ssh)
        not_serving = self.wait_for_sshd(host)
        if not_serving is not None:
            return self.ended_before_start(host, not_serving)
        key = ssh.public_key(plan.files.ssh)
        if not self.peers.send(host, plan.leader, MpiReady(plan.current_host, key), settings.peer_wait_timeout_s,
                               until_open=True):
            return self.ended_before_start(host, f"the leader {plan.leader} did not answer on its job port (port "
                                                 f"{settings.job_port}) within {settings.peer_wait_timeout_s:g} s "
                                                 f"(BYOC_PEER_WAIT_TIMEOUT_S)")
        # The leader took our key, so its own wait for the workers began before now and ends by
        # now + BYOC_PEER_WAIT_TIMEOUT_S; then it sends the keys, or why it gives up, within
        # host_done_failed_send_s. Waiting that long, this host never gives up first.
        deadline = time.monotonic() + settings.peer_wait_timeout_s + settings.host_done_failed_send_s
        waited = host.loop.wait(lambda: self.told is not None or self.has_every_key(), deadline)
        if self.told is not None:
            return self.build_outcome(host, self.told)
        if waited is not Waited.DONE:
            return self.ended_before_start(host, f"the leader {plan.leader} did not send the job's SSH keys within "
                                                 f"{settings.peer_wait_timeout_s:g} s (BYOC_PEER_WAIT_TIMEOUT_S)")
        # The leader's addresses as this host resolves them (its words came from one of them),
        # not as the leader resolved its own name: that may be a loopback address of its own.
        leader = tuple(self.peers.peer_addresses(plan.leader))
        keys = [(peer, leader if peer == plan.leader and leader else addresses, key)
                for part in sorted(self.key_parts) for peer, addresses, key in self.key_parts[part]]
        ssh.write_job_keys(plan.files.ssh, keys, settings.ssh_port, authorized=set(plan.hosts) - {plan.current_host})
        if not self.peers.send(host, plan.leader, MpiReady(plan.current_host, key, True), settings.peer_wait_timeout_s):
            return self.ended_before_start(host, f"the leader {plan.leader} could not be told this host trusts the "
                                                 f"job's SSH keys")
        log(f"serving SSH to the leader {plan.leader} and {len(keys) - 2} other host(s)"
            if len(keys) > 2 else f"serving SSH to the leader {plan.leader}")
        return None

    def wait_for_sshd(self, host) -> str | None:
        """Until this host's sshd accepts connections: only then may the leader hear that it
        serves (sshd binds its port a moment after it starts: a session opened before is
        refused). None, or why not (a stop says None: the caller words it)."""
        settings = host.plan.settings
        deadline = time.monotonic() + settings.peer_wait_timeout_s
        while not can_connect("127.0.0.1", settings.ssh_port, settings.peer_probe_timeout_s):
            if self.sshd.poll() is not None:
                return (f"sshd exited with code {self.sshd.returncode} before it served "
                        f"(its log: {os.path.join(host.plan.files.ssh.folder, 'sshd.log')})")
            if time.monotonic() >= deadline:
                return f"sshd did not serve on port {settings.ssh_port} within {settings.peer_wait_timeout_s:g} s"
            if not host.loop.pause(settings.wait_poll_s):
                return "stopped"
        return None

    def ended_before_start(self, host, why: str) -> Outcome:
        loop = host.loop
        if loop.stopped():
            return self.build_outcome(host, WorkerOutcome(decide_stop_exit_code(loop.stop_signum),
                                                          f"stopped by {loop.stop_name} before the leader "
                                                          f"{host.plan.leader} started"))
        return self.build_outcome(host, WorkerOutcome(1, why))

    def from_leader(self, host, sender: str, what: str) -> bool:
        if self.peers.is_from(sender, host.plan.leader):
            return True
        self.peers.refuse(sender, f"{what}: not from this host's leader")
        return False

    def has_every_key(self) -> bool:
        return self.key_parts_expected > 0 and len(self.key_parts) == self.key_parts_expected

    def on_keys(self, host, keys: PeerKeys) -> None:
        if not self.from_leader(host, keys.sender, "the job's SSH keys") or keys.part in self.key_parts:
            return
        self.key_parts_expected = keys.parts
        self.key_parts[keys.part] = keys.keys

    def on_outcome(self, host, told: JobOutcome) -> None:
        if self.told is None and self.from_leader(host, told.sender, "the job's outcome"):
            self.told = WorkerOutcome(told.exit_code, None, (told.report or None) if told.exit_code else None)

    def begin_running(self, host) -> None:
        """Nothing to say: this host's ranks are mpirun's, started from the leader (no success
        line of its own either: the leader reports the job's)."""
        return None

    def run_attempt(self, host, hooks: RunHooks) -> Outcome:
        """Not the plan's processes: the ranks mpirun on the leader starts here, adopted (a run
        with no process of its own: run/supervise.Adopted), until the leader's outcome or its
        loss; the run forwards a stop and SIGUSR1 to them, stops them as the capacity ends, and
        collects the orphans."""
        plan, settings, sshd = host.plan, host.plan.settings, self.sshd
        lost: list[str] = []  # the PeerWatch's PeerLost, taken on the loop
        handlers = host.loop.on({PeerLost: lambda event: lost.append(event.reason)})
        watch = PeerWatch([plan.leader], settings.job_port, settings.host_lost_timeout_s, settings.host_lost_timeout_s,
                          host.loop.post, seen_at_start=True, settings=settings, job_hosts=len(plan.hosts))
        adopted = Adopted(("orted",), lambda: self.told is not None or bool(lost),
                          lambda: {sshd.pid} if sshd.poll() is None else set())
        try:
            run = run_processes((), host.env, plan.cwd, host.collector, host.stop,
                                self.build_run_hooks(host, hooks._replace(adopted=adopted, held=None,
                                                                          hang_timeout_s=0.0)))
        finally:
            watch.close()
            host.loop.off(handlers)
        if self.told is not None:
            # mpirun has ended before the leader tells the outcome; the SSH sessions of this
            # host's daemon (its parent's, and its own to its children) may still be closing.
            processes.wait_for_descendants_to_end(sshd.pid, settings.ssh_session_close_wait_s, settings.wait_poll_s)
            return self.build_outcome(host, self.told)
        if lost:
            return self.build_outcome(host, WorkerOutcome(1, f"lost the leader {plan.leader}: no answer on its job "
                                                             f"port for {settings.host_lost_timeout_s:g} s "
                                                             f"(BYOC_HOST_LOST_TIMEOUT_S)"))
        return self.build_outcome(host, WorkerOutcome(run.exit_code, f"stopped by {run.stopped_by}; the leader did "
                                                                     f"not report an outcome within the grace period"))

    def on_processes_started(self, host, supervisor) -> None:
        host.supervisor = supervisor  # no phase of its own: this host's ranks are the leader's mpirun's

    def on_leader_asked(self, host, asked: LeaderAsk) -> None:
        if not self.from_leader(host, asked.sender, f"an ask for {asked.ask.value}"):
            return
        if asked.ask is Ask.STACKS:  # the current run asks this host's ranks, as on a SIGUSR1 here
            host.loop.post(StacksRequested(time.monotonic()))
        elif host.report is not None:
            self.send_figures(host)

    def on_follow_ranks(self, host, asked: FollowRanks) -> None:
        """A run's start: stream this host's ranks' lines to the leader, at the address the ask
        came from (hosts/worker_output.py). An earlier run's stream ends first: its files are
        cleared for the new run. The folder is this host's plan's (the leader asks only when its
        mpirun writes the ranks' files there: no output option of the user's)."""
        plan = host.plan
        if not self.from_leader(host, asked.sender, "an ask to stream its ranks' output"):
            return
        from entrypoint.hosts.worker_output import build_opening
        from entrypoint.run.rank_stream import RankStream

        self.end_rank_stream(host)
        opening = build_opening(self.peers.key, plan.current_host, asked.nonce, time.time())
        self.rank_stream = RankStream(plan.files.rank_output, asked.sender, asked.port, opening, log,
                                      plan.settings).start()

    def end_rank_stream(self, host) -> None:
        if self.rank_stream is not None:
            self.rank_stream.end(host.plan.settings.ssh_session_close_wait_s)
            self.rank_stream = None

    def build_outcome(self, host, ended: WorkerOutcome) -> Outcome:
        plan = host.plan
        if ended.exit_code == 0:
            log(f"{plan.current_host}: the leader reports success")
            return SUCCESS
        return Outcome(ended.exit_code, describe_job_outcome(describe_worker_failure(
            plan.current_host, plan.leader, ended.exit_code, ended.reason, ended.leader_failure)))

    def send_figures(self, host) -> None:
        """This host's figures so far, to the leader, off the loop (nobody here waits for it)."""
        plan, settings = host.plan, host.plan.settings
        try:
            _, text = host.report.build_figures(settings.report_figures_bytes)
        except Exception as exc:  # noqa: BLE001 - the leader reports this host's figures missing
            log(f"job report: could not make this host's figures: {type(exc).__name__}: {exc}")
            return
        self.peers.send_off_the_loop(host, [plan.leader], lambda _h: HostFigures(plan.current_host, text),
                                     settings.host_done_failed_send_s)

    def job_report(self, host, outcome: Outcome) -> None:
        """Never written here: the leader asked for this host's figures before it told the outcome."""
        if host.report is not None:
            host.report.sampler.stop()
            host.report.stop_live()

    def close(self, host, outcome: Outcome) -> None:
        try:
            self.end_rank_stream(host)
            stop_worker(host.plan, self.sshd)
        finally:
            self.peers.close()

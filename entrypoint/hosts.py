"""The multi-host side of a launch on this host: waiting for the other hosts' names, the
services that run beside the job's processes (the MPI leader's sshd and workers, the job port,
the watch on the peers; liveness.py), and the end of a job across hosts (a torchrun or
parameter-server worker tells the leader its outcome; the leader waits for every worker's).
The MPI hosts' own steps over SSH are in mpi_hosts.py, imported only by multi-host jobs."""

from __future__ import annotations

import contextlib
import time

from entrypoint.log import log
from entrypoint.plan import REPORT_KEY_ENV, LaunchPlan, Role
from entrypoint.supervise import OutputCollector, StopRequest, Supervisor, stop_signals_set

# liveness (and with it socket) is imported where a multi-host launch uses it: a 1-host job
# never needs it (tests/entrypoint/test_startup_imports.py).


def wait_for_hosts(hosts: tuple[str, ...], timeout_s: float) -> list[str]:
    """Hosts that still do not resolve after timeout_s (SageMaker's DNS can lag at start)."""
    import socket

    deadline = time.monotonic() + timeout_s
    pending = list(hosts)
    delay = 0.1
    while True:
        for host in list(pending):
            try:
                socket.getaddrinfo(host, None)
                pending.remove(host)
            except OSError:
                pass
        if not pending or time.monotonic() >= deadline:
            return pending
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 5.0)


def describe_port_problem(port: int, host: str, error: OSError) -> str:
    """One line for a job port we could not open, naming the setting that moves it."""
    import errno

    if error.errno == errno.EADDRINUSE:
        return (f"port {port} on {host} is already in use by another process: the job's peers reach each "
                f"other there; set BYOC_JOB_PORT to a free port (or BYOC_MASTER_PORT, which it follows)")
    return f"cannot listen on port {port} on {host} (BYOC_JOB_PORT): {error.strerror or error}"


class StartProblem(Exception):
    """A multi-host job could not start (workers never answered, stopped while waiting)."""

    def __init__(self, reason: str, stopped_by: str | None):
        super().__init__(reason)
        self.stopped_by = stopped_by


MAX_REFUSED_LOGGED = 5
# The roles whose hosts end the job over their job ports (each worker tells the leader); an
# MPI leader tells its workers over SSH instead (mpi_hosts.py).
JOB_PORT_ROLES = (Role.TORCHRUN, Role.PARAMETER_SERVER)


class HostServices:
    """What runs beside the job's processes on a multi-host launch (see liveness.py)."""

    def __init__(self, plan: LaunchPlan, collector: OutputCollector) -> None:
        self.plan = plan
        self.collector = collector
        self.told_workers = False
        self.start_problem: StartProblem | None = None  # the launch could not start (host_services)
        self.lost: str | None = None  # a host stopped answering (liveness.PeerWatch)
        self.peer_failed: str | None = None  # a worker host's part failed while this leader's ran
        self.job_port = None  # liveness.JobPort
        self.sshd: object = None
        self.watch = None  # liveness.PeerWatch
        self.rendezvous_watch = None
        self.supervisor: Supervisor | None = None  # the current run's
        self.refused_reports = 0
        self.worker_outcomes = None  # liveness.HostOutcomes, on a torchrun / parameter-server leader

    def ask_other_hosts_for_stacks(self):
        """Under a multi-host mpirun, the leader asks each worker's entrypoint (SIGUSR1 over
        SSH) to have its ranks print their stacks, which reach the leader's log through mpirun;
        None elsewhere (torchrun and PS hosts each watch their own ranks)."""
        plan = self.plan
        if plan.role != Role.MPI_LEADER or not plan.multi_host:
            return None
        from entrypoint import mpi_hosts

        return lambda: mpi_hosts.ask_workers_for_stacks(plan, log)

    def on_refused_report(self, address: str, why: str) -> None:
        """A report on the job port that is not this job's: logged (the first few), dropped."""
        if why.startswith("a host's outcome"):  # always logged: the leader waits for these
            log(f"ignored a report on the job port from {address}: {why}")
            return
        self.refused_reports += 1
        if self.refused_reports <= MAX_REFUSED_LOGGED:
            log(f"ignored a report on the job port from {address}: {why}"
                + (" (further ones are not logged)" if self.refused_reports == MAX_REFUSED_LOGGED else ""))

    def watch_peers(self, supervisor: Supervisor) -> None:
        """Called as each run's processes start; the watch itself starts once and spans the
        restarts of a job (restarts.py), stopping whichever run is current."""
        self.supervisor = supervisor
        plan = self.plan
        for host, code in (self.worker_outcomes.codes().items() if self.worker_outcomes else ()):
            self.on_host_done(host, code)  # a worker that failed before this run started
        if not plan.multi_host or self.watch is not None:
            return
        from entrypoint.liveness import PeerWatch

        port = plan.settings.ssh_port if plan.role == Role.MPI_LEADER else plan.settings.job_port

        def on_lost(host: str, reason: str) -> None:
            self.lost = reason
            self.supervisor.stop_after_failure(f"{reason}: the job cannot go on")

        if plan.role == Role.TORCHRUN and not plan.is_leader:
            # torchrun on this host waits for the leader's rendezvous store with no limit of
            # its own (seen: > 10 min, silent) when the leader's host is up but its torchrun
            # never listens; the job port alone cannot tell.
            self.rendezvous_watch = PeerWatch(
                [plan.leader], plan.settings.master_port, plan.settings.host_lost_timeout_s,
                plan.settings.peer_wait_timeout_s, on_lost, until_first_contact=True,
                port_name=" (torchrun's rendezvous, BYOC_MASTER_PORT)")
        self.watch = PeerWatch(
            list(plan.peers), port, plan.settings.host_lost_timeout_s, plan.settings.peer_wait_timeout_s, on_lost,
            seen_at_start=plan.role == Role.MPI_LEADER,  # start_leader has just reached every worker
        )

    def on_host_done(self, host: str, exit_code: int) -> None:
        """A worker host's part ended (its JobPort report, liveness.send_host_done). One that
        failed while this host still runs ends the job now, not when its port is missed."""
        if host not in self.plan.peers:
            self.on_refused_report(host, "an outcome from a host that is not one of this leader's workers")
            return
        self.worker_outcomes.add(host, exit_code)
        supervisor = self.supervisor
        if exit_code == 0 or supervisor is None or self.lost is not None or self.peer_failed is not None:
            return
        # Only a run still going, and not already being stopped (SIGTERM to every host, or a
        # failure here): the worker's failure is then a consequence, not news.
        if supervisor.kill_at is None and any(proc.poll() is None for _, proc in supervisor.children):
            self.peer_failed = f"Host {host}'s part of the job failed (exit code {exit_code})"
            supervisor.stop_after_failure(f"host {host}'s part of the job failed (exit code {exit_code}): "
                                          f"the job cannot go on")

    def wait_for_workers(self, stopped_by: str | None = None) -> tuple[str, int] | None:
        """On a torchrun / parameter-server leader whose own part succeeded: wait until every
        worker host's part has ended too (each tells this host's job port); the first worker
        that failed, as (host, exit code), or None. Not when this host was stopped (stopped_by:
        StopTrainingJob stops every host, and compose stops the rest once one has exited): a
        worker's 143 then is the same stop, not a failure of the job.

        Why: SDK v2 local mode stops every container as soon as the first one exits
        (`docker-compose up --abort-on-container-exit`); a leader that ended first stopped a
        worker host whose ranks were still finishing (exit 143, the job failed). On SageMaker
        the job's outcome is every host's. Bounded by BYOC_PEER_WAIT_TIMEOUT_S; a worker that
        stops answering without a word is not waited for; SIGTERM ends the wait."""
        plan = self.plan
        if plan.role not in JOB_PORT_ROLES or not plan.is_leader or self.worker_outcomes is None or stopped_by:
            return None
        for watch in (self.watch, self.rendezvous_watch):
            if watch is not None:
                watch.close()  # this host's part is over: a worker leaving now is not a lost host
        self.watch = self.rendezvous_watch = None
        pending = [h for h in plan.peers if h not in self.worker_outcomes.codes()]
        if pending:
            log(f"{plan.current_host}: waiting for {len(pending)} worker host(s) to finish: {', '.join(pending)}")
        stop = StopRequest()
        with stop_signals_set(stop):
            codes, gone, how = self.worker_outcomes.wait_for(
                plan.peers, plan.settings.job_port, plan.settings.peer_wait_timeout_s,
                stopped=lambda: stop.signal_name is not None)
        for host in gone:
            log(f"{plan.current_host}: worker host {host} stopped answering without reporting its outcome "
                f"(its own output/failure has it)")
        if how == "timeout":
            log(f"{plan.current_host}: worker host(s) {', '.join(h for h in plan.peers if h not in codes and h not in gone)} "
                f"had not reported the end of their part after {plan.settings.peer_wait_timeout_s:g} s "
                f"(BYOC_PEER_WAIT_TIMEOUT_S); ending without their outcome")
        failed = [(h, codes[h]) for h in plan.peers if codes.get(h, 0) != 0]
        return failed[0] if failed else None

    def tell_leader(self, exit_code: int, stop: StopRequest | None = None) -> bool:
        """On a torchrun / parameter-server worker host: this host's part has ended, with
        exit_code; the leader waits for that word from every worker (wait_for_workers). A
        failing host tries for less long: its leader may be what failed. True when the word
        was delivered (False also on other roles)."""
        plan = self.plan
        if plan.role not in JOB_PORT_ROLES or not plan.multi_host or plan.is_leader:
            return False
        from entrypoint.liveness import SEND_DONE_FOR_S, send_host_done

        delivered = send_host_done(plan.leader, plan.settings.job_port, plan.env_dict.get(REPORT_KEY_ENV, ""),
                                   plan.current_host, exit_code, within_s=SEND_DONE_FOR_S if exit_code == 0 else 1.0,
                                   stopped=lambda: stop is not None and stop.signal_name is not None)
        if not delivered:
            log(f"{plan.current_host}: could not tell the leader {plan.leader} (port {plan.settings.job_port}) "
                f"that this host's part ended (it has ended, or is unreachable); it will notice this host go")
        return delivered

    def tell_workers(self, exit_code: int, report: str | None) -> None:
        """The job's outcome, once: an MPI leader writes it on every worker (mpi_hosts.py),
        which then exits with it. Other roles' hosts each see the job end for themselves."""
        if self.told_workers or self.plan.role != Role.MPI_LEADER or not self.plan.multi_host:
            return
        from entrypoint import mpi_hosts

        self.told_workers = True
        mpi_hosts.tell_workers(self.plan, exit_code, report, log)


@contextlib.contextmanager
def host_services(plan: LaunchPlan, collector: OutputCollector):
    """Start what a multi-host launch needs beside its processes, yield it, and stop it; the
    caller hands the job's outcome to services.tell_workers. What kept the launch from
    starting (workers that never answered, a stop while waiting, a busy job port) is
    services.start_problem, for the caller to report first and then tell the workers. A
    launch that ends without telling them (an error of ours) tells MPI workers exit code 1."""
    services = HostServices(plan, collector)
    mpi_leader = plan.role == Role.MPI_LEADER and plan.multi_host
    if mpi_leader:
        from entrypoint import mpi_hosts  # multi-host paths only: a 1-host job never imports it
    try:
        if mpi_leader:
            stop = StopRequest()
            with stop_signals_set(stop):
                services.sshd, problem = mpi_hosts.start_leader(plan, stop, log)
            if problem:
                services.start_problem = StartProblem(problem, stop.signal_name)
        elif plan.multi_host:
            # Every host's port also takes root-cause reports from ranks on every host, so
            # each host's output/failure can lead with the job's first failure (SDK v2 local
            # mode keeps only the last host's).
            from entrypoint.liveness import HostOutcomes, JobPort

            if plan.is_leader:
                services.worker_outcomes = HostOutcomes()
            try:
                services.job_port = JobPort(plan.settings.job_port, collector.add_line_text,
                                            report_key=plan.env_dict.get(REPORT_KEY_ENV, ""),
                                            on_refused=services.on_refused_report,
                                            on_host_done=services.on_host_done if plan.is_leader else None)
            except OSError as exc:
                services.start_problem = StartProblem(describe_port_problem(plan.settings.job_port, plan.current_host, exc), None)
        yield services
    finally:
        for watch in (services.watch, services.rendezvous_watch):
            if watch is not None:
                watch.close()
        if mpi_leader:
            services.tell_workers(1, None)  # only when the caller did not
            mpi_hosts.stop_leader(plan, services.sshd)
        if services.job_port is not None:
            services.job_port.close()


def finish_worker_host(plan: LaunchPlan, services: HostServices) -> None:
    """A torchrun / parameter-server worker host whose processes succeeded (its outcome is
    written) tells the leader so, then waits for the leader to finish before exiting, its job
    port still open.

    Why: SageMaker local mode (SDK v2) runs `docker-compose up --abort-on-container-exit`:
    the first container to exit stops all the others. A worker host that ends first would stop
    the leader while rank 0 still saves the model (and compose reports the job a success from
    the worker's exit code). The leader waits for every worker's word (wait_for_workers), then
    closes its job port once its outcome is written. Bounded by BYOC_PEER_WAIT_TIMEOUT_S; SIGTERM
    (the leader exited, compose stops this container) ends the wait, and this host still exits 0."""
    if plan.role not in JOB_PORT_ROLES or not plan.multi_host or plan.is_leader:
        return
    from entrypoint.liveness import wait_until_port_closes

    stop = StopRequest()
    with stop_signals_set(stop):  # from the first word to the leader on: it may exit at once
        if not services.tell_leader(0, stop):
            return  # nobody waits for this host's word: waiting for the leader would only hold it up
        how = wait_until_port_closes(plan.leader, plan.settings.job_port, plan.settings.peer_wait_timeout_s,
                                     stopped=lambda: stop.signal_name is not None)
    if how == "timeout":
        log(f"{plan.current_host}: the leader {plan.leader} was still running after "
            f"{plan.settings.peer_wait_timeout_s:g} s (BYOC_PEER_WAIT_TIMEOUT_S); exiting")

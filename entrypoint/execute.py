"""Run a LaunchPlan: the one layer that starts processes and writes output/success|failure.

- Every child runs in its own process group (own session), never through a shell.
- SIGTERM/SIGINT to us are forwarded to every child's group; after the grace period the
  groups get SIGKILL. When one of several processes fails, the others get the same treatment.
- Output is streamed live, byte for byte; a bounded tail is kept for the failure report, and
  the root-cause lines that ranks print (see rank/record_errors.py) are collected.
"""

from __future__ import annotations

import collections
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import NamedTuple

from entrypoint import processes, ssh
from entrypoint.errors import EXIT_BAD_JOB
from entrypoint.liveness import JobPort, PeerWatch, wait_until_port_closes
from entrypoint.failure import (
    build_failure_report,
    build_job_outcome_report,
    describe_exit_code,
    describe_root_cause,
    first_root_cause,
    parse_root_cause_line,
    redact,
    secret_values,
)
from entrypoint.paths import MlPaths
from entrypoint.plan import REPORT_KEY_ENV, LaunchPlan, ProcessSpec
from entrypoint.probe import load_oom_kill_count
from entrypoint.restarts import RunEnding, build_earlier_failures_note, build_restart_line, decide_restart
from entrypoint.program import CodeSource

TAIL_LINES = 100
DISTRIBUTED_ROLES = ("mpi-leader", "torchrun", "parameter-server")
TAIL_LINE_CHARS = 500
MAX_CAPTURED_LINES = 50000  # the ranks' stack dumps when a hang is suspected
POLL_S = 0.01


def log(message: str) -> None:
    sys.stderr.write(f"[entrypoint] {message}\n")
    sys.stderr.flush()


class OutputCollector:
    """Shared by the pumps of every child: the tail and the root causes seen so far."""

    def __init__(self, secrets: list[str] | tuple[str, ...] = ()) -> None:
        self.tail: collections.deque = collections.deque(maxlen=TAIL_LINES)
        self.root_causes: list = []
        self.lock = threading.Lock()
        self.secrets = list(secrets)  # masked in each line before it is cut to TAIL_LINE_CHARS
        self.last_output = time.monotonic()  # when a child last printed a line (hang detection)
        self.capture: list[str] | None = None  # every line, while stacks are being collected

    def redact(self, text: str) -> str:
        return redact(text, self.secrets) if self.secrets else text

    def reset(self) -> None:
        """Forget the tail and root causes (a restarted job's next attempt reports on its own)."""
        with self.lock:
            self.tail.clear()
            self.root_causes.clear()

    def add_line(self, raw: bytes) -> None:
        self.add_line_text(raw.decode("utf-8", "replace"))

    def start_capture(self) -> None:
        with self.lock:
            self.capture = []

    def captured(self) -> list[str]:
        with self.lock:
            return list(self.capture or [])

    def add_line_text(self, line: str) -> None:
        line = line.rstrip("\r\n")
        cause = parse_root_cause_line(line) if "BYOC-ROOT-CAUSE" in line else None
        with self.lock:
            self.last_output = time.monotonic()
            if self.capture is not None and len(self.capture) < MAX_CAPTURED_LINES:
                self.capture.append(line)
            if cause is not None:
                self.root_causes.append(cause)
            else:
                if self.secrets:
                    line = redact(line, self.secrets)
                self.tail.append(line[:TAIL_LINE_CHARS])


def _pump(pipe, sink, collector: OutputCollector) -> None:
    partial = b""
    try:
        while True:
            chunk = pipe.read1(65536)
            if not chunk:
                break
            sink.write(chunk)
            sink.flush()
            partial += chunk
            *lines, partial = partial.split(b"\n")
            for line in lines:
                collector.add_line(line)
            if len(partial) > 65536:  # a very long line (progress bars with \r): keep moving
                # Masked before it is cut (add_line masks, then keeps the line's start).
                tail = collector.redact(partial[-8 * TAIL_LINE_CHARS:].decode("utf-8", "replace"))
                collector.add_line_text(tail[-TAIL_LINE_CHARS:])
                partial = b""
    except (OSError, ValueError):
        pass
    finally:
        if partial:
            collector.add_line(partial)
        pipe.close()


# When one of the job's processes fails (or a host is lost), the others are stopped: SIGTERM,
# then SIGKILL after this long. It is not the grace period: that one is for a stop the platform
# asked for (StopTrainingJob, spot interruption), where scripts checkpoint. A failed job only
# needs its processes gone, and every failure path must end within a minute.
FAILURE_STOP_S = 10.0


class Supervisor:
    def __init__(self, grace_period_s: float, collector: OutputCollector, hang_timeout_s: float = 0.0,
                 host: str = "this host", ask_other_hosts=None):
        self.grace_period_s = grace_period_s
        self.collector = collector
        self.hang_timeout_s = hang_timeout_s  # 0: off (hangs.py)
        self.host = host
        self.ask_other_hosts = ask_other_hosts  # asks the other hosts' ranks for their stacks, or None
        self.hang_asked_at: float | None = None
        self.hang_rank_order: list[str] = []
        self.hang_reason: str | None = None
        self.children: list[tuple[ProcessSpec, subprocess.Popen]] = []
        self.pumps: list[threading.Thread] = []
        self.stopped_by: str | None = None
        self.stopped_at: float | None = None  # time.time() of the stop request
        self.kill_at: float | None = None
        self.killed_at_deadline = False  # we sent SIGKILL when the grace period ran out

    def start(self, spec: ProcessSpec, env: dict[str, str], cwd: str) -> None:
        try:
            proc = subprocess.Popen(
                list(spec.argv),
                env=env,
                cwd=spec.cwd or cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except (OSError, ValueError) as error:
            from entrypoint.launch_errors import describe_launch_error  # only when a start fails

            argv = list(spec.argv)
            raise LaunchError(describe_launch_error(argv, env, error, shebang=_names_its_interpreter(argv))) from None
        self.children.append((spec, proc))
        for pipe, sink in ((proc.stdout, sys.stdout.buffer), (proc.stderr, sys.stderr.buffer)):
            t = threading.Thread(target=_pump, args=(pipe, sink, self.collector), daemon=True)
            t.start()
            self.pumps.append(t)

    def _groups(self, stop_request: bool) -> list[int]:
        """Process groups to signal. For a stop request, a launcher whose spec says so
        (mpirun) is passed over for the ranks it started here; SIGKILL takes them all."""
        table = processes.load_process_table() if any(s.signal_ranks for s, _ in self.children) else {}
        groups: list[int] = []
        for spec, proc in self.children:
            ranks = processes.decide_rank_groups(table, [proc.pid]) if spec.signal_ranks else []
            if stop_request and ranks:
                groups += ranks
            else:
                groups += [proc.pid, *ranks]
        return groups

    def signal_all(self, sig: int, stop_request: bool = False) -> None:
        processes.signal_groups(self._groups(stop_request), sig)

    def _kill_within(self, delay_s: float) -> None:
        kill_at = time.monotonic() + delay_s
        self.kill_at = kill_at if self.kill_at is None else min(self.kill_at, kill_at)

    def stop_after_failure(self, why: str) -> None:
        """One process failed or a host was lost: end the others within FAILURE_STOP_S."""
        if self.kill_at is None:
            log(f"{why}; stopping the other processes")
        self.signal_all(signal.SIGTERM)
        self._kill_within(min(self.grace_period_s, FAILURE_STOP_S))

    def ask_ranks_for_stacks(self, gap_s: float = 0.0) -> list[str]:
        """SIGUSR1 to every Python rank below our children (each prints its stack); the
        ranks' labels in the order they were asked."""
        roots = [proc.pid for _, proc in self.children]
        return processes.signal_ranks_below(roots, signal.SIGUSR1, gap_s)

    def on_stack_request(self, _signum, _frame) -> None:
        """SIGUSR1: every Python rank on this host prints its stack (rank/record_errors.py),
        and under a multi-host mpirun every worker's too; the job goes on."""
        asked = self.ask_ranks_for_stacks()
        log(f"SIGUSR1: asking {len(asked)} rank process(es) on this host for their Python stacks"
            + (" and the other hosts' entrypoints for theirs" if self.ask_other_hosts else ""))
        if self.ask_other_hosts is not None:
            threading.Thread(target=self.ask_other_hosts, daemon=True).start()  # ssh: not in a signal handler

    def check_for_hang(self) -> None:
        """No line from any child for hang_timeout_s: ask every rank for its stack; STACK_WAIT_S
        later, stop the job naming where the ranks were (hangs.py)."""
        from entrypoint import hangs  # only jobs that set BYOC_HANG_TIMEOUT_S

        now = time.monotonic()
        if self.hang_asked_at is None:
            if now - self.collector.last_output < self.hang_timeout_s:
                return
            self.hang_asked_at = now
            self.collector.start_capture()
            log(f"no output from any process for {self.hang_timeout_s:g} s (BYOC_HANG_TIMEOUT_S): asking every "
                f"rank for its Python stack")
            if self.ask_other_hosts is not None:
                threading.Thread(target=self.ask_other_hosts, daemon=True).start()
            ranks = processes.load_rank_pids_below([proc.pid for _, proc in self.children])
            gap = min(hangs.STACK_REQUEST_GAP_S, 2.0 / max(1, len(ranks)))
            self.hang_rank_order = self.ask_ranks_for_stacks(gap)
        elif now - self.hang_asked_at >= hangs.STACK_WAIT_S and self.hang_reason is None:
            places = hangs.parse_stack_dumps(self.collector.captured(), self.hang_rank_order)
            self.hang_reason = hangs.build_hang_reason(self.hang_timeout_s, self.host, places)
            self.stop_after_failure(self.hang_reason.rstrip("."))

    def on_signal(self, signum, _frame) -> None:
        name = signal.Signals(signum).name
        if self.stopped_by is None:
            self.stopped_by = name
            self.stopped_at = time.time()
            log(f"received {name}: forwarding it to the job, SIGKILL in {self.grace_period_s:g} s")
        self.signal_all(signum, stop_request=True)
        self._kill_within(self.grace_period_s)

    def wait(self) -> int:
        """Wait for every child; the exit code of the first that failed, else 0."""
        first_failure: int | None = None
        running = list(self.children)
        while running:
            for item in list(running):
                spec, proc = item
                code = proc.poll()
                if code is None:
                    continue
                running.remove(item)
                code = 128 - code if code < 0 else code
                if code != 0 and first_failure is None:
                    first_failure = code
                    if running:
                        self.stop_after_failure(f"{spec.name} exited with code {code}")
            if self.hang_timeout_s and running and self.stopped_by is None and self.hang_reason is None \
                    and (self.kill_at is None or self.hang_asked_at is not None):
                self.check_for_hang()
            if self.kill_at is not None and time.monotonic() >= self.kill_at and running:
                log("time is up: sending SIGKILL")
                self.signal_all(signal.SIGKILL)
                self.killed_at_deadline = True
                self.kill_at = float("inf")
            if running:
                # As PID 1 of a container we inherit orphans (a rank whose launcher died):
                # reap them so none stays a zombie.
                processes.reap_orphans({proc.pid for _, proc in running})
                time.sleep(POLL_S)
        # Orphans (data-loader workers, a forked server, ranks in groups of their own) die too.
        self.signal_all(signal.SIGKILL)
        processes.reap_orphans(set())
        for t in self.pumps:
            t.join(timeout=5)
        return first_failure or 0


class RunResult(NamedTuple):
    exit_code: int
    stopped_by: str | None = None
    stopped_at: float | None = None
    launch_error: str | None = None  # one line, when a process could not be started
    killed_at_deadline: bool = False  # SIGKILLed by us when the grace period ran out
    oom_kills: int | None = None  # the kernel's OOM kills in our memory cgroup during the run
    hang: str | None = None  # why the job was stopped as hung (hangs.py)


class StartupStopped(BaseException):  # not caught by the `except Exception` of a start-up step
    """SIGTERM or SIGINT before the training processes started (see on_startup_signal)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# Set once the training processes (or, on an MPI worker, the wait for the leader) begin: from
# then on the run's own handlers decide what a stop means.
_training_started = False


def on_startup_signal(signum, _frame) -> None:
    """The handler for the whole start-up (installed first thing by cli.main): as PID 1 a
    process gets no default action for SIGTERM, so without a handler a stop during start-up
    (reading /opt/ml, waiting for DNS, fetching code, installing requirements) was dropped
    and the container ran on until SIGKILL. Raises StartupStopped, which cli.main reports.
    Once training has begun, a stop that reaches this handler (between the run's own
    handlers) is only logged: the job is finishing and its outcome is being written."""
    if _training_started:
        log(f"received {signal.Signals(signum).name} while finishing; finishing")
        return
    raise StartupStopped(signum)


def on_stack_request_without_ranks(_signum, _frame) -> None:
    """SIGUSR1 outside a run (start-up, waits): no rank to ask; it must not end the process."""
    log("SIGUSR1: no training process is running on this host yet (or any more)")


def mark_training_started() -> None:
    global _training_started
    _training_started = True


class LaunchError(Exception):
    """A process could not be started (the message is one line naming the cause)."""


def _names_its_interpreter(argv: list[str]) -> bool:
    """argv is [interpreter, program, ...] taken from the program's own #! line."""
    if len(argv) < 2:
        return False
    try:
        with open(argv[1], "rb") as f:
            first_line = f.readline(4096)
    except OSError:
        return False
    return first_line.startswith(b"#!") and os.fsencode(argv[0]) in first_line


def run_processes(
    processes_: tuple[ProcessSpec, ...],
    env: dict[str, str],
    cwd: str,
    grace_period_s: float,
    collector: OutputCollector,
    on_started=None,
    hang_timeout_s: float = 0.0,
    host: str = "this host",
    ask_other_hosts=None,
) -> RunResult:
    supervisor = Supervisor(grace_period_s, collector, hang_timeout_s, host, ask_other_hosts)
    oom_before = load_oom_kill_count()
    previous = {s: signal.signal(s, supervisor.on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    previous[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, supervisor.on_stack_request)
    try:
        try:
            for spec in processes_:
                supervisor.start(spec, {**env, **dict(spec.env)}, cwd)
        except LaunchError as error:
            supervisor.signal_all(signal.SIGKILL)  # what did start cannot run without the rest
            for _, proc in supervisor.children:
                proc.wait()
            return RunResult(EXIT_BAD_JOB, launch_error=str(error))
        if on_started is not None:
            on_started(supervisor)
        code = supervisor.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    oom_after = load_oom_kill_count() if code else None  # only a failure needs telling apart
    oom_kills = oom_after - oom_before if oom_after is not None and oom_before is not None else None
    if supervisor.hang_reason is not None:
        from entrypoint.hangs import HANG_EXIT_CODE

        code = HANG_EXIT_CODE
    return RunResult(code, supervisor.stopped_by, supervisor.stopped_at,
                     killed_at_deadline=supervisor.killed_at_deadline, oom_kills=oom_kills, hang=supervisor.hang_reason)


# --- code preparation ------------------------------------------------------------------------


def fetch_code(source: CodeSource, code_dir: str) -> None:
    from entrypoint.archive import extract_tar  # only jobs whose code arrives as an archive

    os.makedirs(code_dir, exist_ok=True)
    if source.kind == "local_dir":
        shutil.copytree(source.uri, code_dir, dirs_exist_ok=True, symlinks=True)
    elif source.kind == "local_tar":
        extract_tar(source.uri, code_dir)
    elif source.kind == "s3":
        import boto3  # only when code comes from S3: boto3 costs ~0.3 s to import

        bucket, _, key = source.uri[len("s3://"):].partition("/")
        client = boto3.client("s3", endpoint_url=os.environ.get("S3_ENDPOINT_URL") or None)
        import tempfile  # only when the code is fetched: it costs every start-up a few ms

        with tempfile.TemporaryDirectory() as tmp:
            archive = os.path.join(tmp, "sourcedir.tar.gz")
            client.download_file(bucket, key, archive)
            extract_tar(archive, code_dir)


def wait_for_hosts(hosts: tuple[str, ...], timeout_s: float) -> list[str]:
    """Hosts that still do not resolve after timeout_s (SageMaker's DNS can lag at start)."""
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


# --- the whole run -----------------------------------------------------------------------------


def clear_previous_outcome(paths: MlPaths) -> None:
    """A tree reused for a second local run still holds the first run's outcome; SageMaker
    never hands us one. Remove it so "the script wrote its own failure file" means this run."""
    for path in (paths.failure_file, paths.success_file):
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        except OSError as exc:  # a read-only output folder: nothing of ours to clear there
            if os.path.exists(path):
                log(f"cannot remove the previous run's {path}: {exc.strerror or exc}")


def write_outcome(paths: MlPaths, exit_code: int, report: str | None) -> None:
    """output/success or output/failure. A read-only or full /opt/ml/output does not change
    the job's exit code: the reason goes to stderr (the job's log) instead."""
    try:
        os.makedirs(paths.output_dir, exist_ok=True)
        if exit_code == 0:
            with open(paths.success_file, "w"):
                pass
            return
        if os.path.exists(paths.failure_file):
            log("the script wrote its own output/failure; leaving it as it is")
            return
        with open(paths.failure_file, "w", encoding="utf-8") as f:
            f.write(report or "")
    except OSError as exc:
        what = paths.success_file if exit_code == 0 else paths.failure_file
        log(f"cannot write {what}: {exc.strerror or exc}; the job's exit code is {exit_code}"
            + (f"; its reason: {report.strip()}" if report else ""))


def load_failure_file(paths: MlPaths) -> str | None:
    try:
        with open(paths.failure_file, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


@contextlib.contextmanager
def stop_signals_set(stop: "mpi_hosts.StopRequest"):
    """While waiting (not running children), SIGTERM/SIGINT only mark the wait as stopped."""

    def on_signal(signum, _frame):
        stop.signal_name = signal.Signals(signum).name
        log(f"received {stop.signal_name}")

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def run_mpi_worker(plan: LaunchPlan, paths: MlPaths, env: dict[str, str]) -> int:
    from entrypoint import mpi_hosts  # multi-host paths only: a 1-host job never imports it
    log(f"{plan.current_host}: MPI worker for the leader {plan.leader}")
    stop = mpi_hosts.StopRequest()

    def on_stack_request(_signum, _frame) -> None:
        # The ranks mpirun started here (under orted, which we adopted as subreaper).
        asked = processes.signal_ranks_below([os.getpid()], signal.SIGUSR1)
        log(f"SIGUSR1: asked {len(asked)} rank process(es) on {plan.current_host} for their Python stacks")

    previous = signal.signal(signal.SIGUSR1, on_stack_request)
    try:
        with stop_signals_set(stop):
            outcome = mpi_hosts.run_worker(plan, stop, log)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    code = outcome.exit_code
    if code == 0:
        write_outcome(paths, 0, None)
        log(f"{plan.current_host}: the leader reports success")
        return 0
    if outcome.reason is not None:
        text = build_job_outcome_report(outcome.reason, env)
    elif outcome.leader_report:
        # The leader's report, whose first lines are the job's root cause: SDK v2 local mode
        # keeps only the last host's output/failure, and that is a worker's.
        text = build_job_outcome_report(
            f"{outcome.leader_report.rstrip()}\n\n({plan.current_host} ended with the job; this report is the leader {plan.leader}'s.)",
            env,
        )
    else:
        text = build_job_outcome_report(
            f"The MPI job failed: the leader {plan.leader} reported exit code {code}. "
            f"The leader's output/failure names the first failing host, rank and exception.",
            env,
        )
    write_outcome(paths, code, text)
    log(f"{plan.current_host}: FAILED: {text.splitlines()[0]}")
    return code


def describe(plan: LaunchPlan) -> str:
    if plan.role == "single":
        return f"{plan.entry.program}"
    if plan.role == "mpi-leader":
        return f"mpirun on {len(plan.hosts)} host(s)"
    if plan.role == "torchrun":
        return f"torchrun on {len(plan.hosts)} host(s)"
    if plan.role == "parameter-server":
        return f"the parameter-server job on {len(plan.hosts)} host(s)"
    return f"{plan.entry.program} ({plan.role})"


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


class HostServices:
    """What runs beside the job's processes on a multi-host launch (see liveness.py)."""

    def __init__(self, plan: LaunchPlan, collector: OutputCollector) -> None:
        self.plan = plan
        self.collector = collector
        self.exit_code = 1
        self.failure_report: str | None = None  # what the leader tells MPI workers when the job failed
        self.lost: str | None = None
        self.job_port: JobPort | None = None
        self.sshd: object = None
        self.watch: PeerWatch | None = None
        self.supervisor: Supervisor | None = None  # the current run's
        self.refused_reports = 0

    def ask_other_hosts_for_stacks(self):
        """Under a multi-host mpirun, the leader asks each worker's entrypoint (SIGUSR1 over
        SSH) to have its ranks print their stacks, which reach the leader's log through mpirun;
        None elsewhere (torchrun and PS hosts each watch their own ranks)."""
        plan = self.plan
        if plan.role != "mpi-leader" or len(plan.hosts) < 2:
            return None
        from entrypoint import mpi_hosts

        return lambda: mpi_hosts.ask_workers_for_stacks(plan, log)

    def on_refused_report(self, address: str, why: str) -> None:
        """A report on the job port that is not this job's: logged (the first few), dropped."""
        self.refused_reports += 1
        if self.refused_reports <= MAX_REFUSED_LOGGED:
            log(f"ignored a report on the job port from {address}: {why}"
                + (" (further ones are not logged)" if self.refused_reports == MAX_REFUSED_LOGGED else ""))

    def watch_peers(self, supervisor: "Supervisor") -> None:
        """Called as each run's processes start; the watch itself starts once and spans the
        restarts of a job (restarts.py), stopping whichever run is current."""
        self.supervisor = supervisor
        plan = self.plan
        if plan.role not in DISTRIBUTED_ROLES or len(plan.hosts) < 2 or self.watch is not None:
            return
        peers = [h for h in plan.hosts if h != plan.current_host] if plan.current_host == plan.leader else [plan.leader]
        port = plan.settings.ssh_port if plan.role == "mpi-leader" else plan.settings.job_port

        def on_lost(host: str, reason: str) -> None:
            self.lost = reason
            self.supervisor.stop_after_failure(f"{reason}: the job cannot go on")

        self.watch = PeerWatch(
            peers, port, plan.settings.host_lost_timeout_s, plan.settings.peer_wait_timeout_s, on_lost,
            seen_at_start=plan.role == "mpi-leader",  # start_leader has just reached every worker
        )


@contextlib.contextmanager
def host_services(plan: LaunchPlan, collector: OutputCollector):
    services = HostServices(plan, collector)
    multi_host = plan.role in DISTRIBUTED_ROLES and len(plan.hosts) > 1
    if plan.role == "mpi-leader" and multi_host:
        from entrypoint import mpi_hosts  # multi-host paths only: a 1-host job never imports it
    try:
        if plan.role == "mpi-leader" and multi_host:
            stop = mpi_hosts.StopRequest()
            with stop_signals_set(stop):
                services.sshd, problem = mpi_hosts.start_leader(plan, stop, log)
            if problem:
                raise StartProblem(problem, stop.signal_name)
        elif multi_host:
            # Every host's port also takes root-cause reports from ranks on every host, so
            # each host's output/failure can lead with the job's first failure (SDK v2 local
            # mode keeps only the last host's).
            try:
                services.job_port = JobPort(plan.settings.job_port, collector.add_line_text,
                                            report_key=plan.env_dict.get(REPORT_KEY_ENV, ""),
                                            on_refused=services.on_refused_report)
            except OSError as exc:
                raise StartProblem(describe_port_problem(plan.settings.job_port, plan.current_host, exc), None) from None
        yield services
    finally:
        if services.watch is not None:
            services.watch.close()
        if plan.role == "mpi-leader" and multi_host:
            mpi_hosts.tell_workers(plan, services.exit_code, services.failure_report, log)
            mpi_hosts.stop_process(services.sshd)
            ssh.remove_private_key(mpi_hosts.files_for(plan))
        if services.job_port is not None:
            services.job_port.close()


def run_plan(plan: LaunchPlan, paths: MlPaths, environ: dict[str, str]) -> int:
    env = {**environ, **plan.env_dict}
    collector = OutputCollector(secret_values(env))

    def report(what: str, code: int, run: RunResult | None = None, lost: str | None = None) -> str:
        return build_failure_report(
            what=what,
            exit_code=code,
            root_cause=first_root_cause(collector.root_causes),
            tail=list(collector.tail),
            current_host=plan.current_host,
            environ=env,
            stopped_by=run.stopped_by if run else None,
            stopped_at=run.stopped_at if run else None,
            lost=lost,
            oom_kills=run.oom_kills if run else None,
            killed_by_us=run.killed_at_deadline if run else False,
        )

    def fail(code: int, text: str) -> int:
        write_outcome(paths, code, text)
        log(f"FAILED: {text.splitlines()[0]}")
        return code

    for step in plan.install:
        what = "installing requirements.txt" if "-r" in step else "installing the source directory as a package"
        log(what)
        run = run_processes((ProcessSpec("pip", step),), env, plan.cwd, plan.settings.grace_period_s, collector)
        if run.launch_error:
            return fail(run.exit_code, f"{what}: {run.launch_error}")
        if run.exit_code != 0:
            return fail(run.exit_code, report(what, run.exit_code, run))

    if plan.role == "mpi-worker":
        mark_training_started()
        return run_mpi_worker(plan, paths, env)

    if plan.role in DISTRIBUTED_ROLES and len(plan.hosts) > 1:
        unresolved = wait_for_hosts(plan.hosts, plan.settings.host_resolution_timeout_s)
        if unresolved:
            collector.tail.append(
                f"host(s) {', '.join(unresolved)} did not resolve within "
                f"{plan.settings.host_resolution_timeout_s:g} s (BYOC_HOST_RESOLUTION_TIMEOUT_S)"
            )
            return fail(1, report("waiting for the other hosts' names to resolve", 1))

    what = describe(plan)
    started = time.monotonic()
    text = None
    try:
        with host_services(plan, collector) as services:
            log(f"{plan.current_host}: running {what} ({plan.role})")
            mark_training_started()
            run, earlier = run_with_restarts(plan, env, collector, services, paths, what)
            services.exit_code = run.exit_code
            if run.launch_error:
                text = f"{what}: {run.launch_error}"
                services.failure_report = text
            elif run.exit_code != 0:
                text = report(what, run.exit_code, run, services.lost)
                if run.hang:
                    text = f"{run.hang}\n\n{text}"
                if earlier:
                    text = f"{text.rstrip()}\n\n{build_earlier_failures_note(earlier)}\n"
                # Workers are told what this host reports: the script's own failure file if
                # it wrote one (write_outcome keeps it), else ours.
                services.failure_report = load_failure_file(paths) or text
            else:
                # Before this host's job port closes (and, on the MPI leader, before the
                # workers are told): a worker may exit as soon as that happens, and local mode
                # then stops this container.
                write_outcome(paths, 0, None)
                log(f"{plan.current_host}: {what} succeeded in {time.monotonic() - started:.1f} s")
                wait_for_leader_to_finish(plan)
    except StartProblem as problem:
        collector.tail.append(str(problem))
        return fail(1, report(f"{what}: starting the workers", 1, RunResult(1, problem.stopped_by)))
    if run.exit_code != 0:
        return fail(run.exit_code, text)
    return 0


def run_with_restarts(plan: LaunchPlan, env: dict[str, str], collector: OutputCollector, services: HostServices,
                      paths: MlPaths, what: str) -> tuple[RunResult, list[str]]:
    """Run the plan's processes; after a crash, again, as long as decide_restart allows
    (restarts.py). Returns the last run and one line for each failure that was restarted."""
    earlier: list[str] = []
    while True:
        run = run_processes(plan.processes, env, plan.cwd, plan.settings.grace_period_s, collector,
                            on_started=services.watch_peers, hang_timeout_s=plan.settings.hang_timeout_s,
                            host=plan.current_host, ask_other_hosts=services.ask_other_hosts_for_stacks())
        ending = RunEnding(run.exit_code, run.stopped_by, run.launch_error, services.lost)
        if decide_restart(plan.role, plan.settings.max_restarts, len(earlier), ending) is not None:
            return run, earlier
        cause = first_root_cause(collector.root_causes)
        summary = describe_root_cause(cause) if cause else describe_exit_code(run.exit_code, run.oom_kills)
        log(build_restart_line(len(earlier), plan.settings.max_restarts, what, run.exit_code, summary))
        earlier.append(summary)
        # The next attempt's failure, if any, is reported on its own: what this one printed
        # stays in the log, and a failure file the script wrote is not the job's outcome.
        collector.reset()
        clear_previous_outcome(paths)


def wait_for_leader_to_finish(plan: LaunchPlan) -> None:
    """A torchrun / parameter-server worker host whose processes succeeded waits for the leader
    to finish before exiting, its job port still open.

    Why: SageMaker local mode (SDK v2) runs `docker-compose up --abort-on-container-exit`:
    the first container to exit stops all the others. A worker host that ends first would stop
    the leader while rank 0 still saves the model (and compose reports the job a success from
    the worker's exit code). The leader closes its job port once its outcome is written.
    Bounded by BYOC_PEER_WAIT_TIMEOUT_S; SIGTERM ends the wait."""
    if plan.role not in ("torchrun", "parameter-server") or len(plan.hosts) < 2 or plan.current_host == plan.leader:
        return
    from entrypoint import mpi_hosts  # multi-host paths only: a 1-host job never imports it
    stop = mpi_hosts.StopRequest()
    with stop_signals_set(stop):
        how = wait_until_port_closes(plan.leader, plan.settings.job_port, plan.settings.peer_wait_timeout_s,
                                     stopped=lambda: stop.signal_name is not None)
    if how == "timeout":
        log(f"{plan.current_host}: the leader {plan.leader} was still running after "
            f"{plan.settings.peer_wait_timeout_s:g} s (BYOC_PEER_WAIT_TIMEOUT_S); exiting")

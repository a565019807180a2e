"""Supervise the job's process tree on this host: start, stream, signal, stop, reap.

- Every child runs in its own process group (own session), never through a shell.
- SIGTERM/SIGINT to us are forwarded to every child's group; after the grace period the
  groups get SIGKILL. A burst of them (a storm of 200 SIGTERM) is forwarded once, as its first
  comes: a script saves on its first SIGTERM, and a later one kills it as it ends (issue 62).
  When one of several processes fails, the others get the same treatment.
- Output is streamed live, byte for byte; a bounded tail is kept for the failure report, and
  the root-cause lines that ranks print (see rank/record_errors.py) are collected.
- A stop reaches a run through the host's loop (entrypoint/loop/): the stop token posts
  StopRequested, and the run's handler (Supervisor.on_stop) forwards it to every process
  started so far. A stop counts from its post: the run looks at the loop just before each
  start, so a stop either prevents it (no process started: the run reports started=False) or
  reaches the process started with SIGTERM: one posted while Popen runs is taken as soon as
  Popen returns; once a stop came, no further process is started. SIGCHLD and SIGUSR1 only
  post ChildExited and StacksRequested; the run's wait is the loop's (take).
- A rank is asked for its stack (SIGUSR1) only once it can answer: once it has a handler for
  the signal (processes.signal_ranks_below); one still starting is passed over, and said, never
  ended by the question. A burst of requests asks the ranks once (a dump takes its time) and
  is said in one line (Burst).
- After the processes end, their output pumps get one shared deadline (settings.thread_join_s),
  not one each: a process the script left running that holds its stdout open costs it once.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, NamedTuple

from entrypoint.run import processes
from entrypoint.errors import EXIT_BAD_JOB
from entrypoint.hosts.job_port import ROOT_CAUSE, parse_root_cause_line
from entrypoint.outcome.failure import SecretLines
from entrypoint.outcome.stops import SIGNAL_EXIT_BASE, decide_stop_exit_code
from entrypoint.log import log
from entrypoint.decide.specs import ProcessSpec
from entrypoint.job.probe import load_oom_kill_count
from entrypoint.run.stop import Stop
from entrypoint.run.tagged_lines import TaggedLines
from entrypoint.loop import Burst, ChildExited, HostLoop, StacksRequested, StopRequested
from entrypoint.run.stop import decide_forwarded_signal
from entrypoint.settings import DEFAULTS, LaunchSettings

TAIL_LINES = 100
TAIL_LINE_CHARS = 500
MAX_CAPTURED_LINES = 50000  # the ranks' stack dumps when a hang is suspected


class OutputCollector:
    """Shared by the pumps of every child: the tail and the root causes seen so far.

    Secrets are masked in each line before it is cut to TAIL_LINE_CHARS, together with the lines
    before it in its stream (failure.SecretLines, one per pump): a secret broken over two lines is
    masked in both tail entries, the earlier one replaced when the later one completes it."""

    class _Line(str):
        """A tail entry of its own identity, so that the collector finds it again to mask the
        part of a secret that a later line of its stream completes."""

        __slots__ = ()

    def __init__(self, secrets: list[str] | tuple[str, ...] = ()) -> None:
        self.tail: collections.deque = collections.deque(maxlen=TAIL_LINES)
        self.root_causes: list = []
        self.lock = threading.Lock()
        self.secrets = list(secrets)  # masked in each line before it is cut to TAIL_LINE_CHARS
        self.last_output = time.monotonic()  # when a child last printed a line (hang detection)
        self.capture: list[str] | None = None  # every line, while stacks are being collected
        self.stream: SecretLines | None = None  # for lines added without a stream of their own
        self.on_line = None  # every line, for the job report (jobreport/metric_lines.py), when on
        # A root cause made before this (epoch s) belongs to an earlier attempt (reset): one a
        # rank of another host sent the job port as attempt N failed can land after N+1 began.
        self.causes_since = 0.0

    def open_stream(self) -> SecretLines | None:
        """The masking state of one stream of lines (a pump's); None when there are no secrets."""
        return SecretLines(self.secrets) if self.secrets else None

    def reset(self) -> None:
        """Forget the tail and root causes (a restarted job's next attempt reports on its own)."""
        with self.lock:
            self.tail.clear()
            self.root_causes.clear()
            self.causes_since = time.time()

    def add_line(self, raw: bytes, stream: SecretLines | None = None) -> None:
        self.add_line_text(raw.decode("utf-8", "replace"), stream)

    def start_capture(self) -> None:
        with self.lock:
            self.capture = []

    def captured(self) -> list[str]:
        with self.lock:
            return list(self.capture or [])

    def add_line_text(self, line: str, stream: SecretLines | None = None, keep_end: bool = False) -> None:
        """keep_end: the tail keeps the line's last TAIL_LINE_CHARS, not its first (a very long
        line's latest part)."""
        line = line.rstrip("\r\n")
        cause = parse_root_cause_line(line) if ROOT_CAUSE in line else None
        if self.on_line is not None:
            self.on_line(line)
        with self.lock:
            self.last_output = time.monotonic()
            if self.capture is not None and len(self.capture) < MAX_CAPTURED_LINES:
                self.capture.append(line)
            if cause is not None:
                if cause.time >= self.causes_since:
                    self.root_causes.append(cause)
            elif not self.secrets:
                self.tail.append(line[-TAIL_LINE_CHARS:] if keep_end else line[:TAIL_LINE_CHARS])
            else:
                # Masked before it is cut; the earlier lines this one completes a secret in, again.
                slot = [None, keep_end]  # [its entry in the tail, keep_end]
                if stream is None:
                    # Made at the first such line, not at start: the secrets' pattern takes
                    # ~20 ms to compile for a long one (an AWS session token); the pumps make
                    # theirs in their own threads.
                    stream = self.stream = self.stream or self.open_stream()
                masked, changed = stream.add(line, slot)
                self.tail.append(self._set_entry(slot, masked))
                for earlier, text in changed:
                    entry, new = earlier[0], self._set_entry(earlier, text)
                    for i in range(len(self.tail) - 1, -1, -1):
                        if self.tail[i] is entry:
                            self.tail[i] = new
                            break

    def _set_entry(self, slot: list, masked: str) -> OutputCollector._Line:
        slot[0] = self._Line(masked[-TAIL_LINE_CHARS:] if slot[1] else masked[:TAIL_LINE_CHARS])
        return slot[0]


def _count_after(argv, option: str) -> int | None:
    """The whole number after option in argv (mpirun's -np), or None."""
    at = argv.index(option) + 1 if option in argv else len(argv)
    return int(argv[at]) if at < len(argv) and argv[at].isdecimal() else None


def _read_chunks(pipe, lines, quiet_s: float):
    """The pipe's bytes as they come; with `lines` (tagged_lines.TaggedLines: mpirun's tagged
    output), rejoined into whole lines, a waiting piece written after quiet_s of quiet."""
    if lines is None:
        while chunk := pipe.read1(65536):
            yield chunk
        return
    import select  # only for mpirun's output

    fd = pipe.fileno()  # read unbuffered: select must see every byte not yet read
    while True:
        if lines.has_partial and not select.select([fd], [], [], quiet_s)[0]:
            yield lines.flush_partial()
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            yield lines.flush_partial()
            return
        yield lines.feed(chunk)


def _pump(pipe, sink, collector: OutputCollector, lines=None, quiet_s: float = DEFAULTS.quiet_line_s) -> None:
    partial = b""
    stream = collector.open_stream()  # this pipe's lines: a secret split over two is masked in both
    try:
        for chunk in _read_chunks(pipe, lines, quiet_s):
            if not chunk:
                continue
            sink.write(chunk)
            sink.flush()
            partial += chunk
            *lines_done, partial = partial.split(b"\n")
            for line in lines_done:
                collector.add_line(line, stream)
            if len(partial) > 65536:  # a very long line (progress bars with \r): keep moving
                # Its end, masked before it is cut (together with what came before and after it).
                end = partial[-8 * TAIL_LINE_CHARS:].decode("utf-8", "replace")
                collector.add_line_text(end, stream, keep_end=True)
                partial = b""
    except (OSError, ValueError):
        pass
    finally:
        if partial:
            collector.add_line(partial, stream)
        pipe.close()


class Adopted(NamedTuple):
    """Ranks this host runs but did not start: an MPI worker's, which mpirun on the leader starts
    over SSH under this host's Open MPI daemon (adopted as subreaper). Such a run starts no
    process of its own and ends when ended() says so (the leader's outcome, or its loss); a stop,
    the capacity's stop time and SIGUSR1 reach the ranks below the launchers at once (signalling
    orted would start Open MPI's teardown instead, with its short kill timeout), and the orphans
    are collected, never kept() ones (sshd: its Popen reads its status)."""

    launchers: tuple[str, ...]
    ended: Callable[[], bool]
    kept: Callable[[], set[int]]


class RunHooks(NamedTuple):
    """What a run needs beside its processes: the settings, and the role's hooks."""

    settings: LaunchSettings = DEFAULTS
    host: str = "this host"
    hang_timeout_s: float = 0.0  # 0: off (hangs.py)
    on_started: object = None  # called with the Supervisor once every process started
    # Asks the other hosts' ranks for their stacks, or None; it returns at once (its sends run off
    # the loop: hosts/job_port.send_to_each).
    ask_other_hosts: object = None
    on_rank_killed: object = None  # the role's: a rank we started died of a signal
    # (epoch s, why): this host stops its processes then, as on SIGTERM (a training plan's
    # capacity ending, decide/capacity.py); stop_reason says why once it did.
    stop_at: tuple[float, str] | None = None
    # The role's, called with the Supervisor before any process starts: what must run from
    # before the processes to after them (the MPI leader's sessions that stream its workers'
    # rank output), added to its followers.
    before_start: object = None
    # Called once, with no argument, when the run begins to stop (a stop signal, the capacity's
    # stop time): the compile cache's keeper writes its archive then (run/compile_cache.py).
    on_stopping: object = None
    # The host's held processes (run/held.HeldProcesses): a start takes the one that is exactly
    # it; once this attempt is under way, the next attempt's are started ahead. None: none.
    held: object = None
    adopted: Adopted | None = None  # a run of ranks this host did not start (Adopted)
    # What the run's loop asks for at its deadline: due_at() (time.monotonic(), or None) and
    # save_when_due() (the compile cache's periodic archive, run/compile_cache.CacheKeeper).
    periodic: object = None


class Supervisor:
    """One run's processes. Written by the main thread only: what the role's threads hear (a
    lost host, a peer's word) reaches it through the host's loop (entrypoint/loop/), whose
    handlers run here."""

    def __init__(self, collector: OutputCollector, hooks: RunHooks = RunHooks(), loop: HostLoop | None = None):
        self.loop = loop or HostLoop()
        self.settings = hooks.settings
        self.stop_at = hooks.stop_at
        self.on_stopping = hooks.on_stopping
        self.stop_reason: str | None = None
        self.on_rank_killed = hooks.on_rank_killed
        self.grace_period_s = hooks.settings.grace_period_s
        self.collector = collector
        self.hang_timeout_s = hooks.hang_timeout_s
        self.host = hooks.host
        self.ask_other_hosts = hooks.ask_other_hosts
        self.hang_asked_at: float | None = None
        self.hang_rank_order: list[str] = []
        self.hang_reason: str | None = None
        self.children: list[tuple[ProcessSpec, subprocess.Popen]] = []
        self.rank_envs: dict[int, dict[str, str]] = {}  # pid -> environment, of the ranks we start
        self.pumps: list[threading.Thread] = []  # the output pumps, named `<process> <stream>`
        self.senders: list[threading.Thread] = []  # what a role's on_rank_killed started
        self.followers: list = []  # rank_output.RankOutputFollower: the ranks' files mpirun has written here
        self.stopped_by: str | None = None
        self.stopped_at: float | None = None  # time.time() of the stop request
        self.kill_at: float | None = None
        self.killed_at_deadline = False  # we sent SIGKILL when the grace period ran out
        self.first_failure_signaled: bool | None = None  # RunResult.signaled
        self.stack_requests = Burst()  # SIGUSR1s: a burst asks the ranks once
        self.stop_bursts: dict[int, Burst] = {}  # by the signal forwarded: a burst of stops is forwarded once
        self.held = hooks.held
        self.held_start_at: float | None = None  # time.monotonic() when the next attempt's start ahead
        self.adopted = hooks.adopted
        self.periodic = hooks.periodic

    def start(self, spec: ProcessSpec, env: dict[str, str], cwd: str) -> None:
        if spec.rank_output:
            from entrypoint.run import rank_output  # only mpirun writes the ranks' files

            rank_output.clear(spec.rank_output)
        try:
            proc = self.held.take(spec, env, spec.cwd or cwd) if self.held is not None else None
            proc = proc or subprocess.Popen(
                list(spec.argv),
                env=env,
                cwd=spec.cwd or cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
            self.children.append((spec, proc))
        except (OSError, ValueError) as error:
            from entrypoint.outcome.launch_errors import describe_launch_error  # only when a start fails

            argv = list(spec.argv)
            raise LaunchError(describe_launch_error(argv, env, error, shebang=_names_its_interpreter(argv))) from None
        # A stop posted while Popen ran is taken now: it reaches the process just started too.
        self.loop.handle_pending()
        if spec.rank_output:
            self.followers.append(rank_output.start_following(spec.rank_output, self.collector,
                                                              self.settings.quiet_line_s, self.settings.wait_poll_s))
        if "RANK" in dict(spec.env):  # a rank we start ourselves: its signal death is ours to report
            self.rank_envs[proc.pid] = env
        for pipe, sink in ((proc.stdout, sys.stdout.buffer), (proc.stderr, sys.stderr.buffer)):
            # mpirun tags what its daemons read, cut anywhere: its lines are rejoined here.
            lines = (TaggedLines("stdout" if pipe is proc.stdout else "stderr", _count_after(spec.argv, "-np"))
                     if "--tag-output" in spec.argv else None)
            t = threading.Thread(target=_pump, args=(pipe, sink, self.collector, lines, self.settings.quiet_line_s),
                                 daemon=True, name=f"{spec.name} {'stdout' if pipe is proc.stdout else 'stderr'}")
            t.start()
            self.pumps.append(t)

    def _groups(self, stop_request: bool, kill: bool) -> list[int]:
        """Process groups to signal. For a stop request, a launcher whose spec says so
        (mpirun) is passed over for the ranks it started here; SIGKILL (kill) takes them all,
        and every group below a launcher still running: torchrun starts each rank in a session
        of its own, so a rank that ignores SIGTERM would outlive its torchrun. The process
        table is read once, and only when one of those needs it. An adopted run's: its ranks."""
        if self.adopted is not None:
            table = processes.load_process_table()
            return processes.decide_rank_groups(table, processes.decide_launcher_pids(table, os.getpid(),
                                                                                      self.adopted.launchers))
        table = processes.load_process_table() if kill or any(s.signal_ranks for s, _ in self.children) else {}
        groups: list[int] = []
        for spec, proc in self.children:
            ranks = processes.decide_rank_groups(table, [proc.pid]) if spec.signal_ranks else []
            if stop_request and ranks:
                groups += ranks
            else:
                groups += [proc.pid, *ranks]
            if kill:
                groups += [table[pid].pgid for pid in processes.build_descendants(table, proc.pid)]
        return sorted(set(groups), key=groups.index)

    def signal_all(self, sig: int, stop_request: bool = False) -> None:
        processes.signal_groups(self._groups(stop_request, kill=sig == signal.SIGKILL), sig)

    def _kill_within(self, delay_s: float) -> bool:
        """Whether this is the first deadline (the run was not being stopped yet)."""
        kill_at = time.monotonic() + delay_s
        first = self.kill_at is None
        self.kill_at = kill_at if first else min(self.kill_at, kill_at)
        return first

    def is_running(self) -> bool:
        return any(proc.poll() is None for _, proc in self.children)

    def has_processes(self) -> bool:
        """Processes this run reaches: those it started, or the ranks it adopted."""
        return bool(self.children) or self.adopted is not None

    def stop_after_failure(self, why: str) -> None:
        """One process failed or a host was lost: end the others within settings.failure_stop_s
        (not the grace period: that one is for a stop the platform asked for, where scripts
        checkpoint; a failed job only needs its processes gone, within a minute)."""
        if self._kill_within(min(self.grace_period_s, self.settings.failure_stop_s)):  # first: a rank that dies of this is ours
            log(f"{why}; stopping the other processes")
        self.signal_all(signal.SIGTERM)

    def stop_unless_stopping(self, why: str) -> bool:
        """Another host's word ends this run: only a run still going, and not already being
        stopped (SIGTERM to every host, or a failure here), whose end is then this word's.
        Whether it was."""
        if self.kill_at is not None or not self.is_running():
            return False
        self.stop_after_failure(why)
        return True

    def add_follower(self, follower) -> None:
        """What must run from before the processes to after them (a role's: the MPI leader's
        streams of its workers' rank output), stopped with the run's own followers."""
        self.followers.append(follower)

    def ask_ranks_for_stacks(self, gap_s: float = 0.0) -> list[str]:
        """SIGUSR1 to every Python rank below our children that can answer it (each prints its
        stack); the ranks' labels in the order they were asked. One still starting is said."""
        roots = [os.getpid()] if self.adopted is not None else [proc.pid for _, proc in self.children]
        asked = processes.signal_ranks_below(roots, signal.SIGUSR1, gap_s)
        if asked.starting:
            log(f"SIGUSR1: not asked, still starting (no handler for the signal yet): rank process(es) "
                f"{', '.join(asked.starting)}")
        return asked.asked

    def on_stack_request(self, event: StacksRequested) -> None:
        """SIGUSR1: every Python rank on this host prints its stack (rank/record_errors.py),
        and under a multi-host mpirun every worker's too; the job goes on. A burst asks once."""
        said = self.stack_requests.take(self.settings.signal_burst_s, event.at)
        if said is None:
            return
        asked = self.ask_ranks_for_stacks()
        log(f"SIGUSR1{said}: asking {len(asked)} rank process(es) on this host for their Python stacks"
            + (" and the other hosts' entrypoints for theirs" if self.ask_other_hosts else ""))
        if self.ask_other_hosts is not None:
            self.ask_other_hosts()

    def check_for_hang(self) -> None:
        """No line from any child for hang_timeout_s: ask every rank for its stack;
        settings.stack_wait_s later, stop the job naming where the ranks were (hangs.py)."""
        from entrypoint.outcome import hangs  # only jobs that set BYOC_HANG_TIMEOUT_S

        now = time.monotonic()
        if self.hang_asked_at is None:
            if now - self.collector.last_output < self.hang_timeout_s:
                return
            self.hang_asked_at = now
            self.collector.start_capture()
            log(f"no output from any process for {self.hang_timeout_s:g} s (BYOC_HANG_TIMEOUT_S): asking every "
                f"rank for its Python stack")
            if self.ask_other_hosts is not None:
                self.ask_other_hosts()
            ranks = processes.load_rank_pids_below([proc.pid for _, proc in self.children])
            gap = min(self.settings.stack_request_gap_s, 2.0 / max(1, len(ranks)))
            self.hang_rank_order = self.ask_ranks_for_stacks(gap)
        elif now - self.hang_asked_at >= self.settings.stack_wait_s and self.hang_reason is None:
            places = hangs.parse_stack_dumps(self.collector.captured(), self.hang_rank_order)
            self.hang_reason = hangs.build_hang_reason(self.hang_timeout_s, self.host, places)
            self.stop_after_failure(self.hang_reason.rstrip("."))

    def on_stop(self, event: StopRequested) -> None:
        """The loop's handler of a stop while this run is on: forwarded to every process
        started so far; with none started yet, none will be (start_and_wait). The first also
        starts the grace period. A burst of stops (a storm of 200 SIGTERM) is one stop, forwarded
        once, as its first comes (self.stop_bursts): each later one would reach a script that
        saves on its first SIGTERM during its save (its handler again), or once it has saved and
        exited 0, while its interpreter ends with SIGTERM's default action back: killed, 143. A
        stop after signal_burst_s of quiet is a stop again, forwarded again."""
        name, forwarded = signal.Signals(event.signum).name, decide_forwarded_signal(event.signum)
        said = self.stop_bursts.setdefault(forwarded, Burst()).take(self.settings.signal_burst_s, event.at)
        what = "it" if forwarded == event.signum else signal.Signals(forwarded).name
        if self.stopped_by is None:
            self.stopped_by = name
            self.stopped_at = time.time()
            self.note_stopping()
            self.loop.stop_said = True
            if self.adopted is not None:
                log(f"received {name}: forwarding {what} to this host's ranks; the leader reports the outcome")
            elif self.children:
                log(f"received {name}: forwarding {what} to the job, SIGKILL in {self.grace_period_s:g} s")
            else:
                log(f"received {name} before the processes started")
        elif said is not None and self.has_processes():
            log(f"received {name}{said}: forwarding {what} to the job again")
        if self.has_processes() and said is not None:
            self.signal_all(forwarded, stop_request=True)
            self._kill_within(self.grace_period_s)

    def note_stopping(self) -> None:
        if self.on_stopping is not None:
            self.on_stopping()

    def check_stop_time(self) -> None:
        if self.stop_at is None or self.stopped_by is not None or time.time() < self.stop_at[0]:
            return
        self.stop_reason = self.stop_at[1]
        self.stopped_by, self.stopped_at = "SIGTERM", time.time()
        self.note_stopping()
        log(f"the training plan's capacity is ending: sending SIGTERM to the job, SIGKILL in {self.grace_period_s:g} s")
        self.signal_all(signal.SIGTERM, stop_request=True)
        self._kill_within(self.grace_period_s)

    def _report_signal_death(self, proc, signum: int) -> None:
        """A rank we started ourselves died of a signal and wrote no record: the role may write
        it (on_rank_killed; a thread it returns is joined before wait() returns). Not when we
        were stopping the processes: the death is then a consequence, not a cause."""
        env = self.rank_envs.get(proc.pid)
        if env is None or self.on_rank_killed is None or self.kill_at is not None or self.stopped_by is not None:
            return
        sender = self.on_rank_killed(env, signum)
        if sender is not None:
            self.senders.append(sender)

    def wait(self) -> int:
        """Wait for every child; the exit code of the first that failed, else 0."""
        if self.adopted is not None:
            return self.wait_adopted()
        first_failure: int | None = None
        running = list(self.children)
        while running:
            for item in list(running):
                spec, proc = item
                code = proc.poll()
                if code is None:
                    continue
                running.remove(item)
                if code < 0:
                    self._report_signal_death(proc, -code)
                signaled, code = code < 0, SIGNAL_EXIT_BASE - code if code < 0 else code
                if code != 0 and first_failure is None:
                    self.first_failure_signaled = signaled
                    first_failure = code
                    if running:
                        self.stop_after_failure(f"{spec.name} exited with code {code}")
            if running:
                self.look_at_deadlines()
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
                # Until a child exits (SIGCHLD posts ChildExited), an event comes (a stop, a lost
                # host), the kill deadline, or a tick (the hang check, the capacity's stop time).
                self.loop.take(self.next_look_s())
        # Orphans (data-loader workers, a forked server, ranks in groups of their own) die too.
        self.signal_all(signal.SIGKILL)
        processes.reap_orphans(set())
        self.join_pumps()
        self.stop_followers()  # every line the ranks wrote, before the outcome is decided
        return first_failure or 0

    def stop_followers(self) -> None:
        for follower in self.followers:
            follower.stop(self.settings.thread_join_s)

    def wait_adopted(self) -> int:
        """An adopted run (Adopted), until it has ended: 0; or, once a stop's grace period is
        over with no end, the stop's exit code. Its ranks are not killed here: they are below
        the launch's daemon, which the role's close ends with sshd."""
        while not self.adopted.ended():
            self.look_at_deadlines()
            if self.kill_at is not None and time.monotonic() >= self.kill_at:
                return decide_stop_exit_code(self.stopped_by)
            # As subreaper (and PID 1 in a container) we inherit orted, the ranks and their ended
            # SSH sessions: collected while the job runs, or they stay defunct until it ends.
            processes.reap_orphans(self.adopted.kept())
            self.loop.take(self.next_look_s())
        return 0

    def look_at_deadlines(self) -> None:
        """Between two waits of a run, its own processes' or adopted ranks': the capacity's stop
        time, the next attempt's start ahead, the periodic write; next_look_s wakes the loop for
        each (one it woke for and did not look at would wake it at once, again and again)."""
        self.check_stop_time()
        self.start_held_when_due()
        if self.periodic is not None:
            self.periodic.save_when_due()

    def next_look_s(self) -> float:
        """How long the run's wait may last before something here must be looked at."""
        look = self.settings.process_poll_s
        due = self.periodic.due_at() if self.periodic is not None else None
        for at in (self.kill_at, self.held_start_at, due):
            if at is not None and at != float("inf"):
                look = min(look, max(0.0, at - time.monotonic()))
        return look

    def start_held_when_due(self) -> None:
        """The next attempt's processes, started ahead and held (run/held.py), once this
        attempt's own start-up is past and while it runs on: not while it stops."""
        if self.held_start_at is None or time.monotonic() < self.held_start_at:
            return
        self.held_start_at = None
        if self.stopped_by is None and self.kill_at is None:
            self.held.start_next()

    def join_pumps(self) -> None:
        """The output pumps, within one deadline for all of them: a process the script left
        running in a session of its own (SIGKILL to the groups missed it) may hold its stdout
        open for good. Said once, naming what is still open. A role's sender (on_rank_killed)
        keeps a deadline of its own."""
        deadline = time.monotonic() + self.settings.thread_join_s
        for t in self.pumps:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        for sender in self.senders:
            sender.join(timeout=self.settings.thread_join_s)
        held = [t.name for t in self.pumps if t.is_alive()]
        if held:
            log(f"{', '.join(held)}: still open after the process ended (a process it started and left running "
                f"holds it); waited {self.settings.thread_join_s:g} s for the rest of its output, not more: what "
                f"comes later is not kept")


class RunResult(NamedTuple):
    exit_code: int
    stopped_by: str | None = None
    stopped_at: float | None = None
    launch_error: str | None = None  # one line, when a process could not be started
    killed_at_deadline: bool = False  # SIGKILLed by us when the grace period ran out
    oom_kills: int | None = None  # the kernel's OOM kills in our memory cgroup during the run
    hang: str | None = None  # why the job was stopped as hung (hangs.py)
    stop_reason: str | None = None  # why this host stopped the processes itself (a capacity ending)
    # Whether a signal ended the first process that failed (False: it returned its exit code
    # itself, 137 from os._exit or from mpirun included; None: no process failed).
    signaled: bool | None = None
    started: bool = True  # False: a stop came before any process started, and none was


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


def run_processes(processes_: tuple[ProcessSpec, ...], env: dict[str, str], cwd: str, collector: OutputCollector,
                  stop: Stop, hooks: RunHooks = RunHooks()) -> RunResult:
    """Start the processes, forward a stop to them, wait for every one, all on the host's loop
    (stop.loop): while the run is on, a stop and SIGUSR1 are the supervisor's events (on_stop,
    on_stack_request); SIGCHLD only posts its own. A stop the loop took before this run starts nothing (between two
    runs, or after the role's start); one taken while a process starts reaches it once started."""
    loop = stop.loop
    supervisor = Supervisor(collector, hooks, loop)
    oom_before = load_oom_kill_count()
    handlers = loop.on({StopRequested: supervisor.on_stop, StacksRequested: supervisor.on_stack_request})
    stop.install()  # the token's handlers post the stops (idempotent: cli.main installed them)
    previous = signal.signal(signal.SIGCHLD, lambda _s, _f: loop.post(ChildExited()))
    try:
        loop.handle_pending()
        if loop.stopped():  # said when it was taken (on_stop, or the phase's handler before the run)
            return build_not_started(loop.stop_name, stop.at)
        code = start_beside(supervisor, hooks.before_start, loop, stop) or \
            start_and_wait(supervisor, processes_, env, cwd, hooks.on_started)
        # What was posted as the run ended (another host's root cause, a lost host) is
        # taken before its outcome is decided.
        loop.handle_pending()
    finally:
        signal.signal(signal.SIGCHLD, previous)
        loop.off(handlers)
    if isinstance(code, RunResult):
        return code
    oom_after = load_oom_kill_count() if code else None  # only a failure needs telling apart
    oom_kills = oom_after - oom_before if oom_after is not None and oom_before is not None else None
    if supervisor.hang_reason is not None:
        from entrypoint.outcome.hangs import HANG_EXIT_CODE

        code = HANG_EXIT_CODE
    return RunResult(code, supervisor.stopped_by, supervisor.stopped_at,
                     killed_at_deadline=supervisor.killed_at_deadline, oom_kills=oom_kills, hang=supervisor.hang_reason,
                     stop_reason=supervisor.stop_reason, signaled=supervisor.first_failure_signaled)


def build_not_started(name: str, at) -> RunResult:
    """A run that a stop (its signal's name) ended before any process started."""
    return RunResult(decide_stop_exit_code(name), name, at, started=False)


def start_beside(supervisor: Supervisor, before_start, loop: HostLoop, stop: Stop) -> RunResult | None:
    """The role's part before the processes start; a RunResult, starting nothing, when a stop
    came while it waited."""
    if before_start is None:
        return None
    before_start(supervisor)
    loop.handle_pending()
    if supervisor.stopped_by is None:
        return None
    supervisor.stop_followers()
    return build_not_started(supervisor.stopped_by, stop.at)


def start_and_wait(supervisor: Supervisor, processes_: tuple[ProcessSpec, ...], env: dict[str, str], cwd: str,
                   on_started) -> int | RunResult:
    """The run's exit code; a RunResult when a process could not be started, or when a stop
    came before the first did (none is started after a stop)."""
    try:
        for spec in processes_:
            supervisor.loop.handle_pending()  # a stop posted before this start: none starts
            if supervisor.stopped_by is not None or supervisor.loop.stopped():
                break
            supervisor.start(spec, {**env, **dict(spec.env)}, cwd)
    except LaunchError as error:
        supervisor.signal_all(signal.SIGKILL)  # what did start cannot run without the rest
        for _, proc in supervisor.children:
            proc.wait()
        supervisor.stop_followers()
        return RunResult(EXIT_BAD_JOB, launch_error=str(error))
    supervisor.loop.handle_pending()  # a stop posted as the last one started reaches it now
    if not supervisor.has_processes() and supervisor.stopped_by is not None:  # stopped before the first start
        return build_not_started(supervisor.stopped_by, supervisor.stopped_at)
    if on_started is not None:
        on_started(supervisor)
    if supervisor.held is not None and supervisor.held.next is not None:
        supervisor.held_start_at = time.monotonic() + supervisor.settings.held_start_after_s
    return supervisor.wait()

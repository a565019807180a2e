"""The job-port launch family: torchrun and the parameter server. Every host opens its job port
(hosts/job_port.py), which also takes root causes from ranks on every host.

- JobPortLeader: once its own part succeeded, waits for every worker's word before its outcome
  is written, then closes the port.
- JobPortWorker: after its outcome is written, tells the leader, then waits for the leader's
  port to close (SDK v2 local mode stops every container when the first one exits: a worker
  that ended first would stop a leader still saving the model).
- Both restart the job together after a failed attempt (BYOC_MAX_RESTARTS), on the leader's
  word: roles/attempts.py.
"""

from __future__ import annotations

import time

from entrypoint.hosts import job_port
from entrypoint.hosts.job_port import (JOB_KEY_ENV, MESSAGE_KINDS, WORD_OF, AttemptWord, Word, ClosedWatch, Delivered,
                                       HostDone, HostFigures, HostLive, JobPort, PeerWatch, PortClosed, Refused,
                                       RootCauseLine)
from entrypoint.log import log
from entrypoint.loop import Waited
from entrypoint.outcome.failure import first_root_cause
from entrypoint.outcome.hosts import describe_port_problem, describe_worker_host_failure
from entrypoint.outcome.records import Outcome
from entrypoint.roles.attempts import AttemptBoard, Taken
from entrypoint.roles.base import MultiHostRole

# The refusals on the job port that are logged one line each; the rest are counted, and the
# count is logged once, when the port closes (close). One bound for every kind together, not one
# a kind: whoever sends picks the word (and the refused text), so a bound a kind would let one
# sender multiply the log by the number of words, and the one count is then the number of
# messages refused, whatever they claimed to be. A host's outcome is counted like the rest: it
# was logged always (the leader waits for those), and 60 KB of unsigned BYOC-HOST-DONE lines on
# one connection added 1,203 lines to the leader's log (issue 62). A worker's own outcome refused
# past the first few is still named when its port closes (wait_for_workers), and the count says
# how many of the refused claimed to be an outcome.
MAX_REFUSED_LOGGED = 5
NOBODY_WAITS = 0  # the batch of a word sent off the loop that no wait reads (a last `end`, an ask)


# What log leaves as it is and a reader still takes for the end of a line (log escapes every
# other control character): a refusal's line is one line whatever the sender wrote.
LINE_BREAKS_ESCAPED = str.maketrans({"\n": "\\n", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def build_refusal_line(address: str, why: str, refused: int) -> str | None:
    """The log line for the refused-th message refused on the job port (pure): the first
    MAX_REFUSED_LOGGED each a line, None after. One line whatever the sender wrote: a line
    break in it would let a sender forge lines of the log (LINE_BREAKS_ESCAPED)."""
    if refused > MAX_REFUSED_LOGGED:
        return None
    line = f"ignored a message on the job port from {address}: {why}".translate(LINE_BREAKS_ESCAPED)
    if refused == MAX_REFUSED_LOGGED:
        line += " (further ones are counted, not logged: their number is said when the port closes)"
    return line


def build_refusals_summary(refused: int, outcomes: int) -> str | None:
    """The one line that counts what the job port refused, when some were not logged (pure);
    None when every one was. outcomes: how many of them claimed to be a host's outcome."""
    if refused <= MAX_REFUSED_LOGGED:
        return None
    claimed = f", {outcomes} of them claiming to be a host's outcome" if outcomes else ""
    return (f"the job port refused {refused} message(s) in all{claimed}; "
            f"{refused - MAX_REFUSED_LOGGED} after the first {MAX_REFUSED_LOGGED} were not logged")


class JobPortRole(MultiHostRole):
    """torchrun and the parameter server: every host opens its job port, which also takes
    root causes from ranks on every host, so each host's output/failure can lead with the job's
    first failure (SDK v2 local mode keeps only the last host's). What the port reads reaches
    this role as typed events on the host's loop: its handlers, and so its state, are the main
    thread's alone."""

    def __init__(self, *args, watch_rendezvous: bool = False) -> None:
        super().__init__(*args)
        self.port: JobPort | None = None
        self.watch_rendezvous = watch_rendezvous
        # Every message the port refused, and how many of them claimed to be a host's outcome:
        # refuse() alone counts them, on the main thread (the loop's handlers); close() says the
        # total once.
        self.refused_messages = 0
        self.refused_outcomes = 0
        self.worker_figures: dict[str, dict] = {}  # the leader's: each worker's figures, as they arrive
        self.addresses: dict[str, list] = {}  # each peer's addresses, resolved once (live figures, restarts' words)
        self.board = AttemptBoard()  # the attempt this host is in, and the restart words heard about it
        self.closed_ports: set[str] = set()  # the hosts whose job port closed (their part is over)
        self.batch = 0  # the words sent to every host at once so far (send_word_to_each)
        self.delivered: dict[int, dict[str, bool]] = {}  # the batches waited for: host -> whether it took it

    def start_beside(self) -> Outcome | None:
        plan = self.plan
        try:
            self.port = JobPort(plan.settings.job_port, self.loop.post, job_key=self.job_key,
                                settings=plan.settings, hosts=len(plan.hosts))
        except OSError as exc:
            return self.start_problem(describe_port_problem(plan.settings.job_port, plan.current_host, exc), None)
        from entrypoint.hosts.net import resolve_addresses

        # Resolved now, once (every name resolved a moment ago): the handlers that check a
        # sender run on the loop, where a lookup that blocks would hold every wait up.
        self.addresses = {host: resolve_addresses(host) for host in plan.peers}
        # Every word of the port is refused and counted like the rest unless a later phase takes
        # it: the handlers just below, or an MPI role's own words (its start_ssh). Left to the
        # loop, a word no phase takes (MPI's, on a torchrun host) was said once a kind as a defect
        # of ours, and counted nowhere.
        self.loop.on({kind: self.on_word_not_taken for kind, _, _ in MESSAGE_KINDS.values()})
        self.loop.on({RootCauseLine: lambda event: self.collector.add_line_text(event.line),
                      HostDone: self.on_host_done, HostFigures: self.on_figures, HostLive: self.on_live,
                      AttemptWord: self.on_attempt_word, Refused: self.on_refused, Delivered: self.on_delivered,
                      PortClosed: lambda event: self.closed_ports.add(event.host)})
        return None

    def on_word_not_taken(self, message) -> None:
        self.refuse(message.sender, f"{WORD_OF[type(message)].strip()}: not a word this host takes now")

    def on_host_done(self, done: HostDone) -> None:
        """A host's outcome on a worker's port: only the leader waits for those."""
        self.refuse(done.sender, f"an outcome for {done.host!r}: this host is not the leader", claims_outcome=True)

    def on_figures(self, figures: HostFigures) -> None:
        """A host's figures for the job report: only the leader takes them, from its workers,
        sent from that worker's own address (the job's key is in every rank's environment, so
        a signature alone does not tell a host from a rank elsewhere claiming to be it), keeping
        only what it knows of them (jobreport/figures.parse_host_figures)."""
        from entrypoint.jobreport.figures import parse_host_figures

        host, sender = figures.host, figures.sender
        if not self.plan.is_leader or host not in self.plan.peers or host in self.worker_figures:
            self.refuse(sender, f"figures for {host!r}: not one of this leader's workers, or again")
            return
        if sender not in self.peer_addresses(host):
            self.refuse(sender, f"figures for {host!r} sent from another address")
            return
        try:
            parsed, failed = parse_host_figures(figures.figures, host), ""
        except Exception as exc:  # noqa: BLE001 - whatever arrives, the port goes on
            # Said in the refusal's line, not a line of its own: a sender could repeat it at will.
            parsed, failed = None, f" ({type(exc).__name__}: {exc})"
        if parsed is None:
            self.refuse(sender, f"figures for {host!r} that are not figures{failed}")
            return
        self.worker_figures[host] = parsed

    def on_live(self, live_figures: HostLive) -> None:
        """A worker's live figures (jobreport/live/): only the leader takes them, from that
        worker's own address, as on_figures; the live thread parses them."""
        host, sender = live_figures.host, live_figures.sender
        live = self.report_part.live if self.report_part is not None else None
        if not self.plan.is_leader or host not in self.plan.peers or live is None:
            self.refuse(sender, f"live figures for {host!r}: not one of this leader's workers")
            return
        if sender not in self.peer_addresses(host):
            self.refuse(sender, f"live figures for {host!r} sent from another address")
            return
        live.take_remote(host, live_figures.figures)

    def peer_addresses(self, host: str) -> list:
        """A peer's addresses, resolved at the start (start_beside): a word it sends must come
        from one of them (the job's key is in every rank's environment, so a signature alone
        does not tell a host from a rank elsewhere claiming to be it)."""
        return self.addresses.get(host, [])

    def on_attempt_word(self, word: AttemptWord) -> None:
        """A restart's word (roles/attempts.py); each role takes those meant for it."""
        self.refuse(word.sender, f"a restart's word {word.word.value!r}: not for this host")

    @property
    def job_key(self) -> str:
        """The key this job's hosts sign their words with: the plan's (MPI), or the one its ranks have."""
        return self.plan.job_key or self.plan.env_dict.get(JOB_KEY_ENV, "")

    def send(self, host: str, message, within_s: float, until_open: bool = False) -> bool:
        """A message to host's job port, tried again until within_s (the loop's pauses between;
        until_open: a port not open yet too)."""
        plan = self.plan
        return job_port.deliver(self.loop, host, plan.settings.job_port, self.job_key, message, within_s, plan.settings,
                                until_open)

    def send_to_each_host(self, hosts, message_of, within_s: float) -> dict[str, bool]:
        """message_of(host) to every one of hosts at once (hosts/job_port.send_to_each), each
        tried for within_s; host -> whether it took it (a host missing: a stop ended the wait)."""
        plan = self.plan
        hosts = list(hosts)
        self.batch += 1
        batch = self.batch
        taken = self.delivered[batch] = {}
        try:
            job_port.send_to_each(hosts, plan.settings.job_port, self.job_key, message_of, within_s, self.loop,
                                  batch, plan.settings)
            self.loop.wait(lambda: len(taken) == len(hosts), time.monotonic() + within_s + plan.settings.thread_join_s)
        finally:
            del self.delivered[batch]  # a late answer of this batch is nobody's now
        return dict(taken)

    def on_delivered(self, delivered: Delivered) -> None:
        """A sender's answer: the batch's that waits for it (send_to_each_host); one sent with
        NOBODY_WAITS, or a batch's whose wait has ended, is dropped."""
        batch = self.delivered.get(delivered.batch)
        if batch is not None:
            batch[delivered.host] = delivered.delivered

    def send_word_to_each(self, hosts, word: Word, attempt: int, within_s: float) -> dict[str, bool]:
        """A restart's word to every one of hosts at once (send_to_each_host)."""
        current = self.plan.current_host
        return self.send_to_each_host(hosts, lambda _host: AttemptWord(word, attempt, current), within_s)

    def send_word(self, host: str, word: Word, attempt: int, exit_code: int = 0, within_s: float | None = None) -> bool:
        settings = self.plan.settings
        return self.send(host, AttemptWord(word, attempt, self.plan.current_host, exit_code),
                         settings.host_done_send_s if within_s is None else within_s)

    def on_processes_started(self, supervisor) -> None:
        super().on_processes_started(supervisor)
        why = self.board.started()  # a word that stopped this attempt before its processes started
        if why is not None:
            supervisor.stop_after_failure(why)

    def stop_attempt(self, why: str) -> None:
        """A word says this attempt cannot go on: its run ends now, or once its processes start."""
        self.board.stop(why)
        supervisor = self.supervisor
        if self.board.running and supervisor is not None and supervisor.kill_at is None and supervisor.is_running():
            supervisor.stop_after_failure(why)

    def next_attempt(self) -> int:
        self.attempt = self.board.next()
        return self.attempt

    def on_refused(self, refused: Refused) -> None:
        self.refuse(refused.sender, f"a host's outcome, {refused.why}" if refused.host_done else refused.why,
                    claims_outcome=refused.host_done)

    def refuse(self, address: str, why: str, claims_outcome: bool = False) -> None:
        """A message on the job port that is not this job's, of whatever kind (claims_outcome: it
        claimed to be a host's outcome): counted, logged while within MAX_REFUSED_LOGGED
        (build_refusal_line), dropped. The one road every refusal of this host's takes."""
        self.refused_messages += 1
        self.refused_outcomes += claims_outcome
        line = build_refusal_line(address, why, self.refused_messages)
        if line is not None:
            log(line)

    def on_rank_killed(self, env: dict[str, str], signum: int):
        """A rank this host started itself (the parameter server's processes) was killed by a
        signal and wrote no record: write it for it, as torchrun's launcher does for its ranks
        (rank/launch_torchrun.py), here and on every host's port. Returns the sending thread,
        which only sends."""
        from entrypoint.rank.record_errors import build_root_cause_line, build_signal_root_cause

        record = build_signal_root_cause(env["RANK"], env.get("LOCAL_RANK", "0"), self.plan.current_host, signum,
                                         time.time())
        self.collector.add_line_text(build_root_cause_line(record))
        return job_port.start_root_cause_sender(record, env)

    def wait_until_closed(self, hosts, deadline: float, closed_after_s: float = 0.0, until=lambda: False) -> Waited:
        """Until every one of hosts' job ports closed (ClosedWatch), until() is true, a stop came,
        or the deadline (time.monotonic())."""
        watch = ClosedWatch(hosts, self.plan.settings.job_port, self.loop.post, closed_after_s, self.plan.settings,
                            job_hosts=len(self.plan.hosts))
        try:
            return self.loop.wait(lambda: until() or all(h in self.closed_ports for h in hosts), deadline)
        finally:
            watch.close()

    def close(self, outcome: Outcome) -> None:
        self.close_watches()
        if self.port is not None:
            self.port.close()
        summary = build_refusals_summary(self.refused_messages, self.refused_outcomes)
        # Once, after the port closed: it reads nothing more. (close runs beside the loop: the last
        # lines the port read may still be on the loop's queue for a moment, and are not counted.)
        if summary is not None:
            log(summary)


class JobPortLeader(JobPortRole):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.worker_outcomes: dict[str, int] = {}  # each worker's outcome, the first word it sent

    def start_watches(self) -> list[PeerWatch]:
        plan, settings = self.plan, self.plan.settings
        return [PeerWatch(plan.peers, settings.job_port, settings.host_lost_timeout_s, settings.peer_wait_timeout_s,
                          self.loop.post, settings=settings, job_hosts=len(plan.hosts))]

    def on_processes_started(self, supervisor) -> None:
        super().on_processes_started(supervisor)
        for host, code in self.worker_outcomes.items():
            self.stop_for_worker(host, code)  # a worker that failed before this run started

    def on_attempt_word(self, word: AttemptWord) -> None:
        """A worker's `ended`: its processes of this attempt are gone; this host's stop too."""
        if word.word is not Word.ENDED or word.host not in self.plan.peers or word.sender not in self.peer_addresses(word.host):
            self.refuse(word.sender, f"a restart's word {word.word.value!r} for {word.host!r}: not from one of this "
                                     f"leader's workers")
            return
        taken = self.board.take_ended(word)
        if taken is Taken.STALE:
            return
        self.stop_attempt(f"host {word.host}'s processes of attempt {word.attempt} ended with exit code "
                          f"{word.exit_code}: the attempt cannot go on")
        if taken is Taken.OVER:  # no attempt follows: that worker waits for this word, sent off the loop
            plan = self.plan
            message = AttemptWord(Word.END, word.attempt, plan.current_host)
            job_port.send_to_each([word.host], plan.settings.job_port, self.job_key, lambda _host: message,
                                  plan.settings.host_done_failed_send_s, self.loop, NOBODY_WAITS, plan.settings)

    def restart(self, line: str, exit_code: int, cause: str, failed_at: float) -> str | None:
        """Every worker's processes of the failed attempt gone (each told `stop`, each saying
        `ended`), then every worker told `start`: only then does any host start the next one."""
        plan, settings, attempt = self.plan, self.plan.settings, self.attempt
        self.note_restart(exit_code, cause, failed_at)
        if self.worker_outcomes:
            return self.describe_ended_worker()
        log(line)
        self.send_word_to_each([h for h in plan.peers if h not in self.board.ended], Word.STOP, attempt,
                               settings.host_done_failed_send_s)
        # A worker whose part ended (it succeeded as this attempt failed here) never says `ended`.
        self.loop.wait(lambda: all(h in self.board.ended for h in plan.peers) or self.lost is not None
                       or bool(self.worker_outcomes), time.monotonic() + settings.attempt_end_wait_s)
        if self.loop.stopped() or self.lost is not None:  # whatever else ended the wait
            return self.lost or "a stop signal came"
        if self.worker_outcomes:
            return self.describe_ended_worker()
        silent = [h for h in plan.peers if h not in self.board.ended]
        if silent:
            return (f"host(s) {', '.join(silent)} did not say their processes of attempt {attempt} were gone within "
                    f"{settings.attempt_end_wait_s:g} s")
        following = self.next_attempt()
        taken = self.send_word_to_each(plan.peers, Word.START, following, settings.host_done_send_s)
        for host in plan.peers:
            if not taken.get(host):
                return f"host {host} could not be told to start attempt {following}"
        log(f"{plan.current_host}: every host's processes of attempt {attempt} are gone: starting attempt {following}")
        return None

    def describe_ended_worker(self) -> str:
        host = sorted(self.worker_outcomes)[0]
        return f"host {host}'s part of the job had already ended: it cannot take part in another attempt"

    def end_attempts(self) -> None:
        """No attempt follows: the workers that wait for a word get `end`."""
        self.board.over = True
        if self.board.ended:
            self.send_word_to_each(self.board.ended, Word.END, self.attempt, self.plan.settings.host_done_failed_send_s)

    def on_host_done(self, done: HostDone) -> None:
        """A worker host's part ended. One that failed while this host still runs ends the
        job now, not when its port is missed."""
        if done.host not in self.plan.peers:
            self.refuse(done.sender, "an outcome from a host that is not one of this leader's workers",
                        claims_outcome=True)
            return
        if done.host in self.worker_outcomes:
            return  # the first word stands: a replay cannot change it
        self.worker_outcomes[done.host] = done.exit_code
        self.stop_for_worker(done.host, done.exit_code)

    def stop_for_worker(self, host: str, exit_code: int) -> None:
        supervisor = self.supervisor
        if exit_code == 0 or supervisor is None or self.lost is not None or self.peer_failed is not None:
            return
        # Only a run still going, and not already being stopped (SIGTERM to every host, or a
        # failure here): the worker's failure is then a consequence, not news.
        if supervisor.kill_at is None and supervisor.is_running():
            self.peer_failed = f"Host {host}'s part of the job failed (exit code {exit_code})"
            supervisor.stop_after_failure(f"host {host}'s part of the job failed (exit code {exit_code}): "
                                          f"the job cannot go on")

    def settle(self, outcome: Outcome) -> Outcome:
        """This host's part succeeded: wait until every worker host's part has ended too (each
        tells this host's job port), and the job failed if one of theirs did. Not when this
        host was stopped (StopTrainingJob stops every host, and compose stops the rest once one
        has exited): a worker's 143 then is the same stop, not a failure of the job. Bounded
        by BYOC_PEER_WAIT_TIMEOUT_S; a worker that stops answering without a word is not waited
        for; SIGTERM ends the wait."""
        if outcome.exit_code != 0 or (self.supervisor is not None and self.supervisor.stopped_by):
            return outcome
        self.close_watches()
        failed = self.wait_for_workers()
        if failed is None:
            return outcome
        host, code = failed
        return Outcome(code, describe_worker_host_failure(
            what=self.what, host=host, exit_code=code, root_cause=first_root_cause(self.collector.root_causes),
            current_host=self.plan.current_host))

    def job_report(self, outcome: Outcome) -> None:
        """Every host's figures that reached this port; the others are reported missing. Each
        worker sends its own just before its outcome, on another connection, read by another
        thread: they may land a moment after the outcome, and when this host's part failed it
        did not wait for the workers at all. So a bounded wait (settings.report_wait_s) for
        those still missing; a stop signal ends it."""
        if self.report_part is None:
            return
        if self.resolved:
            self.loop.wait(lambda: all(h in self.worker_figures for h in self.plan.peers),
                           time.monotonic() + self.plan.settings.report_wait_s)
        self.write_job_report(outcome, dict(self.worker_figures))

    def wait_for_workers(self) -> tuple[str, int] | None:
        """The first worker that failed, as (host, exit code), or None."""
        plan, settings = self.plan, self.plan.settings
        pending = [h for h in plan.peers if h not in self.worker_outcomes]
        if pending:
            log(f"{plan.current_host}: waiting for {len(pending)} worker host(s) to finish: {', '.join(pending)}")
        reported = lambda: all(h in self.worker_outcomes or h in self.closed_ports for h in plan.peers)  # noqa: E731
        waited = self.wait_until_closed(pending, time.monotonic() + settings.peer_wait_timeout_s,
                                        settings.worker_gone_after_s, reported)
        for host in pending:
            if host in self.closed_ports and host not in self.worker_outcomes:
                log(f"{plan.current_host}: worker host {host} stopped answering without sending its outcome "
                    f"(its own output/failure has it)")
        if waited is Waited.TIMEOUT:
            silent = ", ".join(h for h in plan.peers if h not in self.worker_outcomes and h not in self.closed_ports)
            log(f"{plan.current_host}: worker host(s) {silent} had not sent word of the end of their part after "
                f"{settings.peer_wait_timeout_s:g} s (BYOC_PEER_WAIT_TIMEOUT_S); ending without their outcome")
        failed = [(h, self.worker_outcomes[h]) for h in plan.peers if self.worker_outcomes.get(h, 0) != 0]
        return failed[0] if failed else None


class JobPortWorker(JobPortRole):
    def start_live(self) -> None:
        """This host's live figures go to the leader's job port every interval (from the live
        thread: one try each, nothing of this role's touched)."""
        plan, settings = self.plan, self.plan.settings
        key = self.job_key

        def send(text: str) -> int:
            return job_port.send_live_figures(plan.leader, settings.job_port, key, plan.current_host, text, settings)

        self.report_part.start_live(log, send, settings.capacity_ends_at, settings.live_figures_bytes, len(plan.hosts))

    def on_attempt_word(self, word: AttemptWord) -> None:
        """The leader's `stop`, `start` or `end`, from the leader's own address."""
        leader = self.plan.leader
        if word.word is Word.ENDED or word.host != leader or word.sender not in self.peer_addresses(leader):
            self.refuse(word.sender, f"a restart's word {word.word.value!r} for {word.host!r}: not from this host's leader")
            return
        why = self.board.take_leader_word(word)  # a word about another attempt is stale: dropped
        if why is not None:
            self.stop_attempt(why)

    def restart(self, line: str, exit_code: int, cause: str, failed_at: float) -> str | None:
        """The leader decides: tell it this host's processes of the attempt are gone, and wait
        for its `start` (or `end`), within BYOC_PEER_WAIT_TIMEOUT_S; a stop signal or a lost
        leader ends the wait."""
        plan, settings, attempt = self.plan, self.plan.settings, self.attempt
        self.note_restart(exit_code, cause, failed_at)
        log(f"{plan.current_host}: attempt {attempt} ended on this host with exit code {exit_code} ({cause}); "
            f"waiting for the leader's word on a restart (BYOC_MAX_RESTARTS)")
        if not self.send_word(plan.leader, Word.ENDED, attempt, exit_code):
            return f"the leader {plan.leader} could not be told (it has ended, or is unreachable)"
        waited = self.loop.wait(lambda: self.board.word is not None or self.lost is not None,
                                time.monotonic() + settings.peer_wait_timeout_s)
        if self.loop.stopped() or self.lost is not None:  # whatever else ended the wait
            return self.lost or "a stop signal came"
        if waited is Waited.TIMEOUT:
            return f"no word from the leader {plan.leader} within {settings.peer_wait_timeout_s:g} s"
        if self.board.word.word is Word.END:
            return f"the leader {plan.leader} ends the job after attempt {attempt}"
        log(f"{plan.current_host}: the leader starts attempt {self.next_attempt()}")
        return None

    def start_watches(self) -> list[PeerWatch]:
        plan, settings = self.plan, self.plan.settings
        watches = [PeerWatch(plan.peers, settings.job_port, settings.host_lost_timeout_s,
                             settings.peer_wait_timeout_s, self.loop.post, settings=settings, job_hosts=len(plan.hosts))]
        if self.watch_rendezvous:
            # torchrun here waits for the leader's rendezvous store with no limit of its own
            # (seen: > 10 min, silent) when the leader's host is up but its torchrun never
            # listens; the job port alone cannot tell.
            watches.append(PeerWatch([plan.leader], settings.master_port, settings.host_lost_timeout_s,
                                     settings.peer_wait_timeout_s, self.loop.post, until_first_contact=True,
                                     port_name=" (torchrun's rendezvous, BYOC_MASTER_PORT)", settings=settings))
        return watches

    def close(self, outcome: Outcome) -> None:
        """Tell the leader this host's part ended (a failing host tries for less long: its
        leader may be what failed); after a success, wait for the leader to finish before
        exiting, this host's job port still open. Bounded by BYOC_PEER_WAIT_TIMEOUT_S; SIGTERM
        (the leader exited, compose stops this container) ends the wait."""
        self.close_watches()
        if not self.resolved:
            return  # the leader's name never resolved: there is nobody to tell
        try:
            if self.tell_leader(outcome.exit_code) and outcome.exit_code == 0:
                self.wait_for_leader()
        finally:
            super().close(outcome)

    def job_report(self, outcome: Outcome) -> None:
        """This host's figures go to the leader's job port, before its outcome (close), so a
        leader that waits for the outcome has the figures too. Never written here: SDK v2
        local mode merges every host's output/data, and the leader's report covers this host."""
        if self.report_part is None:
            return
        _, text = self.report_part.end(self.plan.settings.report_figures_bytes)
        plan, settings = self.plan, self.plan.settings
        if not self.resolved:
            return
        if not self.send(plan.leader, HostFigures(plan.current_host, text), settings.host_done_failed_send_s):
            log(f"{plan.current_host}: could not send this host's figures to the leader {plan.leader}: "
                f"its job report will say they are missing")

    def tell_leader(self, exit_code: int) -> bool:
        plan, settings = self.plan, self.plan.settings
        delivered = self.send(plan.leader, HostDone(plan.current_host, exit_code),
                              settings.host_done_send_s if exit_code == 0 else settings.host_done_failed_send_s)
        if not delivered:
            log(f"{plan.current_host}: could not tell the leader {plan.leader} (port {settings.job_port}) "
                f"that this host's part ended (it has ended, or is unreachable); it will notice this host go")
        return delivered

    def wait_for_leader(self) -> None:
        plan, settings = self.plan, self.plan.settings
        waited = self.wait_until_closed([plan.leader], time.monotonic() + settings.peer_wait_timeout_s)
        if waited is Waited.TIMEOUT:
            log(f"{plan.current_host}: the leader {plan.leader} was still running after "
                f"{settings.peer_wait_timeout_s:g} s (BYOC_PEER_WAIT_TIMEOUT_S); exiting")

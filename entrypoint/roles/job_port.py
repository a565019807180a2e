"""The job-port launch family: torchrun and the parameter server. Every host opens its job port
(roles/peers.py, hosts/job_port.py), which also takes root causes from ranks on every host, so
each host's output/failure can lead with the job's first failure (SDK v2 local mode keeps only
the last host's).

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
from entrypoint.hosts.job_port import AttemptWord, HostDone, HostFigures, HostLive, PeerWatch, Word
from entrypoint.log import log
from entrypoint.loop import Waited
from entrypoint.outcome.failure import first_root_cause
from entrypoint.outcome.hosts import describe_worker_host_failure
from entrypoint.outcome.records import Outcome
from entrypoint.roles.attempts import AttemptBoard, Taken
from entrypoint.roles.base import HostRole, begin_run, write_job_report
from entrypoint.roles.peers import Peers, decide_job_key, take_worker_figures, take_worker_live


def start_attempt_run(host, board: AttemptBoard, supervisor) -> None:
    """This attempt's processes started: a word that stopped it before they did stops them now."""
    why = board.started()
    if why is not None:
        supervisor.stop_after_failure(why)


def stop_attempt(host, board: AttemptBoard, why: str) -> None:
    """A word says this attempt cannot go on: its run ends now, or once its processes start."""
    board.stop(why)
    if board.running and host.supervisor is not None:
        host.supervisor.stop_unless_stopping(why)


def send_rank_root_cause(host, env: dict[str, str], signum: int):
    """A rank this host started itself (the parameter server's processes) was killed by a signal
    and wrote no record: write it for it, as torchrun's launcher does for its ranks
    (rank/launch_torchrun.py), here and on every host's port. Returns the sending thread, which
    only sends."""
    from entrypoint.rank.record_errors import build_root_cause_line, build_signal_root_cause

    record = build_signal_root_cause(env["RANK"], env.get("LOCAL_RANK", "0"), host.plan.current_host, signum,
                                     time.time())
    host.collector.add_line_text(build_root_cause_line(record))
    return job_port.start_root_cause_sender(record, env)


class JobPortLeader(HostRole):
    """Decides the restarts; once its own part succeeded, waits for every worker's outcome."""

    def __init__(self) -> None:
        self.peers = Peers()
        self.board = AttemptBoard()  # the restart words heard about this host's attempt
        self.worker_outcomes: dict[str, int] = {}  # each worker's outcome, the first word it sent
        self.worker_figures: dict[str, dict] = {}  # each worker's figures, as they arrive

    def start(self, host) -> Outcome | None:
        return self.peers.start(host, self.take_words)

    def take_words(self, host) -> None:
        peers = self.peers
        host.loop.on({HostDone: lambda done: self.on_host_done(host, done),
                      HostFigures: lambda figures: take_worker_figures(host, peers, self.worker_figures, figures),
                      HostLive: lambda live: take_worker_live(host, peers, live),
                      AttemptWord: lambda word: self.on_attempt_word(host, word)})

    def start_watches(self, host) -> list[PeerWatch]:
        plan, settings = host.plan, host.plan.settings
        return [PeerWatch(plan.peers, settings.job_port, settings.host_lost_timeout_s, settings.peer_wait_timeout_s,
                          host.loop.post, settings=settings, job_hosts=len(plan.hosts))]

    def on_processes_started(self, host, supervisor) -> None:
        begin_run(host, supervisor)
        self.peers.watch(host, supervisor, self.start_watches)
        start_attempt_run(host, self.board, supervisor)
        for worker, code in self.worker_outcomes.items():
            self.stop_for_worker(host, worker, code)  # a worker that failed before this run started

    def on_rank_killed(self, host, env: dict[str, str], signum: int):
        return send_rank_root_cause(host, env, signum)

    def on_attempt_word(self, host, word: AttemptWord) -> None:
        """A worker's `ended`: its processes of this attempt are gone; this host's stop too."""
        if word.word is not Word.ENDED or word.host not in host.plan.peers or not self.peers.is_from(word.sender,
                                                                                                     word.host):
            self.peers.refuse(word.sender, f"a restart's word {word.word.value!r} for {word.host!r}: not from one of "
                                           f"this leader's workers")
            return
        taken = self.board.take_ended(word, host.attempt)
        if taken is Taken.STALE:
            return
        stop_attempt(host, self.board, f"host {word.host}'s processes of attempt {word.attempt} ended with exit code "
                                       f"{word.exit_code}: the attempt cannot go on")
        if taken is Taken.OVER:  # no attempt follows: that worker waits for this word, sent off the loop
            message = AttemptWord(Word.END, word.attempt, host.plan.current_host)
            self.peers.send_off_the_loop(host, [word.host], lambda _host: message,
                                         host.plan.settings.host_done_failed_send_s)

    def restart(self, host, line: str) -> str | None:
        """Every worker's processes of the failed attempt gone (each told `stop`, each saying
        `ended`), then every worker told `start`: only then does any host start the next one."""
        plan, settings, attempt, board = host.plan, host.plan.settings, host.attempt, self.board
        if self.worker_outcomes:
            return self.describe_ended_worker()
        log(line)
        self.peers.send_word_to_each(host, [h for h in plan.peers if h not in board.ended], Word.STOP, attempt,
                                     settings.host_done_failed_send_s)
        # A worker whose part ended (it succeeded as this attempt failed here) never says `ended`.
        host.loop.wait(lambda: all(h in board.ended for h in plan.peers) or host.lost is not None
                       or bool(self.worker_outcomes), time.monotonic() + settings.attempt_end_wait_s)
        if host.loop.stopped() or host.lost is not None:  # whatever else ended the wait
            return host.lost or "a stop signal came"
        if self.worker_outcomes:
            return self.describe_ended_worker()
        silent = [h for h in plan.peers if h not in board.ended]
        if silent:
            return (f"host(s) {', '.join(silent)} did not say their processes of attempt {attempt} were gone within "
                    f"{settings.attempt_end_wait_s:g} s")
        board.next()
        following = host.next_attempt()
        taken = self.peers.send_word_to_each(host, plan.peers, Word.START, following, settings.host_done_send_s)
        for peer in plan.peers:
            if not taken.get(peer):
                return f"host {peer} could not be told to start attempt {following}"
        log(f"{plan.current_host}: every host's processes of attempt {attempt} are gone: starting attempt {following}")
        return None

    def describe_ended_worker(self) -> str:
        worker = sorted(self.worker_outcomes)[0]
        return f"host {worker}'s part of the job had already ended: it cannot take part in another attempt"

    def end_attempts(self, host) -> None:
        """No attempt follows: the workers that wait for a word get `end`."""
        self.board.over = True
        if self.board.ended:
            self.peers.send_word_to_each(host, self.board.ended, Word.END, host.attempt,
                                         host.plan.settings.host_done_failed_send_s)

    def on_host_done(self, host, done: HostDone) -> None:
        """A worker host's part ended. One that failed while this host still runs ends the job
        now, not when its port is missed."""
        if done.host not in host.plan.peers:
            self.peers.refuse(done.sender, "an outcome from a host that is not one of this leader's workers",
                              claims_outcome=True)
            return
        if done.host in self.worker_outcomes:
            return  # the first word stands: a replay cannot change it
        self.worker_outcomes[done.host] = done.exit_code
        self.stop_for_worker(host, done.host, done.exit_code)

    def stop_for_worker(self, host, worker: str, exit_code: int) -> None:
        if exit_code == 0 or host.supervisor is None or host.lost is not None or host.peer_failed is not None:
            return
        # Only a run still going, and not already being stopped (SIGTERM to every host, or a
        # failure here): the worker's failure is then a consequence, not news.
        if host.supervisor.stop_unless_stopping(f"host {worker}'s part of the job failed (exit code {exit_code}): "
                                                f"the job cannot go on"):
            host.peer_failed = f"Host {worker}'s part of the job failed (exit code {exit_code})"

    def settle(self, host, outcome: Outcome) -> Outcome:
        """This host's part succeeded: wait until every worker host's part has ended too (each
        tells this host's job port), and the job failed if one of theirs did. Not when this host
        was stopped (StopTrainingJob stops every host, and compose stops the rest once one has
        exited): a worker's 143 then is the same stop, not a failure of the job. Bounded by
        BYOC_PEER_WAIT_TIMEOUT_S; a worker that stops answering without a word is not waited
        for; SIGTERM ends the wait."""
        if outcome.exit_code != 0 or getattr(host.run, "stopped_by", None):
            return outcome
        self.peers.close_watches()
        failed = self.wait_for_workers(host)
        if failed is None:
            return outcome
        worker, code = failed
        return Outcome(code, describe_worker_host_failure(
            what=host.what, host=worker, exit_code=code, root_cause=first_root_cause(host.collector.root_causes),
            current_host=host.plan.current_host))

    def job_report(self, host, outcome: Outcome) -> None:
        """Every host's figures that reached this port; the others are reported missing. Each
        worker sends its own just before its outcome, on another connection, read by another
        thread: they may land a moment after the outcome, and when this host's part failed it
        did not wait for the workers at all. So a bounded wait (settings.report_wait_s) for those
        still missing; a stop signal ends it."""
        if host.report is None:
            return
        if host.resolved:
            host.loop.wait(lambda: all(h in self.worker_figures for h in host.plan.peers),
                           time.monotonic() + host.plan.settings.report_wait_s)
        write_job_report(host, outcome, dict(self.worker_figures))

    def wait_for_workers(self, host) -> tuple[str, int] | None:
        """The first worker that failed, as (host, exit code), or None."""
        plan, settings, closed = host.plan, host.plan.settings, self.peers.closed_ports
        pending = [h for h in plan.peers if h not in self.worker_outcomes]
        if pending:
            log(f"{plan.current_host}: waiting for {len(pending)} worker host(s) to finish: {', '.join(pending)}")
        reported = lambda: all(h in self.worker_outcomes or h in closed for h in plan.peers)  # noqa: E731
        waited = self.peers.wait_until_closed(host, pending, time.monotonic() + settings.peer_wait_timeout_s,
                                              settings.worker_gone_after_s, reported)
        for worker in pending:
            if worker in closed and worker not in self.worker_outcomes:
                log(f"{plan.current_host}: worker host {worker} stopped answering without sending its outcome "
                    f"(its own output/failure has it)")
        if waited is Waited.TIMEOUT:
            silent = ", ".join(h for h in plan.peers if h not in self.worker_outcomes and h not in closed)
            log(f"{plan.current_host}: worker host(s) {silent} had not sent word of the end of their part after "
                f"{settings.peer_wait_timeout_s:g} s (BYOC_PEER_WAIT_TIMEOUT_S); ending without their outcome")
        failed = [(h, self.worker_outcomes[h]) for h in plan.peers if self.worker_outcomes.get(h, 0) != 0]
        return failed[0] if failed else None

    def close(self, host, outcome: Outcome) -> None:
        self.peers.close()


class JobPortWorker(HostRole):
    """Restarts on the leader's word; after its outcome is written, tells the leader and waits
    for the leader's end."""

    def __init__(self, watch_rendezvous: bool = False) -> None:
        self.peers = Peers()
        self.board = AttemptBoard()  # the leader's words about this host's attempt
        self.watch_rendezvous = watch_rendezvous  # torchrun's: its leader's rendezvous port is watched too

    def start(self, host) -> Outcome | None:
        return self.peers.start(host, self.take_words)

    def take_words(self, host) -> None:
        host.loop.on({AttemptWord: lambda word: self.on_attempt_word(host, word)})

    def start_live(self, host) -> None:
        """This host's live figures go to the leader's job port every interval (from the live
        thread: one try each, nothing of this role's touched)."""
        # The job's key from the plan: the report starts before the port opens (Peers.key).
        plan, settings, key = host.plan, host.plan.settings, decide_job_key(host.plan)

        def send(text: str) -> int:
            return job_port.send_live_figures(plan.leader, settings.job_port, key, plan.current_host, text, settings)

        host.report.start_live(log, send, settings.capacity_ends_at, settings.live_figures_bytes, len(plan.hosts))

    def on_processes_started(self, host, supervisor) -> None:
        begin_run(host, supervisor)
        self.peers.watch(host, supervisor, self.start_watches)
        start_attempt_run(host, self.board, supervisor)

    def on_rank_killed(self, host, env: dict[str, str], signum: int):
        return send_rank_root_cause(host, env, signum)

    def on_attempt_word(self, host, word: AttemptWord) -> None:
        """The leader's `stop`, `start` or `end`, from the leader's own address."""
        leader = host.plan.leader
        if word.word is Word.ENDED or word.host != leader or not self.peers.is_from(word.sender, leader):
            self.peers.refuse(word.sender, f"a restart's word {word.word.value!r} for {word.host!r}: not from this "
                                           f"host's leader")
            return
        why = self.board.take_leader_word(word, host.attempt)  # a word about another attempt is stale: dropped
        if why is not None:
            stop_attempt(host, self.board, why)

    def restart(self, host, line: str) -> str | None:
        """The leader decides: tell it this host's processes of the attempt are gone, and wait
        for its `start` (or `end`), within BYOC_PEER_WAIT_TIMEOUT_S; a stop signal or a lost
        leader ends the wait."""
        plan, settings, attempt, board = host.plan, host.plan.settings, host.attempt, self.board
        failed = host.restarts[-1]  # this restart's record: the failed attempt's exit code and cause
        log(f"{plan.current_host}: attempt {attempt} ended on this host with exit code {failed['exit_code']} "
            f"({failed['cause']}); waiting for the leader's word on a restart (BYOC_MAX_RESTARTS)")
        if not self.peers.send_word(host, plan.leader, Word.ENDED, attempt, failed["exit_code"]):
            return f"the leader {plan.leader} could not be told (it has ended, or is unreachable)"
        waited = host.loop.wait(lambda: board.word is not None or host.lost is not None,
                                time.monotonic() + settings.peer_wait_timeout_s)
        if host.loop.stopped() or host.lost is not None:  # whatever else ended the wait
            return host.lost or "a stop signal came"
        if waited is Waited.TIMEOUT:
            return f"no word from the leader {plan.leader} within {settings.peer_wait_timeout_s:g} s"
        if board.word.word is Word.END:
            return f"the leader {plan.leader} ends the job after attempt {attempt}"
        board.next()
        log(f"{plan.current_host}: the leader starts attempt {host.next_attempt()}")
        return None

    def start_watches(self, host) -> list[PeerWatch]:
        plan, settings = host.plan, host.plan.settings
        watches = [PeerWatch(plan.peers, settings.job_port, settings.host_lost_timeout_s,
                             settings.peer_wait_timeout_s, host.loop.post, settings=settings, job_hosts=len(plan.hosts))]
        if self.watch_rendezvous:
            # torchrun here waits for the leader's rendezvous store with no limit of its own
            # (seen: > 10 min, silent) when the leader's host is up but its torchrun never
            # listens; the job port alone cannot tell.
            watches.append(PeerWatch([plan.leader], settings.master_port, settings.host_lost_timeout_s,
                                     settings.peer_wait_timeout_s, host.loop.post, until_first_contact=True,
                                     port_name=" (torchrun's rendezvous, BYOC_MASTER_PORT)", settings=settings))
        return watches

    def job_report(self, host, outcome: Outcome) -> None:
        """This host's figures go to the leader's job port, before its outcome (close), so a
        leader that waits for the outcome has the figures too. Never written here: SDK v2 local
        mode merges every host's output/data, and the leader's report covers this host."""
        if host.report is None:
            return
        _, text = host.report.end(host.plan.settings.report_figures_bytes)
        plan, settings = host.plan, host.plan.settings
        if not host.resolved:
            return
        if not self.peers.send(host, plan.leader, HostFigures(plan.current_host, text),
                               settings.host_done_failed_send_s):
            log(f"{plan.current_host}: could not send this host's figures to the leader {plan.leader}: "
                f"its job report will say they are missing")

    def close(self, host, outcome: Outcome) -> None:
        """Tell the leader this host's part ended (a failing host tries for less long: its leader
        may be what failed); after a success, wait for the leader to finish before exiting, this
        host's job port still open. Bounded by BYOC_PEER_WAIT_TIMEOUT_S; SIGTERM (the leader
        exited, compose stops this container) ends the wait."""
        self.peers.close_watches()
        try:
            if host.resolved and self.tell_leader(host, outcome.exit_code) and outcome.exit_code == 0:
                self.wait_for_leader(host)
        finally:
            self.peers.close()

    def tell_leader(self, host, exit_code: int) -> bool:
        plan, settings = host.plan, host.plan.settings
        delivered = self.peers.send(host, plan.leader, HostDone(plan.current_host, exit_code),
                                    settings.host_done_send_s if exit_code == 0 else settings.host_done_failed_send_s)
        if not delivered:
            log(f"{plan.current_host}: could not tell the leader {plan.leader} (port {settings.job_port}) "
                f"that this host's part ended (it has ended, or is unreachable); it will notice this host go")
        return delivered

    def wait_for_leader(self, host) -> None:
        plan, settings = host.plan, host.plan.settings
        waited = self.peers.wait_until_closed(host, [plan.leader], time.monotonic() + settings.peer_wait_timeout_s)
        if waited is Waited.TIMEOUT:
            log(f"{plan.current_host}: the leader {plan.leader} was still running after "
                f"{settings.peer_wait_timeout_s:g} s (BYOC_PEER_WAIT_TIMEOUT_S); exiting")

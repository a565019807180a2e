"""What every multi-host role holds: its peers (Peers). The other hosts' names resolved first,
this host's job port (hosts/job_port.py), each peer's addresses (a word must come from one of
them), the sends and the answers they wait for, the watches on the peers from the first run on
(they span the restarts of a job: a lost host ends the current run), the ports seen closed, and
the refusals, counted on one road. What the port reads reaches the role as typed events on the
host's loop: its handlers, and so this state, are the main thread's alone.
"""

from __future__ import annotations

import time

from entrypoint.decide.plan import LaunchPlan
from entrypoint.hosts import job_port
from entrypoint.hosts.job_port import (JOB_KEY_ENV, MESSAGE_KINDS, WORD_OF, AttemptWord, ClosedWatch, Delivered,
                                       HostDone, HostFigures, HostLive, JobPort, PeerLost, PortClosed, Refused,
                                       RootCauseLine, Word)
from entrypoint.hosts.net import wait_for_hosts
from entrypoint.log import log
from entrypoint.loop import Waited
from entrypoint.outcome.hosts import describe_port_problem
from entrypoint.outcome.records import Outcome
from entrypoint.roles.base import describe_host_failure
from entrypoint.run.supervise import RunResult

# The refusals on the job port that are logged one line each; the rest are counted, and the
# count is logged once, when the port closes (close). One bound for every kind together, not one
# a kind: whoever sends picks the word (and the refused text), so a bound a kind would let one
# sender multiply the log by the number of words, and the one count is then the number of
# messages refused, whatever they claimed to be. A host's outcome is counted like the rest: 60 KB
# of unsigned BYOC-HOST-DONE lines on one connection added 1,203 lines to the leader's log
# (issue 62). A worker's own outcome refused past the first few is still named when its port
# closes (wait_for_workers), and the count says how many of the refused claimed to be an outcome.
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


def decide_job_key(plan: LaunchPlan) -> str:
    """The key this job's hosts sign their words with: the plan's (MPI), or the one its ranks have."""
    return plan.job_key or plan.env_dict.get(JOB_KEY_ENV, "")


class Peers:
    """A multi-host role's peers and its job port (main thread only)."""

    def __init__(self) -> None:
        self.port: JobPort | None = None
        self.addresses: dict[str, list] = {}  # each peer's addresses, resolved once
        self.key = ""  # the job's key (decide_job_key)
        self.watches: list | None = None  # hosts/job_port.PeerWatch, from the first run on
        self.closed_ports: set[str] = set()  # the hosts whose job port closed (their part is over)
        self.batch = 0  # the words sent to every host at once so far (send_to_each_host)
        self.delivered: dict[int, dict[str, bool]] = {}  # the batches waited for: host -> whether it took it
        # Every message the port refused, and how many claimed to be a host's outcome: refuse()
        # alone counts them; close() says the total once.
        self.refused_messages = 0
        self.refused_outcomes = 0

    def start(self, host, take_words, start_beside=None) -> Outcome | None:
        """Every host's name resolved, then this host's job port open and the role's handlers of
        its words registered (take_words(host): every other word of the port is refused and
        counted), then start_beside(host): an Outcome when the launch cannot start (None on a
        stop: the orchestrator words it)."""
        plan, settings, loop = host.plan, host.plan.settings, host.loop
        loop.on({PeerLost: lambda lost: self.on_peer_lost(host, lost)})
        unresolved = wait_for_hosts(plan.hosts, settings.host_resolution_timeout_s, loop)
        if loop.stopped():
            return None
        if unresolved:
            host.collector.tail.append(f"host(s) {', '.join(unresolved)} did not resolve within "
                                       f"{settings.host_resolution_timeout_s:g} s (BYOC_HOST_RESOLUTION_TIMEOUT_S)")
            return Outcome(1, describe_host_failure(host, "waiting for the other hosts' names to resolve", RunResult(1)))
        host.resolved = True
        host.mark("hosts resolved")
        outcome = self.open(host)
        if outcome is None:
            take_words(host)
            outcome = start_beside(host) if start_beside is not None else None
        if outcome is None:
            host.mark("peers ready")
        return outcome

    def open(self, host) -> Outcome | None:
        plan, loop = host.plan, host.loop
        self.key = decide_job_key(plan)
        try:
            self.port = JobPort(plan.settings.job_port, loop.post, job_key=self.key, settings=plan.settings,
                                hosts=len(plan.hosts))
        except OSError as exc:
            return start_problem(host, describe_port_problem(plan.settings.job_port, plan.current_host, exc), None)
        from entrypoint.hosts.net import resolve_addresses

        # Resolved now, once (every name resolved a moment ago): the handlers that check a
        # sender run on the loop, where a lookup that blocks would hold every wait up.
        self.addresses = {peer: resolve_addresses(peer) for peer in plan.peers}
        # A word no handler takes was said once a kind as a defect of ours, and counted nowhere.
        loop.on({kind: self.refuse_word for kind, _, _ in MESSAGE_KINDS.values()})
        loop.on({RootCauseLine: lambda event: host.collector.add_line_text(event.line),
                 HostDone: lambda done: self.refuse(done.sender, f"an outcome for {done.host!r}: this host is not the "
                                                                 f"leader", claims_outcome=True),
                 HostFigures: self.refuse_word, HostLive: self.refuse_word,
                 AttemptWord: lambda word: self.refuse(word.sender, f"a restart's word {word.word.value!r}: not "
                                                                    f"for this host"),
                 Refused: self.on_refused, Delivered: self.on_delivered,
                 PortClosed: lambda event: self.closed_ports.add(event.host)})
        return None

    def refuse_word(self, message) -> None:
        self.refuse(message.sender, f"{WORD_OF[type(message)].strip()}: not a word this host takes now")

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

    def peer_addresses(self, peer: str) -> list:
        """A peer's addresses, resolved at the start (open): a word it sends must come from one
        of them (the job's key is in every rank's environment, so a signature alone does not
        tell a host from a rank elsewhere claiming to be it)."""
        return self.addresses.get(peer, [])

    def is_from(self, sender: str, peer: str) -> bool:
        return sender in self.peer_addresses(peer)

    def send(self, host, to: str, message, within_s: float, until_open: bool = False) -> bool:
        """A message to a host's job port, tried again until within_s (the loop's pauses
        between; until_open: a port not open yet too)."""
        settings = host.plan.settings
        return job_port.deliver(host.loop, to, settings.job_port, self.key, message, within_s, settings, until_open)

    def send_to_each_host(self, host, hosts, message_of, within_s: float) -> dict[str, bool]:
        """message_of(host) to every one of hosts at once (hosts/job_port.send_to_each), each
        tried for within_s; host -> whether it took it (a host missing: a stop ended the wait)."""
        settings, hosts = host.plan.settings, list(hosts)
        self.batch += 1
        batch = self.batch
        taken = self.delivered[batch] = {}
        try:
            job_port.send_to_each(hosts, settings.job_port, self.key, message_of, within_s, host.loop, batch, settings)
            host.loop.wait(lambda: len(taken) == len(hosts), time.monotonic() + within_s + settings.thread_join_s)
        finally:
            del self.delivered[batch]  # a late answer of this batch is nobody's now
        return dict(taken)

    def send_off_the_loop(self, host, hosts, message_of, within_s: float) -> None:
        """message_of(host) to every one of hosts at once, that nobody waits for."""
        settings = host.plan.settings
        job_port.send_to_each(hosts, settings.job_port, self.key, message_of, within_s, host.loop, NOBODY_WAITS,
                              settings)

    def on_delivered(self, delivered: Delivered) -> None:
        """A sender's answer: the batch's that waits for it (send_to_each_host); one sent with
        NOBODY_WAITS, or a batch's whose wait has ended, is dropped."""
        batch = self.delivered.get(delivered.batch)
        if batch is not None:
            batch[delivered.host] = delivered.delivered

    def send_word_to_each(self, host, hosts, word: Word, attempt: int, within_s: float) -> dict[str, bool]:
        """A restart's word to every one of hosts at once (send_to_each_host)."""
        current = host.plan.current_host
        return self.send_to_each_host(host, hosts, lambda _host: AttemptWord(word, attempt, current), within_s)

    def send_word(self, host, to: str, word: Word, attempt: int, exit_code: int = 0,
                  within_s: float | None = None) -> bool:
        settings = host.plan.settings
        return self.send(host, to, AttemptWord(word, attempt, host.plan.current_host, exit_code),
                         settings.host_done_send_s if within_s is None else within_s)

    def watch(self, host, supervisor, start_watches) -> None:
        """A run's processes started: the peers are watched from the first run on (start_watches
        (host), once); a host lost while they started ends this run too."""
        if self.watches is None:
            self.watches = start_watches(host)
        if host.lost is not None:
            supervisor.stop_after_failure(f"{host.lost}: the job cannot go on")

    def on_peer_lost(self, host, lost: PeerLost) -> None:
        if host.lost is not None or not self.watches:
            return  # the first lost host is the one named; none is once the watches closed
        host.lost = lost.reason
        host.supervisor.stop_after_failure(f"{lost.reason}: the job cannot go on")

    def close_watches(self) -> None:
        for watch in self.watches or ():
            watch.close()  # this host's part is over: a peer leaving now is not a lost host
        self.watches = []

    def wait_until_closed(self, host, hosts, deadline: float, closed_after_s: float = 0.0,
                          until=lambda: False) -> Waited:
        """Until every one of hosts' job ports closed (ClosedWatch), until() is true, a stop came,
        or the deadline (time.monotonic())."""
        settings = host.plan.settings
        watch = ClosedWatch(hosts, settings.job_port, host.loop.post, closed_after_s, settings,
                            job_hosts=len(host.plan.hosts))
        try:
            return host.loop.wait(lambda: until() or all(h in self.closed_ports for h in hosts), deadline)
        finally:
            watch.close()

    def close(self) -> None:
        self.close_watches()
        if self.port is not None:
            self.port.close()
        summary = build_refusals_summary(self.refused_messages, self.refused_outcomes)
        # Once, after the port closed: it reads nothing more. (close runs beside the loop: the last
        # lines the port read may still be on the loop's queue for a moment, and are not counted.)
        if summary is not None:
            log(summary)


def start_problem(host, problem: str, stopped_by: str | None) -> Outcome:
    host.collector.tail.append(problem)
    return Outcome(1, describe_host_failure(host, f"{host.what}: starting the workers", RunResult(1, stopped_by)))


def from_worker(host, peers: Peers, sender: str, worker: str, what: str, again: bool | None = None) -> bool:
    """Whether a word about `worker` is one of this leader's workers' own, sent from its own
    address (the job's key is in every rank's environment, so a signature alone does not tell a
    host from a rank elsewhere claiming to be it); else it is refused (what: the word). again:
    for a word taken once only, whether this worker's was taken already (None: any number)."""
    if worker not in host.plan.peers or again:
        peers.refuse(sender, f"{what} for {worker!r}: not one of this leader's workers" +
                     (", or again" if again is not None else ""))
        return False
    if not peers.is_from(sender, worker):
        peers.refuse(sender, f"{what} for {worker!r} sent from another address")
        return False
    return True


def take_worker_figures(host, peers: Peers, taken: dict[str, dict], figures: HostFigures) -> None:
    """A worker's figures for the job report (only a leader takes them: from_worker), keeping
    only what it knows of them (jobreport/figures.parse_host_figures)."""
    from entrypoint.jobreport.figures import parse_host_figures

    worker, sender = figures.host, figures.sender
    if not from_worker(host, peers, sender, worker, "figures", again=worker in taken):
        return
    try:
        parsed, failed = parse_host_figures(figures.figures, worker), ""
    except Exception as exc:  # noqa: BLE001 - whatever arrives, the port goes on
        # Said in the refusal's line, not a line of its own: a sender could repeat it at will.
        parsed, failed = None, f" ({type(exc).__name__}: {exc})"
    if parsed is None:
        peers.refuse(sender, f"figures for {worker!r} that are not figures{failed}")
        return
    taken[worker] = parsed


def take_worker_live(host, peers: Peers, live_figures: HostLive) -> None:
    """A worker's live figures (jobreport/live/), from the worker itself (from_worker), while
    this host's live view runs; the live thread parses them."""
    live = host.report.live if host.report is not None else None
    if live is None:
        peers.refuse(live_figures.sender, f"live figures for {live_figures.host!r}: no live view here")
        return
    if from_worker(host, peers, live_figures.sender, live_figures.host, "live figures"):
        live.take_remote(live_figures.host, live_figures.figures)

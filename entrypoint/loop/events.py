"""Every event the host's loop carries, in one place: what posts it, and who takes it. A
thread, a port reader or a signal handler only posts one of these (HostLoop.post); the main
thread hands it to the handlers the current phase registered for its type (host_loop.py).

    event              posted by                          taken by
    StopRequested      the stop token's signal handler    start-up (says it), the run (forwards it),
                       (run/stop.py)                      finishing (cuts its step)
    StacksRequested    SIGUSR1's handler (run/stop.py)    the run (asks the ranks), else "none yet"
    ChildExited        SIGCHLD's handler (a run's)        a wake-up: the run looks at its processes
    StepEnded          a step run beside the loop         a wake-up: the wait looks at the step
    RootCauseLine      the job port (a rank's record)     the job-port roles (the collector)
    HostDone           the job port (a worker's outcome)  the leader of a job-port launch
    HostFigures        the job port                       the leader (the job report)
    HostLive           the job port                       the leader (the live view)
    AttemptWord        the job port (a restart's word)    the job-port roles (roles/attempts.py)
    MpiReady           the job port                       the MPI leader
    PeerKeys           the job port                       an MPI worker
    LeaderAsk          the job port                       an MPI worker
    JobOutcome         the job port                       an MPI worker
    FollowRanks        the job port                       an MPI worker (hosts/worker_output.py)
    Refused            the job port, the rank-output pump every multi-host role (logged, dropped)
    Delivered          send_to_each's senders             the role that sent (by batch)
    PeerLost           PeerWatch                          the multi-host roles (the run ends)
    PortClosed         ClosedWatch                        the job-port roles (a host's part is over)
    SessionReady       the rank-output pump               the run's WorkerOutput
    SessionEnded       the rank-output pump               the run's WorkerOutput

An event that no handler takes is logged once per type (host_loop.HostLoop.dispatch), so a
phase that forgot one is seen; the wake-ups (WAKE_UPS) are taken by the wait that posted for
them, and need no handler. The job port's messages are also its words on the wire
(hosts/job_port.MESSAGE_KINDS gives each its one parser); a message is dispatched by its type,
never by its text.
"""

from __future__ import annotations

import enum
from typing import NamedTuple


# --- this process: signals and steps ---------------------------------------------------------


class StopRequested(NamedTuple):
    """SIGTERM, SIGINT or SIGHUP reached this process (posted by the stop token's handler)."""

    signum: int
    at: float = 0.0  # time.monotonic() of its post: a storm of stops is one burst, forwarded once


class StacksRequested(NamedTuple):
    """SIGUSR1: every rank on this host prints its Python stack (the run's handler asks them;
    outside a run there is none to ask, and the phase says so)."""

    at: float = 0.0  # time.monotonic() of its post: a burst is told by when the signals came


class ChildExited(NamedTuple):
    """SIGCHLD: a process below this one ended (posted while a run is on)."""


class StepEnded(NamedTuple):
    """A step run beside the loop returned or raised (run_beside)."""


# Events that only wake a wait whose condition is read elsewhere (a process table, a step's
# result): no handler takes them, and none is missing when none does.
WAKE_UPS = (ChildExited, StepEnded)


# --- the job port's messages (hosts/job_port.py: their words and parsers) --------------------


class HostDone(NamedTuple):
    """BYOC-HOST-DONE: a worker host's part ended (to the leader)."""

    host: str
    exit_code: int
    sender: str = ""  # the address it came from (the port fills it in; not on the wire)


class HostFigures(NamedTuple):
    """BYOC-HOST-FIGURES: a worker host's figures for the job report (to the leader); the
    figures' JSON goes in as a string: the leader parses it on its own terms."""

    host: str
    figures: str
    sender: str = ""


class HostLive(NamedTuple):
    """BYOC-HOST-LIVE: a worker host's live figures (to the leader, every live interval)."""

    host: str
    figures: str
    sender: str = ""


class Word(str, enum.Enum):
    """A restart's word (roles/attempts.py says who sends which, and when). A str: on the
    wire it is its value; in the code it is compared as itself, never as text."""

    STOP = "stop"  # the leader's: attempt N failed: stop your processes of it, say when they are gone
    ENDED = "ended"  # a worker's: its processes of attempt N are gone (they failed, or were stopped)
    START = "start"  # the leader's: every host's processes of attempt N-1 are gone: start attempt N
    END = "end"  # the leader's: attempt N is the last: end your part with its outcome


class AttemptWord(NamedTuple):
    """BYOC-ATTEMPT: a restart's word, about one attempt."""

    word: Word
    attempt: int  # the attempt it is about, from 1
    host: str  # the sender's host
    exit_code: int = 0  # ENDED: how that host's processes of the attempt ended
    sender: str = ""


class RootCauseLine(NamedTuple):
    """BYOC-ROOT-CAUSE: a rank's root cause, as the record line it printed (any host's rank)."""

    line: str
    sender: str = ""


class Refused(NamedTuple):
    """What reached the port and is not this job's (unsigned, another key, a replay, not one of
    the words): dropped, and said why."""

    sender: str
    why: str
    host_done: bool = False  # it claims to be a host's outcome (the leader waits for those)


class MpiReady(NamedTuple):
    """BYOC-MPI-READY: an MPI worker's sshd serves (to the leader). trusted False: here is this
    host's key (its client identity and host key); True: every host's key is authorized here."""

    host: str
    public_key: str
    trusted: bool = False
    sender: str = ""


class PeerKeys(NamedTuple):
    """BYOC-PEER-KEYS: part `part` of `parts` of every host's SSH key (the MPI leader's, to each
    worker): ((host, (addresses...), public key), ...)."""

    part: int
    parts: int
    keys: tuple
    sender: str = ""


class Ask(str, enum.Enum):
    """What the MPI leader asks a worker for (BYOC-LEADER-ASK)."""

    STACKS = "stacks"  # its ranks print their Python stacks
    FIGURES = "figures"  # its figures for the job report (a HostFigures back)


class LeaderAsk(NamedTuple):
    ask: Ask
    sender: str = ""


class JobOutcome(NamedTuple):
    """BYOC-JOB-OUTCOME: the MPI job's outcome (the leader's, to each worker); report: the
    leader's output/failure when the job failed."""

    exit_code: int
    report: str = ""
    sender: str = ""


class FollowRanks(NamedTuple):
    """BYOC-FOLLOW-RANKS: stream this run's ranks' output to the leader's port `port`, opening
    with the nonce (the MPI leader's, to each worker, before each mpirun)."""

    port: int
    nonce: str
    sender: str = ""


class RankOutputOpens(NamedTuple):
    """BYOC-RANK-OUTPUT: the first line of a worker's rank-output stream (hosts/worker_output.py):
    this host's ranks' lines follow, for the run whose nonce this is. Read by the pump, never
    posted."""

    host: str
    nonce: str
    sender: str = ""


# --- what the transports notice ----------------------------------------------------------------


class Delivered(NamedTuple):
    """A message sent to one host off the loop (hosts/job_port.send_to_each): whether that
    host took it."""

    host: str
    delivered: bool
    batch: int = 0


class PeerLost(NamedTuple):
    """A peer stopped answering on its port for the time allowed, or never answered."""

    host: str
    reason: str


class PortClosed(NamedTuple):
    """A host's port stopped answering (its part is over: it has exited)."""

    host: str
    port: int


class SessionReady(NamedTuple):
    """A worker's rank-output stream opened: it follows its folder (hosts/worker_output.py)."""

    session: object  # the WorkerSession (one per worker and run: an earlier run's is not this one's)


class SessionEnded(NamedTuple):
    """A worker's rank-output stream reached its end (or never opened: its ask was not taken)."""

    session: object

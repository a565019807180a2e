"""Restarts in place across the hosts of a job-port launch (torchrun on several hosts, the
parameter server): the leader decides, every host stops its processes of the failed attempt,
and only once all of them are gone does any host start the next one (docs/reliability.md).

The words, on the job port (hosts/job_port.AttemptWord), each naming its attempt:

    worker -> leader   ended N     this host's processes of attempt N are gone (they failed,
                                   or the leader's `stop N` stopped them); it waits for the
                                   leader's next word
    leader -> worker   stop N      attempt N failed somewhere: stop yours, say `ended N`
    leader -> worker   start N+1   every host said `ended N` (the leader's own are gone too):
                                   start attempt N+1, a fresh rendezvous (--rdzv_id per attempt)
    leader -> worker   end N       no attempt follows: end your part with attempt N's outcome

A word about another attempt than the one a host is in is stale: dropped. So a rank of
attempt N never meets a peer of attempt N-1: when any host starts N, no process of N-1 is
left on any host.

AttemptBoard is what was heard about the attempt this host is in (its number is the host's,
orchestrate.Host.attempt, handed to each call): the role's handlers of these words (on the
host's loop, main thread) change it, and its waits between attempts are the loop's
(roles/job_port.py).
"""

from __future__ import annotations

import enum

from entrypoint.loop.events import AttemptWord, Word


class Taken(enum.Enum):
    """What the leader's board made of a worker's `ended`."""

    STALE = "stale"  # about another attempt: dropped
    TAKEN = "taken"  # this attempt's
    OVER = "over"  # this attempt's, and no attempt follows: that worker is told `end`


class AttemptBoard:
    """The words heard about the attempt this host is in (main thread only)."""

    def __init__(self) -> None:
        self.ended: dict[str, int] = {}  # the leader's: worker -> how its processes of this attempt ended
        self.word: AttemptWord | None = None  # a worker's: the leader's word on what follows this attempt
        self.running = False  # this attempt's processes started
        self.stop_why: str | None = None  # why this attempt's run must stop, once a word said so
        self.next_stop_why: str | None = None  # the same for the next attempt, heard before it began
        self.over = False  # the leader's: no attempt follows this one

    def take_ended(self, word: AttemptWord, attempt: int) -> Taken:
        """The leader's, in attempt: a worker's `ended`."""
        if word.attempt != attempt:
            return Taken.STALE
        self.ended.setdefault(word.host, word.exit_code)
        return Taken.OVER if self.over else Taken.TAKEN

    def take_leader_word(self, word: AttemptWord, attempt: int) -> str | None:
        """A worker's, in attempt: the leader's `stop`, `start` or `end`. Why this attempt's run
        must stop now, when the word says so; None otherwise (a word about another attempt is
        dropped)."""
        if word.word is Word.START and word.attempt == attempt + 1 or \
                word.word is Word.END and word.attempt == attempt:
            self.word = self.word or word
            return None
        why = f"the leader stops attempt {word.attempt} to start the job again"
        if word.word is Word.STOP and self.word is not None and word.attempt == self.word.attempt == \
                attempt + 1 and self.word.word is Word.START:
            self.next_stop_why = why  # the attempt it just said to start failed already
            return None
        return why if word.word is Word.STOP and word.attempt == attempt else None

    def stop(self, why: str) -> None:
        """This attempt's run ends: now (the caller stops it) or once its processes start."""
        self.stop_why = self.stop_why or why

    def started(self) -> str | None:
        """This attempt's processes started: why they must stop at once, when a word said so."""
        self.running = True
        return self.stop_why

    def next(self) -> None:
        """The next attempt begins: what was heard about this one is forgotten."""
        self.ended, self.word, self.running = {}, None, False
        self.stop_why, self.next_stop_why = self.next_stop_why, None

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

AttemptBoard is what the job port's reader threads and the main thread share: the threads
post the words they take, and stop the attempt's run when a word says so; the main thread
waits on it, with a deadline, between attempts.
"""

from __future__ import annotations

import threading
import time

from entrypoint.hosts.job_port import AttemptWord


class AttemptBoard:
    """The attempt this host is in and the words heard about it (thread-safe)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self.attempt = 1
        self._ended: dict[str, int] = {}  # the leader's: worker -> how its processes of this attempt ended
        self._word: AttemptWord | None = None  # a worker's: the leader's word on what follows this attempt
        self._supervisor = None  # this attempt's run, once its processes started
        self._stop_why: str | None = None  # why this attempt's run must stop, once a word said so
        self._next_stop_why: str | None = None  # the same for the next attempt, heard before it began
        self.over = False  # the leader's: no attempt follows this one

    # --- from the job port's reader threads -------------------------------------------------------

    def take_ended(self, word: AttemptWord) -> str:
        """The leader's: a worker's `ended`. Returns "stale", "taken", or "over" (no attempt
        follows: the caller tells that worker `end`)."""
        with self._changed:
            if word.attempt != self.attempt:
                return "stale"
            self._ended.setdefault(word.host, word.exit_code)
            self._changed.notify_all()
            over = self.over
        self.stop_run(f"host {word.host}'s processes of attempt {word.attempt} ended with exit code "
                      f"{word.exit_code}: the attempt cannot go on")
        return "over" if over else "taken"

    def take_leader_word(self, word: AttemptWord) -> bool:
        """A worker's: the leader's `stop`, `start` or `end`; False when it is stale."""
        with self._changed:
            if word.word == "start" and word.attempt == self.attempt + 1 or \
                    word.word == "end" and word.attempt == self.attempt:
                self._word = self._word or word
                self._changed.notify_all()
                return True
            why = f"the leader stops attempt {word.attempt} to start the job again"
            if word.word == "stop" and self._word is not None and word.attempt == self._word.attempt == \
                    self.attempt + 1 and self._word.word == "start":
                self._next_stop_why = why  # the attempt it just said to start failed already
                return True
            if not (word.word == "stop" and word.attempt == self.attempt):
                return False
        self.stop_run(why)
        return True

    def stop_run(self, why: str) -> None:
        """This attempt's run ends now, or as soon as its processes started."""
        with self._changed:
            self._stop_why = self._stop_why or why
            supervisor = self._supervisor
        if supervisor is not None and supervisor.kill_at is None and supervisor.is_running():
            supervisor.stop_after_failure(why)

    # --- from the main thread ---------------------------------------------------------------------

    def started(self, supervisor) -> None:
        """This attempt's processes started: a word that asked them to stop before, stops them now."""
        with self._changed:
            self._supervisor = supervisor
            why = self._stop_why
        if why is not None:
            supervisor.stop_after_failure(why)

    def ended(self) -> dict[str, int]:
        with self._changed:
            return dict(self._ended)

    def next(self) -> int:
        """The next attempt begins: what was heard about this one is forgotten."""
        with self._changed:
            self.attempt += 1
            self._ended, self._word, self._supervisor = {}, None, None
            self._stop_why, self._next_stop_why = self._next_stop_why, None
            return self.attempt

    def end(self) -> None:
        with self._changed:
            self.over = True

    def wait_for_ended(self, hosts, deadline: float, give_up, slice_s: float) -> list[str]:
        """The leader's: wait until every host said `ended` for this attempt, the deadline
        (time.monotonic()) passed or give_up() is true. The hosts still silent."""
        return self._wait(lambda: [h for h in hosts if h not in self._ended], deadline, give_up, slice_s)

    def wait_for_leader_word(self, deadline: float, give_up, slice_s: float) -> AttemptWord | None:
        """A worker's: the leader's `start` or `end` after this attempt; None at the deadline or
        once give_up() is true."""
        missing = self._wait(lambda: [] if self._word is not None else ["the leader"], deadline, give_up, slice_s)
        return None if missing else self._word

    def _wait(self, missing, deadline: float, give_up, slice_s: float) -> list:
        with self._changed:
            while True:
                left = missing()
                if not left or time.monotonic() >= deadline or give_up():
                    return left
                # give_up reads what no word wakes (a stop signal, a lost host): looked at every slice
                self._changed.wait(min(slice_s, max(0.0, deadline - time.monotonic())))

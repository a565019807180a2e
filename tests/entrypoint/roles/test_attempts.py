"""The restart words across hosts (hosts/job_port.AttemptWord, roles/attempts.AttemptBoard):
each parsed with one parser, signed like every job-port record, and taken only for the attempt
they name. The whole exchange, through the real entrypoint on emulated hosts:
tests/multihost/test_restarts.py."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from entrypoint.hosts.job_port import (ATTEMPT, AttemptWord, JobPort, build_attempt_record, build_signed_line,
                                       parse_attempt_record, send_attempt_word)
from entrypoint.roles.attempts import AttemptBoard
from entrypoint.settings import DEFAULTS

KEY = "cd" * 32


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_word_goes_through_the_signed_port_and_comes_out_typed():
    port, heard, refused = free_port(), [], []
    listener = JobPort(port, on_root_cause=lambda line: None, report_key=KEY, on_refused=lambda a, why: refused.append(why),
                       on_attempt=lambda word, sender: heard.append((word, sender)))
    try:
        word = AttemptWord("ended", 3, "algo-2", 137)
        assert send_attempt_word("127.0.0.1", port, KEY, word, 5.0, lambda: False)
        assert send_attempt_word("127.0.0.1", port, "ef" * 32, word, 5.0, lambda: False)  # another job's key
        deadline = time.monotonic() + 30
        while len(heard) + len(refused) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert heard == [(word, "127.0.0.1")]
        assert refused == ["signed with another key"]
    finally:
        listener.close()


@pytest.mark.parametrize("fields", [
    {"word": "restart", "attempt": 2, "host": "algo-1"},  # not one of the words
    {"word": "start", "attempt": 0, "host": "algo-1"},  # attempts count from 1
    {"word": "start", "attempt": -1, "host": "algo-1"},
    {"word": "start", "attempt": True, "host": "algo-1"},  # a bool is not a number here
    {"word": "start", "attempt": 2.0, "host": "algo-1"},
    {"word": "start", "attempt": "2", "host": "algo-1"},
    {"word": "ended", "attempt": 2, "host": "algo-1", "exit_code": float("nan")},
    {"word": "start", "attempt": 2, "host": None},
    {"word": "start", "attempt": 2},  # no host
    ["start", 2, "algo-1"],  # not an object
])
def test_a_word_that_is_not_one_is_none(fields):
    assert parse_attempt_record(ATTEMPT + json.dumps(fields)) is None


def test_every_word_survives_its_round_trip_and_odd_host_text_too():
    for word in ("stop", "ended", "start", "end"):
        for host in ("algo-1", "h\ud800st", "a\x00b", "x" * 5000):
            got = parse_attempt_record(build_attempt_record(AttemptWord(word, 2 ** 40, host, 255), time.time()))
            assert got == AttemptWord(word, 2 ** 40, host, 255)
    assert build_signed_line(KEY, build_attempt_record(AttemptWord("end", 1, "h\ud800"), 1.0)).isascii()


def test_the_board_takes_words_only_for_the_attempt_it_is_in():
    board = AttemptBoard()
    assert board.take_leader_word(AttemptWord("start", 3, "algo-1")) is False  # two ahead: stale
    assert board.take_leader_word(AttemptWord("end", 2, "algo-1")) is False  # another attempt's end
    assert board.take_ended(AttemptWord("ended", 2, "algo-2", 1)) == "stale"
    assert board.take_ended(AttemptWord("ended", 1, "algo-2", 1)) == "taken"
    assert board.ended() == {"algo-2": 1}
    assert board.next() == 2 and board.ended() == {}  # what was heard of attempt 1 is forgotten
    assert board.take_ended(AttemptWord("ended", 1, "algo-3", 1)) == "stale"  # late word of attempt 1
    board.end()
    assert board.take_ended(AttemptWord("ended", 2, "algo-3", 1)) == "over"


class Run:
    """A stand-in for supervise.Supervisor's two calls the board makes."""

    kill_at = None

    def __init__(self):
        self.stopped: list[str] = []

    def is_running(self) -> bool:
        return not self.stopped

    def stop_after_failure(self, why: str) -> None:
        self.stopped.append(why)


def test_a_stop_that_comes_before_the_attempts_processes_started_stops_them_once_they_have():
    board = AttemptBoard()
    assert board.take_leader_word(AttemptWord("stop", 1, "algo-1"))
    run = Run()
    board.started(run)
    assert run.stopped == ["the leader stops attempt 1 to start the job again"]
    board.take_leader_word(AttemptWord("stop", 1, "algo-1"))  # again: the run is already stopping
    assert len(run.stopped) == 1


def test_a_workers_wait_ends_with_the_leaders_word_or_at_the_deadline_or_on_give_up():
    board = AttemptBoard()
    assert board.wait_for_leader_word(time.monotonic() + 0.3, lambda: False, DEFAULTS.stop_check_s) is None
    assert board.wait_for_leader_word(time.monotonic() + 60, lambda: True, DEFAULTS.stop_check_s) is None
    threading.Timer(0.2, board.take_leader_word, [AttemptWord("start", 2, "algo-1")]).start()
    assert board.wait_for_leader_word(time.monotonic() + 60, lambda: False, DEFAULTS.stop_check_s) == \
        AttemptWord("start", 2, "algo-1")


def test_the_leaders_wait_names_the_hosts_that_never_said_ended():
    board = AttemptBoard()
    threading.Timer(0.2, board.take_ended, [AttemptWord("ended", 1, "algo-2", 143)]).start()
    assert board.wait_for_ended(["algo-2"], time.monotonic() + 60, lambda: False, DEFAULTS.stop_check_s) == []
    assert board.wait_for_ended(["algo-2", "algo-3"], time.monotonic() + 0.3, lambda: False,
                                DEFAULTS.stop_check_s) == ["algo-3"]


def test_a_stop_for_the_attempt_just_started_that_comes_before_it_began_here_is_kept():
    """The leader said `start 2`, and attempt 2 failed elsewhere before this host moved to it:
    its `stop 2` stops this host's attempt 2 as soon as its processes start, not dropped as stale."""
    board = AttemptBoard()
    assert board.take_leader_word(AttemptWord("start", 2, "algo-1"))
    assert board.take_leader_word(AttemptWord("stop", 2, "algo-1"))
    assert board.next() == 2
    run = Run()
    board.started(run)
    assert run.stopped == ["the leader stops attempt 2 to start the job again"]
    assert AttemptBoard().take_leader_word(AttemptWord("stop", 2, "algo-1")) is False  # no start 2 heard: stale

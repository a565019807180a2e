"""The restart words across hosts (hosts/job_port.AttemptWord, roles/attempts.AttemptBoard):
each parsed with one parser, signed like every job-port record, and taken only for the attempt
they name. The whole exchange, through the real entrypoint on emulated hosts:
tests/multihost/test_restarts.py."""

from __future__ import annotations

import json
import socket
import time

import pytest

from entrypoint.hosts.job_port import (ATTEMPT, AttemptWord, Word, JobPort, Refused, Sent, build_record,
                                       build_signed_line, parse_attempt_record, send_message)
from entrypoint.loop import HostLoop
from entrypoint.roles.attempts import AttemptBoard, Taken

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

KEY = "cd" * 32


def free_port() -> int:
    # Picked as the job port binds (every address, SO_REUSEADDR): a port a closed connection
    # still holds (TIME_WAIT, after many probes) is not picked to fail that bind.
    with socket.create_server(("", 0)) as s:
        return s.getsockname()[1]


def test_a_word_goes_through_the_signed_port_and_comes_out_typed():
    port, loop, heard = free_port(), HostLoop(), []
    loop.on({AttemptWord: heard.append, Refused: heard.append})
    listener = JobPort(port, loop.post, job_key=KEY)
    try:
        word = AttemptWord(Word.ENDED, 3, "algo-2", 137)
        assert send_message("127.0.0.1", port, KEY, word) is Sent.DELIVERED
        assert send_message("127.0.0.1", port, "ef" * 32, word) is Sent.REFUSED  # another job's key: told so
        loop.wait(lambda: len(heard) == 2, time.monotonic() + 60)
        assert sorted(heard, key=lambda e: type(e).__name__) == [word._replace(sender="127.0.0.1"),
                                                                 Refused("127.0.0.1", "signed with another key")]
    finally:
        listener.close()


def test_a_word_to_a_closed_port_is_refused_not_failed():
    assert send_message("127.0.0.1", free_port(), KEY, AttemptWord(Word.END, 1, "algo-1")) is Sent.CLOSED


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
    for word in Word:
        for host in ("algo-1", "h\ud800st", "a\x00b", "x" * 5000):
            got = parse_attempt_record(build_record(AttemptWord(word, 2 ** 40, host, 255), time.time()))
            assert got == AttemptWord(word, 2 ** 40, host, 255) and got.word is word  # the enum, not its text
    assert build_signed_line(KEY, build_record(AttemptWord(Word.END, 1, "h\ud800"), 1.0)).isascii()


def test_the_board_takes_words_only_for_the_attempt_it_is_in():
    board = AttemptBoard()  # the attempt is the host's, handed to each call: 1, then 2
    assert board.take_leader_word(AttemptWord(Word.START, 3, "algo-1"), 1) is None and board.word is None  # two ahead
    assert board.take_leader_word(AttemptWord(Word.END, 2, "algo-1"), 1) is None and board.word is None  # another's end
    assert board.take_ended(AttemptWord(Word.ENDED, 2, "algo-2", 1), 1) is Taken.STALE
    assert board.take_ended(AttemptWord(Word.ENDED, 1, "algo-2", 1), 1) is Taken.TAKEN
    assert board.ended == {"algo-2": 1}
    board.next()
    assert board.ended == {}  # what was heard of attempt 1 is forgotten
    assert board.take_ended(AttemptWord(Word.ENDED, 1, "algo-3", 1), 2) is Taken.STALE  # late word of attempt 1
    board.over = True
    assert board.take_ended(AttemptWord(Word.ENDED, 2, "algo-3", 1), 2) is Taken.OVER


def test_the_leaders_start_or_end_is_the_word_a_worker_waits_for_and_the_first_stands():
    board = AttemptBoard()
    assert board.take_leader_word(AttemptWord(Word.START, 2, "algo-1"), 1) is None
    assert board.take_leader_word(AttemptWord(Word.END, 1, "algo-1"), 1) is None
    assert board.word == AttemptWord(Word.START, 2, "algo-1")


def test_a_stop_that_comes_before_the_attempts_processes_started_stops_them_once_they_have():
    board = AttemptBoard()
    why = board.take_leader_word(AttemptWord(Word.STOP, 1, "algo-1"), 1)
    assert why == "the leader stops attempt 1 to start the job again"
    board.stop(why)
    assert board.started() == why
    assert board.take_leader_word(AttemptWord(Word.STOP, 2, "algo-1"), 1) is None  # not this attempt's: stale


def test_a_stop_for_the_attempt_just_started_that_comes_before_it_began_here_is_kept():
    """The leader said `start 2`, and attempt 2 failed elsewhere before this host moved to it:
    its `stop 2` stops this host's attempt 2 as soon as its processes start, not dropped as stale."""
    board = AttemptBoard()
    assert board.take_leader_word(AttemptWord(Word.START, 2, "algo-1"), 1) is None
    assert board.take_leader_word(AttemptWord(Word.STOP, 2, "algo-1"), 1) is None  # kept for attempt 2
    board.next()
    assert board.started() == "the leader stops attempt 2 to start the job again"
    assert AttemptBoard().take_leader_word(AttemptWord(Word.STOP, 2, "algo-1"), 1) is None  # no start 2 heard: stale

"""The MPI hosts' words on the job port (hosts/job_port.py: MPI-READY, PEER-KEYS, LEADER-ASK,
JOB-OUTCOME, FOLLOW-RANKS and a rank-output stream's opening, RANK-OUTPUT) and what a worker writes from them (hosts/ssh.py): each parsed by its one parser,
refused whole when a field is not what it must be, and never able to write a second line or an
option into authorized_keys or known_hosts."""

from __future__ import annotations

import json
import subprocess

import pytest

from entrypoint.hosts import job_port, ssh
from entrypoint.hosts.job_port import (MAX_MESSAGE_BYTES, Ask, FollowRanks, JobOutcome, LeaderAsk, MpiReady, PeerKeys,
                                       RankOutputOpens, build_job_outcome, build_record, build_signed_line,
                                       parse_record)
from entrypoint.roles.mpi import KEYS_PER_MESSAGE, build_key_parts

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

KEY = "ssh-ed25519 " + "A" * 68
NONCE = "0123456789abcdef" * 2
OTHER = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB" + "x" * 32


def record_of(word: str, fields: dict) -> str:
    return f"{word} {json.dumps({**fields, 'time': 1.0})}"


@pytest.mark.parametrize("message", [
    MpiReady("algo-2", KEY), MpiReady("algo-2", KEY, True), LeaderAsk(Ask.STACKS), LeaderAsk(Ask.FIGURES),
    JobOutcome(0), JobOutcome(137, "RuntimeError: boom \u00e9\n"),
    PeerKeys(1, 2, (("algo-1", ("10.0.0.1",), KEY), ("algo-2", ("10.0.0.2", "fd00::2"), OTHER))),
    FollowRanks(1, NONCE), FollowRanks(65535, NONCE), RankOutputOpens("algo-2", NONCE),
])
def test_each_word_reads_back_as_it_was_made(message):
    assert parse_record(build_record(message, 1.0)) == message


@pytest.mark.parametrize("word, fields", [
    ("BYOC-MPI-READY", {"host": "algo-2", "public_key": KEY + "\nssh-ed25519 " + "B" * 68}),  # a second line
    ("BYOC-MPI-READY", {"host": "algo-2", "public_key": 'command="sh" ' + KEY}),  # an option before it
    ("BYOC-MPI-READY", {"host": "algo-2", "public_key": "ssh-rsa " + "A" * 68}),  # not the job's key type
    ("BYOC-MPI-READY", {"host": "algo-2", "public_key": KEY, "trusted": "yes"}),
    ("BYOC-MPI-READY", {"public_key": KEY}),
    ("BYOC-PEER-KEYS", {"part": 0, "parts": 1, "keys": []}),  # parts count from 1
    ("BYOC-PEER-KEYS", {"part": 2, "parts": 1, "keys": []}),
    ("BYOC-PEER-KEYS", {"part": True, "parts": 1, "keys": []}),
    ("BYOC-PEER-KEYS", {"part": 1, "parts": 1, "keys": [["algo-1", ["10.0.0.1"], KEY + " x"]]}),
    ("BYOC-PEER-KEYS", {"part": 1, "parts": 1, "keys": [["algo-1", ["10.0.0.1,*"], KEY]]}),  # from= widened
    ("BYOC-PEER-KEYS", {"part": 1, "parts": 1, "keys": [["algo-1", [], KEY]]}),  # from nowhere
    ("BYOC-PEER-KEYS", {"part": 1, "parts": 1, "keys": [["algo 1\n", ["10.0.0.1"], KEY]]}),
    ("BYOC-PEER-KEYS", {"part": 1, "parts": 1, "keys": [["algo-1", ["10.0.0.1"]]]}),
    ("BYOC-LEADER-ASK", {"ask": "everything"}),
    ("BYOC-JOB-OUTCOME", {"exit_code": "1"}),
    ("BYOC-JOB-OUTCOME", {"exit_code": 1, "report": 5}),
    ("BYOC-FOLLOW-RANKS", {"port": 0, "nonce": NONCE}),  # the port's bounds: 1 to 65535
    ("BYOC-FOLLOW-RANKS", {"port": 65536, "nonce": NONCE}),
    ("BYOC-FOLLOW-RANKS", {"port": True, "nonce": NONCE}),
    ("BYOC-FOLLOW-RANKS", {"port": 2.5, "nonce": NONCE}),
    ("BYOC-FOLLOW-RANKS", {"port": 1, "nonce": NONCE[:-1]}),  # 31 digits; 33 below
    ("BYOC-FOLLOW-RANKS", {"port": 1, "nonce": NONCE + "0"}),
    ("BYOC-FOLLOW-RANKS", {"port": 1, "nonce": NONCE.upper()}),
    ("BYOC-FOLLOW-RANKS", {"port": 1, "nonce": NONCE[:-1] + "\n"}),
    ("BYOC-RANK-OUTPUT", {"host": 2, "nonce": NONCE}),
    ("BYOC-RANK-OUTPUT", {"host": "algo-2"}),
])
def test_a_word_with_a_field_that_is_not_what_it_must_be_is_refused_whole(word, fields):
    assert isinstance(parse_record(record_of(word, fields)), str)


def test_every_hosts_key_reaches_authorized_keys_and_known_hosts_one_line_each_bound_to_its_addresses(tmp_path):
    keys = parse_record(build_record(PeerKeys(1, 1, (("algo-1", ("10.0.0.1",), KEY),
                                                      ("algo-2", ("10.0.0.2", "fd00::2"), OTHER))), 1.0)).keys
    files = ssh.SshFiles(folder=str(tmp_path), key_folder=str(tmp_path))
    ssh.write_job_keys(files, keys, 2222, authorized={"algo-1"})
    assert open(files.authorized_keys).read() == f'from="10.0.0.1",restrict {KEY}\n'  # only the hosts that log in here
    assert open(files.known_hosts).read() == (f"[algo-1]:2222,[10.0.0.1]:2222 {KEY}\n"
                                              f"[algo-2]:2222,[10.0.0.2]:2222,[fd00::2]:2222 {OTHER}\n")
    ssh.write_job_keys(files, keys, 22, authorized={"algo-1", "algo-2"})
    assert open(files.known_hosts).read().splitlines()[1] == f"algo-2,10.0.0.2,fd00::2 {OTHER}"
    assert len(open(files.authorized_keys).read().splitlines()) == 2


def test_a_real_key_is_taken_and_ssh_keygen_reads_the_known_hosts_written_from_it(tmp_path):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")], check=True)
    key = " ".join((tmp_path / "k.pub").read_text().split()[:2])
    ready = parse_record(build_record(MpiReady("algo-3", key), 1.0))
    assert ready == MpiReady("algo-3", key)
    files = ssh.SshFiles(folder=str(tmp_path), key_folder=str(tmp_path))
    ssh.write_job_keys(files, [("algo-3", ("10.1.2.3",), key)], 22, authorized={"algo-3"})
    found = subprocess.run(["ssh-keygen", "-F", "10.1.2.3", "-f", files.known_hosts], capture_output=True, text=True)
    assert found.returncode == 0 and key in found.stdout


@pytest.mark.parametrize("hosts", [1, KEYS_PER_MESSAGE - 1, KEYS_PER_MESSAGE, KEYS_PER_MESSAGE + 1, 1024])
def test_the_keys_of_a_job_of_any_size_go_in_parts_each_within_the_port(hosts):
    keys = [(f"algo-{i}", (f"10.{i // 250}.{i % 250}.1", f"fd00::{i:x}"), KEY) for i in range(1, hosts + 1)]
    parts = build_key_parts(keys)
    assert len(parts) == -(-hosts // KEYS_PER_MESSAGE)
    assert [p.part for p in parts] == list(range(1, len(parts) + 1)) and {p.parts for p in parts} == {len(parts)}
    assert [k for p in parts for k in p.keys] == keys  # every host once, in order
    for part in parts:
        line = build_signed_line("ab" * 32, build_record(part, 1.0))
        assert len(line.encode()) <= MAX_MESSAGE_BYTES


@pytest.mark.parametrize("report", ["", "x" * 100, "x" * (MAX_MESSAGE_BYTES - 300), "x" * MAX_MESSAGE_BYTES,
                                    "\u00e9\udc80\x00" * 40000, "\U0001f600" * 70000])
def test_the_outcomes_report_is_cut_to_fit_the_port_and_still_reads_back(report):
    message = build_job_outcome(1, report)
    line = build_signed_line("ab" * 32, build_record(message, 1.0))
    assert len(line.encode()) <= MAX_MESSAGE_BYTES
    assert report.startswith(message.report)  # cut at the end only
    assert len(message.report) >= min(len(report), 4000)  # not cut to nothing
    assert parse_record(build_record(message, 1.0)) == message


def test_a_word_reaches_a_real_port_and_a_port_not_open_yet_is_tried_again_until_it_opens():
    import threading
    import time

    from entrypoint.loop import HostLoop
    from support.ports import free_port

    loop, port, key = HostLoop(), free_port(), "ab" * 32
    opened: list = []

    def open_later():
        time.sleep(0.3)  # the leader's port opens after the worker's first try
        opened.append(job_port.JobPort(port, loop.post, job_key=key))

    threading.Thread(target=open_later, daemon=True).start()
    try:
        assert job_port.deliver(loop, "127.0.0.1", port, key, MpiReady("algo-2", KEY), 30, until_open=True)
        got = []
        loop.on({MpiReady: got.append})
        loop.wait(lambda: bool(got), time.monotonic() + 30)
        assert got[0]._replace(sender="") == MpiReady("algo-2", KEY)
    finally:
        for p in opened:
            p.close()
    # Without until_open, a port nobody listens on ends the tries at once: its host has ended.
    assert not job_port.deliver(loop, "127.0.0.1", free_port(), key, MpiReady("algo-2", KEY), 30)

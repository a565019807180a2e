"""Secrets (values of environment variables named like *KEY, *TOKEN, *SECRET, *PASSWORD,
*CREDENTIAL, *SESSION) never reach output/failure, our logs or the dry-run plan: in every form
a value takes in text, and masked before anything cuts a line or a message to length."""

from __future__ import annotations

import io
import json
import os
import string
import subprocess
import tempfile
from types import SimpleNamespace
from unittest import mock
from urllib.parse import quote, quote_plus

from hypothesis import given, settings
from hypothesis import strategies as st

from entrypoint.run.supervise import TAIL_LINE_CHARS, TAIL_LINES, OutputCollector, _pump
from entrypoint.job.paths import build_paths
from entrypoint.outcome.failure import describe_failure, redact, secret_values
from entrypoint.outcome.records import Outcome, StepEnding
from entrypoint.outcome.writer import render_reason, write_outcome
from entrypoint.rank.record_errors import MESSAGE_LIMIT, MIN_SECRET_CHARS, load_root_cause, mask_secrets
from support.jobtree import PYTHON, entrypoint_env, failure_text, write_tree

SECRET = 'sk-live"9f\\3Kq/x+y&z=w é-token-0042'
PASSWORD = "Pw8!zQ_k"  # shorter than 12 characters: the line-break rule holds for it too


def _fragments(secret: str, size: int = MIN_SECRET_CHARS) -> set[str]:
    return {secret[i:i + size] for i in range(len(secret) - size + 1)}


def _leaks(text: str, secret: str = SECRET) -> set[str]:
    return {f for f in _fragments(secret) if f in text}


def test_every_form_of_a_secret_is_masked():
    forms = [SECRET, repr(SECRET), json.dumps(SECRET), json.dumps(SECRET, ensure_ascii=False), quote(SECRET, safe=""),
             quote_plus(SECRET)]  # fmt: skip
    text = "\n".join(f"value: {form} end" for form in forms)
    masked = redact(text, [SECRET])
    assert masked.count("****") == len(forms)
    for form in forms:
        assert form.strip("'\"") not in masked


def test_a_secret_broken_over_lines_is_masked():
    wrapped = f"token={SECRET[:15]}\n{SECRET[15:]} done"
    assert redact(wrapped, [SECRET]) == "token=**** done"


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=TAIL_LINE_CHARS - len(SECRET), max_value=TAIL_LINE_CHARS + 2))
def test_a_secret_cut_by_the_line_limit_is_masked_first(at):
    collector = OutputCollector([SECRET])
    collector.add_line(("x" * at + SECRET + " tail").encode())
    assert not _leaks(collector.tail[-1]), collector.tail[-1]


def test_a_secret_cut_by_the_ranks_message_limit_is_masked_first():
    message = "x" * (MESSAGE_LIMIT - 5) + SECRET
    masked = mask_secrets(message, {"MY_API_TOKEN": SECRET, "PATH": "/usr/bin:/bin"})
    assert not _leaks(masked[:MESSAGE_LIMIT])
    assert mask_secrets(message, {"PATH": SECRET}) == message  # only secret-looking names


def test_the_failure_file_holds_no_form_of_a_secret_end_to_end(tmp_path):
    script = (
        "import json, os, sys, urllib.parse\n"
        "s = os.environ['MY_API_TOKEN']\n"
        "print('repr', repr(s)); print('json', json.dumps(s)); print('url', urllib.parse.quote(s, safe=''))\n"
        "print('wrapped', s[:15]); print(s[15:])\n"
        "print('long', 'y' * 495 + s)\n"
        "print('cut and split', 'w' * 490 + s[:20]); print('      ' + s[20:])\n"
        "p = os.environ['DB_PASSWORD']; print('short', p[:2]); print('  ', p[2:])\n"
        "raise ValueError('x' * 1995 + s)\n"
    )
    root = write_tree(tmp_path, script=script)
    # A job name of its own: runtime folders are per job, and other runs of this test on the machine share none.
    env = entrypoint_env(root, MY_API_TOKEN=SECRET, DB_PASSWORD=PASSWORD, TRAINING_JOB_NAME=f"secrets-{os.getpid()}")
    done = subprocess.run([PYTHON, "-m", "entrypoint", "train"], env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 1
    report = failure_text(root)
    assert report.startswith("ValueError: xxxx") and "****" in report
    assert not _leaks(report) and not _leaks(report, PASSWORD), report
    ours = "\n".join(line for line in done.stderr.splitlines() if line.startswith("[entrypoint]"))
    assert not _leaks(ours) and not _leaks(ours, PASSWORD)


# Secrets drawn from characters that the text around them (the "." prefix, indentation, the
# report's own words, all lower case) and the mask ("*") never hold: any 6 characters of one
# in the output are a leak, not a coincidence.
SECRET_TEXT = st.text(alphabet=string.ascii_uppercase + string.digits + '"\\/+&=%-_é', min_size=MIN_SECRET_CHARS,
                      max_size=40)  # fmt: skip
FORMS = {"as written": lambda s: s, "repr": lambda s: repr(s)[1:-1], "json": lambda s: json.dumps(s)[1:-1],
         "url": lambda s: quote(s, safe="")}  # fmt: skip
INDENT = st.text(alphabet=" \t", max_size=40)


def _written(reason: str, environ: dict[str, str]) -> str:
    """output/failure as the real writer writes it (write_outcome: render_reason masks, once)."""
    with tempfile.TemporaryDirectory() as root:
        paths = build_paths({"SAGEMAKER_BASE_DIR": root})
        write_outcome(paths, Outcome(1, reason), secret_values(environ))
        with open(paths.failure_file, encoding="utf-8") as f:
            return f.read()


def _report(collector: OutputCollector, environ: dict[str, str]) -> str:
    return _written(describe_failure("python train.py", StepEnding(1), None, list(collector.tail), "algo-1"), environ)


def _no_fragment_of(text: str, *values: str) -> bool:
    return not any(_leaks(text, v) for v in values)


def _pumped(data: bytes, collector: OutputCollector) -> None:
    """data through a child's output pump, as the supervisor streams a pipe."""
    _pump(io.BufferedReader(io.BytesIO(data)), io.BytesIO(), collector)


@settings(max_examples=300, deadline=None)
@given(secret=SECRET_TEXT, form=st.sampled_from(sorted(FORMS)), split=st.floats(0, 1),
       prefix=st.integers(0, TAIL_LINE_CHARS + 40), indent=INDENT, crlf=st.booleans())  # fmt: skip
def test_a_secret_split_over_two_output_lines_leaves_no_fragment_in_the_failure_file(secret, form, split, prefix,
                                                                                    indent, crlf):
    """Wherever the break falls, however far into a line that is cut to TAIL_LINE_CHARS, with
    whatever indentation after it, and whatever the secret's length (6 characters and up)."""
    printed = FORMS[form](secret)
    at = 1 + int(split * (len(printed) - 2))  # between two of its characters
    newline = "\r\n" if crlf else "\n"
    data = f"start\n{'.' * prefix}{printed[:at]}{newline}{indent}{printed[at:]} end\nlast line\n".encode()
    environ = {"MY_API_TOKEN": secret, "PATH": "/usr/bin"}
    collector = OutputCollector(secret_values(environ))
    _pumped(data, collector)
    report = _report(collector, environ)
    assert _no_fragment_of(report, secret, printed), report
    assert all(_no_fragment_of(line, secret, printed) for line in collector.tail)
    assert "****" in report and report.rstrip().endswith("last line")


@settings(max_examples=100, deadline=None)
@given(secret=SECRET_TEXT, split=st.floats(0, 1), prefix=st.integers(0, TAIL_LINE_CHARS + 40), indent=INDENT,
       between=st.integers(0, TAIL_LINES + 5))  # fmt: skip
def test_a_split_secret_is_masked_in_its_own_stream_while_others_interleave(secret, split, prefix, indent, between):
    """The other streams' lines between the two halves (stdout and stderr, other ranks) even push
    the first half out of the tail: the second half is still masked, with its own stream's context."""
    at = 1 + int(split * (len(secret) - 2))
    collector = OutputCollector([secret])
    ours, theirs = collector.open_stream(), collector.open_stream()
    collector.add_line(("." * prefix + secret[:at]).encode(), ours)
    for i in range(between):
        collector.add_line(f"other stream line {i}".encode(), theirs)
    collector.add_line(f"{indent}{secret[at:]} end".encode(), ours)
    assert all(_no_fragment_of(line, secret) for line in collector.tail), list(collector.tail)
    assert collector.tail[-1].endswith("**** end")


@settings(max_examples=100, deadline=None)
@given(secret=SECRET_TEXT, cuts=st.lists(st.floats(0, 1), min_size=2, max_size=5), indent=INDENT)
def test_a_secret_wrapped_over_several_lines_is_masked_in_each(secret, cuts, indent):
    points = sorted({1 + int(c * (len(secret) - 2)) for c in cuts})
    pieces = [secret[a:b] for a, b in zip([0, *points], [*points, len(secret)])]
    text = f"{'.' * TAIL_LINE_CHARS}{pieces[0]}\n" + "".join(f"{indent}{p}\n" for p in pieces[1:])
    environ = {"DB_PASSWORD": secret}
    collector = OutputCollector(secret_values(environ))
    _pumped(text.encode(), collector)
    assert _no_fragment_of(_report(collector, environ), secret)
    assert all(_no_fragment_of(line, secret) for line in collector.tail)


def test_a_secret_across_the_forced_cut_of_a_very_long_line_is_masked():
    """A line longer than the pump's 64 KiB buffer is cut where a read ends (its end kept)."""
    environ = {"MY_API_TOKEN": SECRET}
    collector = OutputCollector(secret_values(environ))
    head = ("y" * (65536 * 2 - 20) + SECRET).encode()  # the secret across the first cut
    _pump(io.BufferedReader(io.BytesIO(head + b" and on\n"), buffer_size=65536), io.BytesIO(), collector)
    assert len(collector.tail) == 2 and collector.tail[0].endswith("y****") and collector.tail[1] == "**** and on"
    assert _no_fragment_of(_report(collector, environ), SECRET), list(collector.tail)


@settings(max_examples=200, deadline=None)
@given(secret=SECRET_TEXT, split=st.floats(0, 1), start=st.integers(-45, -1), indent=INDENT)
def test_a_split_secret_across_the_ranks_message_limit_is_masked_first(secret, split, start, indent):
    """The rank's own side (record_errors): its exception message, cut to MESSAGE_LIMIT, holds
    a secret broken over lines that starts before the cut, its break before or after it."""
    at = 1 + int(split * (len(secret) - 2))
    split_secret = secret[:at] + "\n" + indent + secret[at:]
    message = "." * (MESSAGE_LIMIT + start) + split_secret + " end"
    with mock.patch.dict(os.environ, {"MY_API_TOKEN": secret, "SM_CURRENT_HOST": "algo-1"}):
        record = load_root_cause("ValueError", message, where=f'  File "train.py", line 3\n    {split_secret}\n')
    assert _no_fragment_of(record["message"], secret), record["message"]
    assert "*" in record["message"]  # the mask, itself cut when it starts just before the limit
    assert _no_fragment_of(record["where"], secret)


def test_short_secrets_and_indented_breaks_are_masked_in_any_text():
    """The break in a secret of 6 to 11 characters, and one followed by indentation."""
    text = "password=Pw8!z\n    Q_k and key=ABCD\r\n\tEF and token=sk-live-0042-\n      abcdef"
    masked = redact(text, ["Pw8!zQ_k", "ABCDEF", "sk-live-0042-abcdef"])
    assert masked == "password=**** and key=**** and token=****"


def test_the_output_pumps_may_make_their_masks_at_the_same_moment():
    """Each pump makes its stream's mask in its own thread at its first line; the first of
    them imports the modules the secret forms need (urllib.parse) while the others wait, never
    taking a module still half imported (seen in the image under SDK local mode: the pumps
    died and output/failure said "No output")."""
    import subprocess
    import sys
    from pathlib import Path

    import entrypoint

    # Where this interpreter's entrypoint package is: the checkout, or the image's site-packages.
    package_root = Path(entrypoint.__file__).resolve().parents[1]
    probe = f"""
import sys, threading
sys.path.insert(0, {str(package_root)!r})
from entrypoint.run.supervise import OutputCollector
assert "urllib.parse" not in sys.modules
collector = OutputCollector(["AKIAFAKESECRETVALUE1234", "another-secret-token-987"])
errors, start = [], threading.Barrier(32)
def pump():
    start.wait()
    try:
        collector.add_line_text("the key is AKIAFAKESECRETVALUE1234", collector.open_stream())
    except BaseException as exc:
        errors.append(repr(exc))
threads = [threading.Thread(target=pump) for _ in range(32)]
[t.start() for t in threads]
[t.join() for t in threads]
print(errors or "ok", list(collector.tail)[:1])
"""
    for _ in range(10):  # a race: several fresh interpreters
        # -S: no site, so nothing has imported urllib.parse before the pumps (a dev venv's does)
        done = subprocess.run([sys.executable, "-I", "-S", "-c", probe], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("ok ['the key is ****"), done.stdout


def test_the_words_are_raw_and_the_writer_masks_them_in_the_file_and_the_log(capsys):
    """describe_* compose; write_outcome renders and redacts once, for output/failure and for its
    FAILED line in the log."""
    environ = {"MY_API_TOKEN": SECRET}
    reason = describe_failure(f"python train.py --api {SECRET}", StepEnding(1), None, [f"value {SECRET}"], "algo-1")
    assert SECRET in reason  # not masked where it is composed
    capsys.readouterr()
    written = _written(reason, environ)
    logged = capsys.readouterr().err
    assert "FAILED: python train.py --api **** failed" in logged and not _leaks(logged)
    assert written.startswith("python train.py --api **** failed") and not _leaks(written)


def test_a_bad_definitions_paragraph_is_masked_in_the_log_and_by_the_writer(capsys):
    from entrypoint import cli

    environ = {"DB_PASSWORD": PASSWORD}
    outcome = cli.build_bad_job(f"BYOC_GRACE_PERIOD_S is {PASSWORD}, not a number", environ)
    logged = capsys.readouterr().err
    assert "The training job definition is invalid: BYOC_GRACE_PERIOD_S is ****" in logged
    assert not _leaks(logged, PASSWORD) and outcome.logged
    assert not _leaks(_written(outcome.reason, environ), PASSWORD)


def test_the_one_rendering_masks_then_makes_readable():
    """render_reason: what an MPI leader tells its workers on the job port goes through it too."""
    assert render_reason(f"key {SECRET[:15]}\n  {SECRET[15:]} \udc80 \x1b[0m", [SECRET]) == "key **** \\x80 \\x1b[0m"
    assert render_reason(None, [SECRET]) is None and render_reason("", [SECRET]) == ""


def test_an_mpi_leader_tells_its_workers_the_reason_masked(tmp_path, monkeypatch):
    """The leader's word to its workers (JOB-OUTCOME) goes through render_reason: never the raw reason."""
    from entrypoint.roles import mpi
    from entrypoint.orchestrate import build_host
    from entrypoint.run.stop import Stop
    from support.jobs import make_job, plan_for

    environ = {"MY_API_TOKEN": SECRET}
    plan = plan_for(make_job(hosts=("algo-1", "algo-2"), hps={"sagemaker_mpi_enabled": True}, environ=environ))
    env = {**environ, **plan.env_dict}
    host = build_host(plan, build_paths({"SAGEMAKER_BASE_DIR": str(tmp_path)}), env, Stop())
    told = []
    monkeypatch.setattr(mpi.MpiLeader, "tell_workers", lambda _role, _host, code, report: told.append((code, report)))
    host.resolved = True  # its workers' names resolved: they wait for its word
    host.role.peers.port = SimpleNamespace(close=lambda: None)  # its job port is open (tell_workers is the test's)
    host.role.close(host, Outcome(1, f"RuntimeError: {SECRET}\n"))
    assert told == [(1, "RuntimeError: ****\n")]

"""Secrets (values of environment variables named like *KEY, *TOKEN, *SECRET, *PASSWORD,
*CREDENTIAL, *SESSION) never reach output/failure, our logs or the dry-run plan: in every form
a value takes in text, and masked before anything cuts a line or a message to length."""

from __future__ import annotations

import json
import subprocess
from urllib.parse import quote, quote_plus

from hypothesis import given, settings
from hypothesis import strategies as st

from entrypoint.supervise import TAIL_LINE_CHARS, OutputCollector
from entrypoint.failure import redact
from entrypoint.rank.record_errors import MESSAGE_LIMIT, mask_secrets
from support.jobtree import PYTHON, entrypoint_env, failure_text, write_tree

SECRET = 'sk-live"9f\\3Kq/x+y&z=w é-token-0042'


def _fragments(secret: str, size: int = 8) -> set[str]:
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
        "raise ValueError('x' * 1995 + s)\n"
    )
    root = write_tree(tmp_path, script=script)
    done = subprocess.run([PYTHON, "-m", "entrypoint", "train"], env=entrypoint_env(root, MY_API_TOKEN=SECRET),
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1
    report = failure_text(root)
    assert report.startswith("ValueError: xxxx") and "****" in report
    assert not _leaks(report), _leaks(report)
    ours = "\n".join(line for line in done.stderr.splitlines() if line.startswith("[entrypoint]"))
    assert not _leaks(ours)

"""The edges of what a user can hand us: every depth, every string, every byte.

A bad job definition or a failing script always ends in a readable reason in output/failure,
never a traceback or an empty file: tested just under, at and over each limit, and with any
`str` (lone surrogates, control characters, very long lines) through the real writers.
"""

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from entrypoint.job.config import decode_hyperparameter, parse_json_document
from entrypoint.job.json_text import (JSON_DEPTH_LIMIT, JsonTooDeep, build_json, canonical_json, decode_json,
                                      measure_json_depth)
from entrypoint.errors import EXIT_BAD_JOB, JobDefinitionError
from entrypoint.rank.record_errors import build_readable_text
from support.jobtree import PYTHON, entrypoint_env, failure_text, run_entrypoint, write_tree

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

# Control characters a reader must see escaped (Unicode's category Cc but newline and tab).
UNREADABLE = [chr(c) for c in (*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0))]


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def write_raw_hyperparameter(root, name: str, raw: str) -> None:
    """One hyperparameter as SageMaker writes it: the JSON text as the value's string."""
    path = root / "input/config/hyperparameters.json"
    hps = json.loads(path.read_text())
    hps[name] = raw
    path.write_text(json.dumps(hps))


def assert_readable(text: str) -> None:
    assert not any(c in text for c in UNREADABLE), repr(text[:300])
    assert not any(0xD800 <= ord(c) <= 0xDFFF for c in text), repr(text[:300])
    text.encode("utf-8")  # what output/failure and the log are written as


# --- depth: JSON values from the job definition ------------------------------------------------

# Where Python's own recursion limit bit the old code: two frames a level in thaw (500), one in
# json (about 990 at the entrypoint's stack), and SageMaker's own ceiling (JSON_DEPTH_LIMIT).
@pytest.mark.parametrize("depth", [1, 499, 500, 501, 600, 989, 990, 991, JSON_DEPTH_LIMIT - 1, JSON_DEPTH_LIMIT])
def test_a_value_up_to_the_depth_limit_decodes_and_encodes_every_way_we_write_it(depth):
    value = decode_hyperparameter(nested(depth))
    assert measure_json_depth(value) == depth
    assert canonical_json(value) == nested(depth)
    assert build_json({"training_env": {"hyperparameters": {"x": value}}}, indent=2).count("[") == depth
    assert build_json({"x": value}, separators=(",", ":"), ensure_ascii=False) == '{"x":' + nested(depth) + "}"


@pytest.mark.parametrize("depth", [JSON_DEPTH_LIMIT + 1, 5_000, 100_000])
def test_a_value_deeper_than_the_limit_stays_its_raw_text(depth):
    assert decode_hyperparameter(nested(depth)) == nested(depth)  # the toolkit's rule for what is not JSON
    with pytest.raises(JsonTooDeep, match=f"more than {JSON_DEPTH_LIMIT} levels"):
        decode_json(nested(depth))


def test_the_depth_is_measured_by_a_loop_at_any_depth():
    value: list = []
    for _ in range(200_000):  # far past any recursion limit
        value = [value]
    assert measure_json_depth(value) == 200_001
    assert measure_json_depth({"a": [1, {"b": []}], "c": 2}) == 4 and measure_json_depth("x") == 0


def test_the_limit_holds_whatever_the_stack_above_it():
    def at_depth(frames: int):
        return at_depth(frames - 1) if frames else decode_hyperparameter(nested(JSON_DEPTH_LIMIT))

    assert measure_json_depth(at_depth(sys.getrecursionlimit() - 100)) == JSON_DEPTH_LIMIT
    limit = sys.getrecursionlimit()
    decode_json(nested(10))
    assert sys.getrecursionlimit() == limit  # the room is given back


@pytest.mark.parametrize("depth", [JSON_DEPTH_LIMIT, JSON_DEPTH_LIMIT + 1])
def test_a_configuration_file_at_and_over_the_depth_limit(depth):
    doc = '{"a": ' + nested(depth - 1) + "}"
    if depth <= JSON_DEPTH_LIMIT:
        assert measure_json_depth(parse_json_document(doc, "hyperparameters.json")) == depth
    else:
        with pytest.raises(JobDefinitionError, match=f"nested too deeply.*more than {JSON_DEPTH_LIMIT} levels"):
            parse_json_document(doc, "hyperparameters.json")


@pytest.mark.parametrize("depth", [600, JSON_DEPTH_LIMIT, JSON_DEPTH_LIMIT + 1])
def test_a_deeply_nested_hyperparameter_runs_the_job_as_the_toolkit_does(tmp_path, depth):
    """600 levels (1,200 characters, within SageMaker's 2,500) crashed the entrypoint with a
    RecursionError and wrote no output/failure."""
    root = write_tree(tmp_path, script=(
        "import os, sys\nprint('got', len(sys.argv[sys.argv.index('--deep') + 1]), len(os.environ['SM_HP_DEEP']))\n"))
    write_raw_hyperparameter(root, "deep", nested(depth))
    done = run_entrypoint(root)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"got {2 * depth} {2 * depth}" in done.stdout
    assert "Traceback" not in done.stderr
    dry = run_entrypoint(root, "--dry-run")
    assert dry.returncode == 0 and nested(depth) in "".join(json.loads(dry.stdout)["processes"][0]["argv"])


# --- text: one policy for everything we write ---------------------------------------------------

def test_the_text_policy_escapes_what_a_reader_cannot_take_and_keeps_the_rest():
    assert build_readable_text("plain, é, 漢字, 🙂\n\tnext") == "plain, é, 漢字, 🙂\n\tnext"
    assert build_readable_text("a\x00b\x1b[31mred\x7f\r") == "a\\x00b\\x1b[31mred\\x7f\\x0d"
    assert build_readable_text("caf\udce9.csv") == "caf\\xe9.csv"  # a non-UTF-8 byte, as surrogateescape read it
    assert build_readable_text("half \ud800 pair") == "half \\ud800 pair"
    assert build_readable_text("\x85\x9f") == "\\x85\\x9f"


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec=None, categories=None), max_size=400))
def test_any_text_comes_out_readable_and_printable_text_unchanged(text):
    out = build_readable_text(text)
    assert_readable(out.replace("\n", "").replace("\t", ""))
    fine = [c for c in text if c not in UNREADABLE and not 0xD800 <= ord(c) <= 0xDFFF]
    if len(fine) == len(text):
        assert out == text  # nothing to escape: not a character changed
    else:
        assert len(out) > len(text) and out.count("\\") >= len(text) - len(fine)  # one escape each


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=st.characters(codec=None, categories=None), min_size=1, max_size=3000),
       st.sampled_from([0, 1, 2]))
def test_any_text_through_the_real_writers_arrives_readable(tmp_path_factory, text, exit_code):
    """output/failure (outcome.write_outcome), the log (log.log) and train/'s own failure file."""
    from entrypoint.log import log
    from entrypoint.outcome.records import Outcome
    from entrypoint.outcome.writer import write_outcome
    from entrypoint.job.paths import build_paths
    from train.script import write_failure as train_write_failure

    root = tmp_path_factory.mktemp("ml")
    paths = build_paths({"SAGEMAKER_BASE_DIR": str(root)})
    write_outcome(paths, Outcome(exit_code, text), ())
    if exit_code:
        written = (root / "output/failure").read_bytes().decode("utf-8")
        assert written == build_readable_text(text)
        assert_readable(written.replace("\n", "").replace("\t", ""))
        os.remove(root / "output/failure")
    else:
        assert (root / "output/success").exists()
    train_write_failure({"SAGEMAKER_BASE_DIR": str(root)}, text)
    written = (root / "output/failure").read_bytes().decode("utf-8")
    assert written == build_readable_text(text)[:1024]
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")  # stricter than sys.stderr
    saved, sys.stderr = sys.stderr, err
    try:
        log(text)
    finally:
        sys.stderr = saved
    err.seek(0)
    assert err.read() == f"[entrypoint] {build_readable_text(text)}\n"


@settings(max_examples=40, deadline=None)
@given(st.text(alphabet=st.characters(codec=None, categories=None), max_size=2500))
def test_any_exception_text_through_the_job_port_arrives_readable(message):
    """A rank's report (record_errors' wire form) parsed by the leader and written as its report."""
    from entrypoint.hosts.job_port import parse_root_cause_line
    from entrypoint.outcome.failure import describe_failure
    from entrypoint.outcome.records import StepEnding
    from entrypoint.rank.record_errors import MARKER

    record = {"host": "algo-2", "rank": "1", "type": "ValueError", "message": message, "time": 1.0, "where": ""}
    cause = parse_root_cause_line(MARKER + json.dumps(record, ensure_ascii=True))
    assert cause is not None and cause.message == message
    report = describe_failure("torchrun on 2 hosts", StepEnding(1), cause, [], "algo-1")
    assert_readable(build_readable_text(report).replace("\n", "").replace("\t", ""))


NON_UTF8_SCRIPT = """\
import os
channel = os.environ["SM_CHANNEL_TRAIN"]
name = os.listdir(channel)[0]  # b'caf\\xe9.csv': a lone surrogate in Python
raise FileNotFoundError(f"cannot parse {name}: \\x00 and \\x1b[31mred\\x1b[0m")
"""


def test_an_exception_naming_a_file_that_is_not_utf8_leads_output_failure(tmp_path):
    """The failure file was left empty: write_outcome raised UnicodeEncodeError on the surrogate."""
    root = write_tree(tmp_path, script=NON_UTF8_SCRIPT, channel_files={"train": {}})
    os.close(os.open(os.path.join(str(root / "input/data/train").encode(), b"caf\xe9.csv"), os.O_CREAT | os.O_WRONLY))
    done = run_entrypoint(root)
    assert done.returncode == 1
    report = (root / "output/failure").read_bytes().decode("utf-8")
    assert report.startswith("FileNotFoundError: cannot parse caf\\xe9.csv: \\x00 and \\x1b[31mred\\x1b[0m\n"), report[:400]
    assert "First failure: rank 0 on host algo-1" in report
    assert_readable(report.replace("\n", "").replace("\t", ""))
    assert "Traceback" not in done.stderr.split("[entrypoint]")[-1]  # the entrypoint's own lines: no traceback of ours
    assert "UnicodeEncodeError" not in done.stderr


@pytest.mark.parametrize("where", ["hyperparameter", "hyperparameter-in-a-list"])
def test_a_lone_surrogate_in_a_hyperparameter_is_refused_naming_it(tmp_path, where):
    root = write_tree(tmp_path, script="print('must not run')\n")
    write_raw_hyperparameter(root, "text", '"a\\ud800b"' if where == "hyperparameter" else '["a\\ud800b"]')
    done = run_entrypoint(root)
    assert done.returncode == EXIT_BAD_JOB, done.stderr[-2000:]
    report = failure_text(root)
    assert ("a lone surrogate (U+D800, half of a UTF-16 pair with no other half) in argument 4 (the value of "
            "--text)") in report
    # As a string it reaches SM_HP_TEXT as it is; in a list, the SM_* variables hold it as ASCII JSON (\ud800).
    assert ("environment variable SM_HP_TEXT" in report) == (where == "hyperparameter")
    assert "codec can't encode" not in report and "Traceback" not in done.stderr
    assert "must not run" not in done.stdout


def test_a_name_that_is_not_utf8_is_not_called_a_lone_surrogate():
    from entrypoint.outcome.launch_errors import describe_launch_error

    error = UnicodeEncodeError("utf-8", "x\ud800", 1, 2, "surrogates not allowed")
    text = describe_launch_error(["python", "caf\udce9.py", "x\ud800"], {"A": "caf\udce9", "B": "\ud800"}, error)
    assert "in argument 2, environment variable B," in text


# --- no room: a full disk is not a bad job definition -------------------------------------------

def _can_mount_tmpfs() -> bool:
    return (os.geteuid() == 0 and shutil.which("unshare") is not None
            and subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode == 0)


def _archive(path, size: int, files: int) -> int:
    """train.py and `files` files of `size` bytes each; returns the bytes it holds."""
    with tarfile.open(path, "w:gz") as tar:
        members = [("train.py", b"print('must not run')\n")] + [(f"data/{i}.bin", b"\0" * size) for i in range(files)]
        for name, body in members:
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    return sum(len(body) for _, body in members)


# 1 MiB of room: one big file that fits, one that does not (found before unpacking), and 400
# small ones whose bytes fit but whose blocks do not (the disk fills while unpacking).
@pytest.mark.parametrize("size, files, outcome", [(200 * 1024, 1, "fits"), (1024 * 1024 - 4096 * 4, 1, "fits"),
                                                  (2048 * 1024, 1, "found before unpacking"),
                                                  (100, 400, "No space left on device)")])
def test_a_source_archive_larger_than_the_code_folders_room_says_the_disk_is_full(tmp_path, size, files, outcome):
    """It said "The training job definition is invalid: ... [Errno 28] No space left on device"."""
    if not _can_mount_tmpfs():
        pytest.skip("needs root and unshare(1) allowed (not in an unprivileged container): /opt/ml/code is "
                    "a small tmpfs in a private mount namespace")
    archive = tmp_path / "sourcedir.tar.gz"
    needed = _archive(archive, size, files)
    root = write_tree(tmp_path / "ml", hyperparameters={"sagemaker_submit_directory": str(archive)})
    shutil.rmtree(root / "code")
    (root / "code").mkdir()
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
         'mount -t tmpfs -o size=1m tmpfs "$CODE" && exec "$0" -m entrypoint train', PYTHON],
        env={**entrypoint_env(root), "CODE": str(root / "code")}, capture_output=True, text=True, timeout=120)
    if outcome == "fits":
        assert done.returncode == 0 and "must not run" in done.stdout, done.stderr[-2000:]
        return
    assert done.returncode == EXIT_BAD_JOB, done.stderr[-2000:]
    report = failure_text(root)
    assert "invalid" not in report, report
    assert report.startswith(f"The training never started: no room to unpack sagemaker_submit_directory {archive} "
                             f"into {root / 'code'}: it holds {needed:,} bytes, and that disk had "), report
    assert "bytes free (of 1,048,576)" in report and outcome in report
    assert "Traceback" not in done.stderr and "must not run" not in done.stdout

"""Per-job runtime folders (entrypoint/run/runtime_dirs.py): one per job, the same name on every
host, created exclusively with mode 0700, removed on every way out; a live job's folder is
never shared or taken, a killed one's is."""

from __future__ import annotations

import ast
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from support.jobtree import PYTHON, REPO, entrypoint_env, run_entrypoint, write_tree  # noqa: E402

from entrypoint.run import runtime_dirs  # noqa: E402
from entrypoint.run.runtime_dirs import Owner, RuntimeDirError, decide_job_id, decide_takeover, start_job_folder  # noqa: E402


def test_the_job_id_is_the_same_on_every_host_and_differs_between_jobs():
    hosts = ("algo-1", "algo-2")
    one = decide_job_id("job-a", hosts, '{"lr": 0.1}')
    assert len(one) == 16 and int(one, 16) >= 0
    assert decide_job_id("job-a", hosts, '{"lr": 0.1}') == one
    assert len({one, decide_job_id("job-b", hosts, '{"lr": 0.1}'), decide_job_id("job-a", ("algo-1",), '{"lr": 0.1}'),
                decide_job_id("job-a", hosts, '{"lr": 0.2}')}) == 4


@pytest.mark.parametrize("owner, alive, taken", [
    (Owner(123, "here"), False, True),  # killed on this host: take it over
    (Owner(123, "here"), True, False),  # still running
    (Owner(123, "elsewhere"), False, False),  # another container sharing the folder: cannot tell
    (None, False, False),  # not ours
])
def test_when_a_folder_left_there_may_be_taken_over(owner, alive, taken):
    assert (decide_takeover(owner, "here", alive) is None) == taken


def test_a_job_folder_is_made_exclusively_with_mode_0700_and_removed_only_by_its_maker(tmp_path):
    folder = tmp_path / "run" / "job-1"
    start_job_folder(str(folder))
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert (folder / "owner").read_text() == f"{os.getpid()} {socket.gethostname()}\n"
    with pytest.raises(RuntimeDirError, match=rf"{folder} already exists and the entrypoint that made it \(pid {os.getpid()}\) is still running"):
        start_job_folder(str(folder))
    (folder / "owner").write_text(f"1 {socket.gethostname()}-other\n")
    runtime_dirs.remove_job_folder(str(folder))  # not this process's: left alone
    assert folder.exists()
    (folder / "owner").write_text(f"{os.getpid()} {socket.gethostname()}\n")
    runtime_dirs.remove_job_folder(str(folder))
    assert not folder.exists()


def test_a_folder_left_by_a_killed_entrypoint_is_taken_over(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    folder = tmp_path / "job-1"
    folder.mkdir(mode=0o755)
    (folder / "owner").write_text(f"{dead.pid} {socket.gethostname()}\n")
    (folder / "job-exit-code").write_text("0")  # a stale outcome must not reach the new job
    start_job_folder(str(folder))
    assert sorted(os.listdir(folder)) == ["owner"] and stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_a_link_or_a_folder_someone_else_prepared_is_never_used(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "job-1").symlink_to(target)
    with pytest.raises(RuntimeDirError, match="is not a folder of this user's"):
        start_job_folder(str(tmp_path / "run" / "job-1"))
    assert os.listdir(target) == []  # nothing written through the link
    (tmp_path / "linked-run").symlink_to(target)
    with pytest.raises(RuntimeDirError, match="linked-run is not a folder of this user's"):
        start_job_folder(str(tmp_path / "linked-run" / "job-1"))
    (tmp_path / "run" / "job-2").mkdir()  # made by someone, no owner file
    with pytest.raises(RuntimeDirError, match="no readable owner file"):
        start_job_folder(str(tmp_path / "run" / "job-2"))


LISTS_ITS_FOLDER = """\
import os, stat, sys
base = os.environ["BYOC_RUNTIME_DIR"]
for name in os.listdir(base):
    print("FOLDER", name, oct(stat.S_IMODE(os.stat(os.path.join(base, name)).st_mode)))
if os.environ.get("FAIL"):
    raise SystemExit(3)
"""


@pytest.mark.parametrize("fail", ["", "1"])
def test_a_job_runs_in_its_own_folder_which_is_gone_when_it_ends(tmp_path, fail):
    run_dir = tmp_path / "run"
    root = write_tree(tmp_path / "ml", script=LISTS_ITS_FOLDER)
    done = run_entrypoint(root, BYOC_RUNTIME_DIR=str(run_dir), FAIL=fail)
    assert done.returncode == (3 if fail else 0), done.stderr
    folders = [line.split()[1:] for line in done.stdout.splitlines() if line.startswith("FOLDER")]
    assert len(folders) == 1 and folders[0][0].startswith("job-") and folders[0][1] == "0o700", done.stdout
    assert os.listdir(run_dir) == []


def test_two_entrypoints_of_the_same_one_host_job_each_have_their_own_folder(tmp_path):
    """Issue 33: two runs of one definition (the same TRAINING_JOB_NAME) on one machine collided
    on the job's folder, and the second failed: a 1-host job's folder is its entrypoint's own."""
    run_dir = tmp_path / "run"
    waits = ("import os, time\nprint('FOLDER', os.listdir(os.environ['BYOC_RUNTIME_DIR']), flush=True)\n"
             "while not os.path.exists(os.environ['GO']): time.sleep(0.05)\n")
    first_root, second_root = (write_tree(tmp_path / name, script=waits) for name in ("first", "second"))
    go = tmp_path / "go"
    env = entrypoint_env(first_root, BYOC_RUNTIME_DIR=str(run_dir), GO=str(go), TRAINING_JOB_NAME="same-job")
    first = subprocess.Popen([PYTHON, "-m", "entrypoint", "train"], env=env, cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert first.stdout.readline().startswith("FOLDER")  # the first one runs, its folder made
        second = subprocess.Popen([PYTHON, "-m", "entrypoint", "train"], cwd=REPO, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True,
                                  env=entrypoint_env(second_root, BYOC_RUNTIME_DIR=str(run_dir), GO=str(go),
                                                     TRAINING_JOB_NAME="same-job"))
        seen = second.stdout.readline()
        assert len(ast.literal_eval(seen[len("FOLDER "):])) == 2, seen  # both folders, side by side
    finally:
        go.touch()
        first.communicate(timeout=60)
        out, err = second.communicate(timeout=60)
    assert (first.returncode, second.returncode) == (0, 0), err
    assert os.listdir(run_dir) == []


def test_a_multi_host_jobs_folder_is_the_same_path_on_every_host():
    hosts = ("algo-1", "algo-2")
    assert decide_job_id("job", hosts, "{}") == decide_job_id("job", hosts, "{}")
    assert decide_job_id("job", ("algo-1",), "{}", "101") != decide_job_id("job", ("algo-1",), "{}", "102")


WAITS_TO_BE_STOPPED = """\
import os, signal, sys, time
base = os.environ["BYOC_RUNTIME_DIR"]
[name] = os.listdir(base)
private = "/dev/shm/byoc-" + name  # the job's memory-backed folder, when it has one
if os.environ.get("IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(os.environ["READY"] + ".tmp", "w") as f:
    f.write(os.path.join(base, name) + "\\n" + (private if os.path.isdir(private) else "") + "\\n")
os.rename(os.environ["READY"] + ".tmp", os.environ["READY"])
time.sleep(600)
"""


@pytest.mark.parametrize("ignores_term", [False, True], ids=["rank-stops", "rank-killed-after-grace"])
def test_the_job_folders_are_gone_after_a_stop(tmp_path, ignores_term):
    """SIGTERM to the entrypoint mid-run (SageMaker's StopTrainingJob, docker stop): the rank is
    stopped (or killed at the end of the grace period) and the job's runtime folders, on disk
    and in /dev/shm, are removed before the entrypoint exits."""
    import signal

    run_dir = tmp_path / "run"
    ready = tmp_path / "ready"
    root = write_tree(tmp_path / "ml", script=WAITS_TO_BE_STOPPED)
    env = entrypoint_env(root, BYOC_RUNTIME_DIR=str(run_dir), READY=str(ready), BYOC_GRACE_PERIOD_S="2",
                         IGNORE_TERM="1" if ignores_term else "")
    entrypoint = subprocess.Popen([PYTHON, "-m", "entrypoint", "train"], env=env, cwd=REPO, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and entrypoint.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), entrypoint.communicate(timeout=5) if entrypoint.poll() is not None else "not ready"
        folder, private = ready.read_text().split("\n")[:2]
        assert os.path.isdir(folder) and (private == "" or os.path.isdir(private))
        entrypoint.send_signal(signal.SIGTERM)
        out, err = entrypoint.communicate(timeout=60)
    finally:
        if entrypoint.poll() is None:
            entrypoint.kill()
            entrypoint.communicate()
    # The rank's own end is the job's exit code: stopped by SIGTERM, or killed by our SIGKILL.
    assert entrypoint.returncode == 128 + (signal.SIGKILL if ignores_term else signal.SIGTERM), err[-2000:]
    assert not os.path.exists(folder) and os.listdir(run_dir) == []
    assert private == "" or not os.path.exists(private)
    assert (root / "output/failure").exists()  # the stop has its reason


def test_the_built_in_sha256_is_hashlibs():
    """Job ids and job keys must be the same on every host, whichever SHA-256 each finds."""
    import hashlib

    from entrypoint.decide.specs import build_sha256_hex

    for data in (b"", b"byoc-job-id-v1\0[\"job\", [\"algo-1\"], \"{}\"]", bytes(range(256)) * 50):
        assert build_sha256_hex(data) == hashlib.sha256(data).hexdigest()


def test_removing_a_job_folder_removes_links_and_never_follows_them(tmp_path):
    from entrypoint.run.runtime_dirs import remove_tree

    outside = tmp_path / "outside"
    (outside / "keep").mkdir(parents=True)
    (outside / "keep" / "file").write_text("not the job's")
    job = tmp_path / "job"
    (job / "ssh" / "deeper").mkdir(parents=True)
    (job / "ssh" / "deeper" / "key").write_text("k")
    (job / "owner").write_text("1 host")
    os.symlink(outside / "keep", job / "ssh" / "link-to-a-folder")
    os.symlink(outside / "keep" / "file", job / "link-to-a-file")
    remove_tree(str(job))
    assert not job.exists()
    assert (outside / "keep" / "file").read_text() == "not the job's"


def test_a_job_folder_that_is_a_link_is_removed_not_its_target(tmp_path):
    from entrypoint.run.runtime_dirs import remove_tree

    target = tmp_path / "somewhere-else"
    target.mkdir()
    (target / "file").write_text("kept")
    os.symlink(target, tmp_path / "job")
    remove_tree(str(tmp_path / "job"))
    assert not os.path.lexists(tmp_path / "job") and (target / "file").read_text() == "kept"


def test_a_sigterm_at_each_step_of_making_the_job_folders_leaves_none_behind(tmp_path):
    """Issue 43, case 5: a stop between making a job folder and writing its owner file left
    `$BYOC_RUNTIME_DIR/job-*` and `/dev/shm/byoc-*-job-*` for good (the remover refuses a folder
    without an owner). SIGTERM at each step of making them (tests/support/stop_at.py), through
    the real entrypoint: a start-up stop, and nothing left, in either place, under any name."""
    from entrypoint.run.runtime_dirs import decide_private_name

    stop_at = str(REPO / "tests" / "support" / "stop_at.py")
    window = {"STOP_AT_FROM": "entrypoint.cli:start_job_folders", "STOP_AT_TO": ""}

    def run(step: int, name: str):
        run_dir = tmp_path / name / "run"
        root = write_tree(tmp_path / name / "ml", script="print('trained')\n")
        env = entrypoint_env(root, BYOC_RUNTIME_DIR=str(run_dir), STOP_AT_STEP=str(step),
                             STOP_AT_NOTE=str(tmp_path / name / "note"), **window)
        done = subprocess.run([PYTHON, stop_at], env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
        # The memory-backed folder's name: decide_private_name's, without the job id.
        private_prefix = decide_private_name(str(run_dir), "")
        private = [n for n in os.listdir("/dev/shm") if private_prefix in n] if os.path.isdir("/dev/shm") else []
        left = (os.listdir(run_dir) if run_dir.exists() else []) + private
        return done, root, left, (tmp_path / name / "note").read_text().strip()

    done, root, left, note = run(0, "count")
    assert done.returncode == 0 and left == [], (note, left, done.stderr[-2000:])
    steps = int(note.split()[1])
    assert steps >= 10, note
    for step in range(1, steps + 1):
        done, root, left, note = run(step, f"step-{step}")
        context = f"stop at step {step}, {note}: exit {done.returncode}, left {left}\n{done.stderr[-2000:]}"
        assert done.returncode == 143 and left == [], context
        assert (root / "output/failure").read_text().startswith("Stopped by SIGTERM during start-up"), context

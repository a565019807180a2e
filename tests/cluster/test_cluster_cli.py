"""`python -m localcluster run` as users run it (real hosts, root needed)."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from localcluster import registry
from support.public import copy_package_for_everyone

PYTHON = sys.executable
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="emulated hosts need root (namespaces, veths, mounts)")


def localcluster(*args, timeout=60):
    return subprocess.run(
        [PYTHON, "-m", "localcluster", *args], capture_output=True, text=True, timeout=timeout
    )


def test_run_streams_prefixed_output_and_reports_every_host(tmp_path):
    (tmp_path / "hp.json").write_text('{"epochs": 1, "name": "x"}')
    done = localcluster(
        "run", "--hosts", "3", "--hp", "epochs=5", "--hyperparameters-json", str(tmp_path / "hp.json"),
        "--", "sh", "-c", "echo on $(hostname); cat /opt/ml/input/config/hyperparameters.json | tr -d ' \\n'; echo",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    for host in ("algo-1", "algo-2", "algo-3"):
        assert f"[{host}] on {host}" in lines
        hps = next(json.loads(line.split("] ", 1)[1]) for line in lines if line.startswith(f"[{host}] {{"))
        assert (hps["epochs"], hps["name"]) == ("5", '"x"')
        assert re.search(rf"^  {host}  exit 0  \(\d+\.\d s\)$", done.stdout, re.M)
    assert lines[0].startswith("localcluster: cluster ") and "algo-3=10." in lines[0]
    assert lines[-2:] == ["localcluster: all 3 hosts succeeded", "localcluster: torn down"]


def test_a_failing_host_fails_the_run_and_shows_why():
    script = (
        'if [ "$(hostname)" = algo-2 ]; then echo "ValueError: bad lr" > /opt/ml/output/failure; '
        'echo Traceback; exit 3; fi; trap "exit 9" TERM; sleep 60 & wait'
    )
    done = localcluster("run", "--hosts", "2", "--", "sh", "-c", script)
    assert done.returncode == 1  # algo-1 ended by the stop (its TERM trap: exit 9), not its minute of sleep
    out = done.stdout
    assert "localcluster: stopped the hosts still running: algo-2 failed" in out
    assert "  algo-1  exit 9" in out and "  algo-2  exit 3" in out
    assert "--- algo-2: /opt/ml/output/failure\nValueError: bad lr\n" in out
    assert "--- algo-2: last 1 lines of output\nTraceback\n" in out
    assert out.rstrip().endswith("localcluster: 2 of 2 hosts failed\nlocalcluster: torn down")


def test_bad_input_is_reported_before_anything_starts(tmp_path):
    done = localcluster("run", "--hosts", "2", "--code", str(tmp_path / "missing"), "--", "true")
    assert done.returncode == 2
    assert done.stderr.strip() == f"localcluster: error: code_dir: {tmp_path / 'missing'} is not a folder"
    done = localcluster("run", "--distribution", "torch_distributed", "--processes-per-host", "2", "--", "true")
    assert done.returncode == 2 and "only means something with --distribution mpi" in done.stderr
    done = localcluster("run", "--code", str(tmp_path), "--program", "train.py", "--", "true")
    assert done.returncode == 2 and f"program 'train.py' is not in the code folder {tmp_path}" in done.stderr
    assert done.stdout == ""  # nothing was started


def test_sigint_stops_the_job_and_tears_everything_down(footprint, assert_no_leftovers):
    run = subprocess.Popen(
        [PYTHON, "-m", "localcluster", "run", "--hosts", "2", "--stop-timeout", "5",
         "--", "sh", "-c", 'trap "echo got TERM; exit 7" TERM; echo started; sleep 60 & wait'],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        first = run.stdout.readline()
        cluster_id = re.match(r"localcluster: cluster ([0-9a-f]{6}) up", first).group(1)
        seen = [run.stdout.readline() for _ in range(3)]  # both "started" and the command line
        assert sum("] started" in line for line in seen) == 2, seen
        fp = footprint(cluster_id)
        run.send_signal(signal.SIGINT)
        rest = run.communicate(timeout=30)[0]
    finally:
        run.kill()
    assert run.returncode == 130
    assert "localcluster: SIGINT: stopping the job" in rest
    assert "[algo-1] got TERM" in rest and "[algo-2] got TERM" in rest
    assert "stopped the hosts still running: interrupted by SIGINT" in rest
    assert rest.rstrip().endswith("localcluster: torn down")
    assert_no_leftovers(fp)


def test_sigterm_is_handled_like_sigint(footprint, assert_no_leftovers):
    run = subprocess.Popen(
        [PYTHON, "-m", "localcluster", "run", "--hosts", "2", "--", "sleep", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        cluster_id = re.match(r"localcluster: cluster ([0-9a-f]{6}) up", run.stdout.readline()).group(1)
        fp = footprint(cluster_id)
        assert run.stdout.readline().startswith("localcluster: started on every host")
        run.send_signal(signal.SIGTERM)
        rest = run.communicate(timeout=30)[0]
    finally:
        run.kill()
    assert run.returncode == 143, rest
    assert "killed by SIGTERM" in rest
    assert_no_leftovers(fp)


def test_list_and_cleanup_when_nothing_is_stale():
    done = localcluster("cleanup")
    assert done.returncode == 0 and done.stdout.startswith("localcluster: removed ")
    assert localcluster("list").returncode == 0
    assert all(registry.is_alive(r["owner_pid"], r.get("owner_start")) for r in registry.load_records())


def test_without_root_and_without_user_namespaces_the_message_says_what_is_needed(tmp_path):
    # An unprivileged user whose PATH has no `unshare`: localcluster cannot fall back to a user
    # namespace, so it must stop at once and say what it needs. The system python runs it
    # because this venv's interpreter may sit under /root, out of an unprivileged user's reach;
    # localcluster itself needs only the standard library.
    setpriv = shutil.which("setpriv")
    if not os.path.exists("/usr/bin/python3") or setpriv is None:
        pytest.skip("needs /usr/bin/python3 and setpriv to run as an unprivileged user")
    # A copy of the package where an unprivileged user can read it: the checkout may lie under
    # /root (mode 0700), as on a fresh machine where root clones into its home.
    public = copy_package_for_everyone("localcluster")
    env = {"PATH": str(tmp_path), "PYTHONPATH": public}
    try:
        done = subprocess.run(
            [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--",
             "/usr/bin/python3", "-m", "localcluster", "run", "--hosts", "2", "--", "true"],
            capture_output=True, text=True, env=env, timeout=30, cwd="/",
        )  # fmt: skip
    finally:
        shutil.rmtree(public)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "localcluster needs root (uid 0 with CAP_SYS_ADMIN and CAP_NET_ADMIN)" in done.stderr
    assert "(user namespace: `unshare` not found on PATH (Debian package util-linux))" in done.stderr

"""The entrypoint run for real: exit codes, output/failure and output/success, signals."""

import json
import os
import signal
import subprocess
import tarfile
import time

import pytest

from support.jobtree import PYTHON, REPO, entrypoint_env, failure_text, run_entrypoint, write_tree


def test_success_writes_success_and_streams_output(tmp_path):
    root = write_tree(tmp_path, script="print('hello from the script')\n")
    done = run_entrypoint(root)
    assert done.returncode == 0, done.stderr
    assert "hello from the script" in done.stdout
    assert (root / "output/success").exists() and not (root / "output/failure").exists()


def test_the_output_data_folder_is_there_for_the_script_and_nccls_dumps(tmp_path):
    """output/data (what goes into output.tar.gz; where gpu_env points NCCL's flight recorder)
    exists when the script starts, also in a bare tree that lacks it."""
    script = "import os\nassert os.path.isdir(os.path.join(os.environ['SM_OUTPUT_DATA_DIR'])), 'no output/data'\n"
    root = write_tree(tmp_path, script=script)
    assert not (root / "output/data").exists()
    done = run_entrypoint(root)
    assert done.returncode == 0, done.stderr


def test_script_exit_code_propagates_and_root_cause_leads_the_failure(tmp_path):
    script = "import sys\nprint('step 1')\ndef train():\n    raise ValueError('learning rate must be positive, got -1')\ntrain()\n"
    root = write_tree(tmp_path, script=script)
    done = run_entrypoint(root)
    assert done.returncode == 1
    report = failure_text(root)
    head = report[:1024]
    assert head.startswith("ValueError: learning rate must be positive, got -1\n")
    assert "rank 0 on host algo-1" in head and "exit code 1" in head
    assert 'train.py", line 4, in train' in head
    assert "step 1" in report  # the tail follows
    assert not (root / "output/success").exists()


def test_sys_exit_code_is_kept(tmp_path):
    root = write_tree(tmp_path, script="import sys\nsys.exit(7)\n")
    done = run_entrypoint(root)
    assert done.returncode == 7
    assert "exit code 7" in failure_text(root)


def test_exit_137_is_reported_as_likely_out_of_memory(tmp_path):
    root = write_tree(tmp_path, script="import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    done = run_entrypoint(root)
    assert done.returncode == 137
    assert "out-of-memory" in failure_text(root)[:1024]


def test_script_written_failure_file_is_kept(tmp_path):
    script = "import os\nopen(os.path.join(os.environ['SM_OUTPUT_DIR'], 'failure'), 'w').write('my own reason')\nraise SystemExit(3)\n"
    root = write_tree(tmp_path, script=script)
    assert run_entrypoint(root).returncode == 3
    assert failure_text(root) == "my own reason"


def test_secrets_from_the_environment_never_reach_the_failure_file(tmp_path):
    script = "import os\nprint('token is', os.environ['HF_TOKEN'])\nraise RuntimeError('bad key ' + os.environ['AWS_SECRET_ACCESS_KEY'])\n"
    root = write_tree(tmp_path, script=script, hyperparameters={"api_key": "hp-secret-value"})
    done = run_entrypoint(root, HF_TOKEN="hf_abcdefgh12345", AWS_SECRET_ACCESS_KEY="wJalrXUtnFEMI/K7MDENG")
    assert done.returncode == 1
    report = failure_text(root)
    assert "RuntimeError: bad key ****" in report
    for secret in ("hf_abcdefgh12345", "wJalrXUtnFEMI/K7MDENG"):
        assert secret not in report


def test_hyperparameter_values_reach_the_script_byte_for_byte(tmp_path):
    canary = tmp_path / "pwned"
    nasty = {
        "cmd": f"$(touch {canary})",
        "semi": f"; touch {canary}; rm -rf /",
        "backtick": f"`touch {canary}`",
        "quotes": "it's \"quoted\" \\ back",
        "newline": "line1\nline2",
        "unicode": "naïve — 日本語 🚀",
        "glob": "*",
        "dash": "--not-an-option",
    }
    script = "import json, os, sys\njson.dump(sys.argv[1:], open(os.path.join(os.environ['SM_MODEL_DIR'], 'argv.json'), 'w'))\n"
    root = write_tree(tmp_path / "ml", script=script, hyperparameters=nasty)
    done = run_entrypoint(root)
    assert done.returncode == 0, done.stderr
    argv = json.loads((root / "model/argv.json").read_text())
    expected = []
    for key in sorted(nasty):
        expected += [f"--{key}", nasty[key]]
    assert argv == expected
    assert not canary.exists()


def test_shell_script_entry_point_gets_arguments_without_a_shell_parse(tmp_path):
    canary = tmp_path / "pwned"
    root = write_tree(tmp_path / "ml", program="run.sh", script='#!/bin/sh\nprintf "%s|" "$@" > "$SM_MODEL_DIR/args"\n',
                      hyperparameters={"v": f"$(touch {canary})"})
    done = run_entrypoint(root)
    assert done.returncode == 0, done.stderr
    assert (root / "model/args").read_text() == f"-v|$(touch {canary})|"
    assert not canary.exists()


def test_submit_directory_tarball_is_extracted_into_an_empty_code_folder(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "entry.py").write_text("import os\nopen(os.path.join(os.environ['SM_MODEL_DIR'], 'ran'), 'w').write(os.getcwd())\n")
    archive = tmp_path / "sourcedir.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(src / "entry.py", arcname="entry.py")
    root = write_tree(tmp_path / "ml", program="entry.py", hyperparameters={"sagemaker_submit_directory": str(archive)})
    done = run_entrypoint(root)
    assert done.returncode == 0, done.stderr
    assert (root / "model/ran").read_text() == str(root / "code")


@pytest.mark.slow
@pytest.mark.needs_package_index  # pip builds the local packages with setuptools from PyPI
def test_requirements_then_installable_package(tmp_path):
    root = write_tree(tmp_path / "ml", program="mypkg/cli.py")
    code = root / "code"
    (code / "mypkg").mkdir()
    (code / "mypkg/__init__.py").write_text("")
    (code / "mypkg/cli.py").write_text(
        "import os, sys, dep_for_test\n"
        "assert __name__ == '__main__'\n"
        "open(os.path.join(os.environ['SM_MODEL_DIR'], 'ok'), 'w').write(dep_for_test.VALUE + ' ' + ' '.join(sys.argv[1:]))\n"
    )
    (code / "setup.py").write_text("from setuptools import setup\nsetup(name='mypkg', version='1.0', packages=['mypkg'])\n")
    dep = tmp_path / "dep"
    (dep / "dep_for_test").mkdir(parents=True)
    (dep / "dep_for_test/__init__.py").write_text("VALUE = 'dependency-installed'\n")
    (dep / "setup.py").write_text("from setuptools import setup\nsetup(name='dep-for-test', version='1.0', packages=['dep_for_test'])\n")
    (code / "requirements.txt").write_text(f"{dep}\n")
    try:
        done = run_entrypoint(root, timeout=300)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        assert (root / "model/ok").read_text() == "dependency-installed "
    finally:  # the packages went into the test venv: take them out again
        subprocess.run([PYTHON, "-m", "pip", "uninstall", "-q", "-y", "mypkg", "dep-for-test"], capture_output=True)


def test_failing_requirements_install_is_reported(tmp_path):
    root = write_tree(tmp_path / "ml", script="print('never runs')\n")
    (root / "code/requirements.txt").write_text("/nonexistent/package/path\n")
    done = run_entrypoint(root, timeout=300)
    assert done.returncode != 0
    report = failure_text(root)
    assert report.startswith("installing requirements.txt failed on host algo-1")
    assert "never runs" not in done.stdout


def start_entrypoint(root, **env):
    return subprocess.Popen(
        [PYTHON, "-m", "entrypoint", "train"], env=entrypoint_env(root, **env), cwd=str(REPO),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def wait_for(path, timeout=30):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_sigterm_reaches_the_script_which_gets_its_grace_period(tmp_path):
    script = (
        "import os, signal, sys, time\n"
        "model = os.environ['SM_MODEL_DIR']\n"
        "def on_term(*_):\n"
        "    time.sleep(1.0)  # e.g. write a checkpoint\n"
        "    open(os.path.join(model, 'saved'), 'w').write('ok')\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        "open(os.path.join(model, 'started'), 'w').close()\n"
        "time.sleep(60)\n"
    )
    root = write_tree(tmp_path, script=script)
    proc = start_entrypoint(root, BYOC_GRACE_PERIOD_S="20")
    wait_for(root / "model/started")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert (root / "model/saved").read_text() == "ok"
    assert "received SIGTERM" in err


def test_sigkill_after_the_grace_period_and_nothing_left_behind(tmp_path):
    script = (
        "import os, signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)'])\n"
        "open(os.path.join(os.environ['SM_MODEL_DIR'], 'pids'), 'w').write(f'{os.getpid()} {child.pid}')\n"
        "time.sleep(120)\n"
    )
    root = write_tree(tmp_path, script=script)
    proc = start_entrypoint(root, BYOC_GRACE_PERIOD_S="1")
    wait_for(root / "model/pids")
    pids = [int(p) for p in (root / "model/pids").read_text().split()]
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)  # a guard against a hang: the script alone sleeps two minutes
    assert proc.returncode == 137, err
    forwarded = err.index("received SIGTERM: forwarding it to the job, SIGKILL in 1 s")
    assert err.index("time is up: sending SIGKILL", forwarded) > forwarded, err  # the grace period's SIGKILL ended it
    assert failure_text(root).startswith("Training was stopped by SIGTERM.")
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


def test_dry_run_prints_the_plan_and_runs_nothing(tmp_path):
    root = write_tree(tmp_path, script="open('/dev/null')\nraise SystemExit('must not run')\n", hyperparameters={"lr": 0.5})
    done = run_entrypoint(root, "--dry-run", HF_TOKEN="hf_secret_value_123")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["role"] == "single"
    assert plan["processes"][0]["argv"][-2:] == ["--lr", "0.5"]
    # The thread budget, and why (one process: the cores this process may use, or fewer under a quota).
    assert 1 <= int(plan["env"]["OMP_NUM_THREADS"]) <= len(os.sched_getaffinity(0))
    assert any(n.startswith("threads per process:") for n in plan["notes"])
    assert "hf_secret_value_123" not in done.stdout
    assert not (root / "output/success").exists() and not (root / "output/failure").exists()


def test_mpi_worker_whose_leaders_name_never_resolves_fails_within_its_timeout(tmp_path):
    """Every multi-host role waits for the job's names first (an MPI worker too, since its words
    go to the leader's job port): bounded by BYOC_HOST_RESOLUTION_TIMEOUT_S. A leader that
    resolves and never answers: tests/entrypoint/roles/test_mpi_launch_scale.py."""
    root = write_tree(tmp_path / "ml", hosts=("algo-1", "algo-2"), current_host="algo-2",
                      script="print('x')\n", hyperparameters={"sagemaker_mpi_enabled": True})
    started = time.monotonic()
    done = run_entrypoint(root, BYOC_PEER_WAIT_TIMEOUT_S="2", BYOC_HOST_RESOLUTION_TIMEOUT_S="2",
                          BYOC_RUNTIME_DIR=str(tmp_path / "run"))
    assert time.monotonic() - started >= 2  # it waited its bound, not less; a wait past it hangs the guard
    assert done.returncode == 1
    assert "did not resolve within 2 s (BYOC_HOST_RESOLUTION_TIMEOUT_S)" in failure_text(root)
    assert not (root / "output/success").exists()

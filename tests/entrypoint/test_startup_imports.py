"""Start-up cost: `python -m entrypoint train` for a 1-host job imports only what that path
needs. Each module below costs a few ms at every container start (measured with
`python -X importtime -c "import entrypoint.cli"`; benchmarks/entrypoint_startup.py has the
wall-time comparison with the toolkit). A fresh interpreter, so nothing is imported already;
the repository's own entrypoint first on sys.path (-I leaves out PYTHONPATH, and a dev venv's
editable install may point at another checkout)."""

import subprocess
import sys
from pathlib import Path
import pytest

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

REPO = Path(__file__).resolve().parents[2]
# dataclasses brings inspect, ast, dis and tokenize (~12 ms) and each frozen dataclass costs
# ~1 ms to define: the launch path's records are typing.NamedTuple classes instead.
NOT_AT_START = ("entrypoint.roles.mpi", "entrypoint.hosts.worker_output", "concurrent.futures", "logging", "tarfile", "tomllib", "secrets",
                "tempfile", "random", "hashlib", "boto3", "dataclasses", "inspect", "ast", "dis", "tokenize",
                "traceback")
# What every rank's wrapper (entrypoint/rank/record_errors.py) leaves to the failure path.
NOT_IN_A_RANK = ("json", "socket", "traceback", "threading", "dataclasses", "inspect")


def run_isolated(*args: str) -> str:
    done = subprocess.run([sys.executable, "-I", *args], capture_output=True, text=True, timeout=60, cwd=str(REPO))
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_launcher_imports_no_multi_host_or_rarely_needed_module_at_start():
    probe = (f"import sys; sys.path.insert(0, {str(REPO)!r}); import entrypoint.cli; "
             f"assert entrypoint.cli.__file__.startswith({str(REPO)!r}), entrypoint.cli.__file__; "
             f"print(sorted(m for m in {NOT_AT_START!r} if m in sys.modules))")
    assert run_isolated("-c", probe) == "[]"


def test_a_rank_imports_only_what_running_the_program_needs(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(f"import sys\nprint(sorted(m for m in {NOT_IN_A_RANK!r} if m in sys.modules))\n")
    assert run_isolated(str(REPO / "entrypoint" / "rank" / "record_errors.py"), str(script)) == "[]"


# What a whole 1-host run (read, decide, pre-flight, folders, run, outcome) leaves out: hashlib
# loads OpenSSL (~2 ms; the job id uses CPython's built-in SHA-256), argparse is only for
# usage and errors, difflib only for a "Did you mean" message, shutil (bz2, lzma) only to copy a
# local source directory, socket and the multi-host roles only for a multi-host launch (the job
# port's module is read for its words, but opens nothing: no socket, no hmac).
NOT_ON_A_ONE_HOST_RUN = ("hashlib", "_hashlib", "argparse", "gettext", "difflib", "entrypoint.roles.mpi",
                         "concurrent.futures", "logging", "dataclasses", "inspect", "tarfile", "tempfile", "shutil",
                         "bz2", "lzma", "socket", "hmac", "entrypoint.roles.job_port",
                         "entrypoint.hosts.worker_output", "entrypoint.run.rank_stream",
                         # the deep health check (BYOC_HEALTH_CHECK=deep) only; torch never
                         "entrypoint.decide.health", "entrypoint.run.health_check", "torch")


def test_a_whole_one_host_run_imports_none_of_the_rarely_needed_modules(tmp_path):
    import os

    sys.path.insert(0, str(REPO / "tests"))
    from support.jobtree import write_tree

    root = write_tree(tmp_path / "ml", script="print('trivial')\n")
    probe = (f"import sys; sys.path.insert(0, {str(REPO)!r}); from entrypoint.cli import main; "
             f"sys.exit(main(['train']))")
    done = subprocess.run([sys.executable, "-I", "-X", "importtime", "-c", probe], capture_output=True, text=True,
                          timeout=60, cwd=str(tmp_path), env={**os.environ, "SAGEMAKER_BASE_DIR": str(root)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "trivial" in done.stdout
    imported = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "entrypoint.orchestrate" in imported  # the probe sees the run's imports
    assert sorted(m for m in NOT_ON_A_ONE_HOST_RUN if m in imported) == []

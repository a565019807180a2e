"""Start-up cost: `python -m entrypoint train` for a 1-host job imports only what that path
needs. Each module below costs a few ms at every container start (measured with
`python -X importtime -c "import entrypoint.cli"`; benchmarks/entrypoint_startup.py has the
wall-time comparison with the toolkit). A fresh interpreter, so nothing is imported already."""

import subprocess
import sys

NOT_AT_START = ("entrypoint.mpi_hosts", "concurrent.futures", "logging", "tarfile", "tomllib", "secrets",
                "tempfile", "random", "hashlib", "boto3")


def test_the_launcher_imports_no_multi_host_or_rarely_needed_module_at_start():
    probe = ("import sys, entrypoint.cli; "
             f"print(sorted(m for m in {NOT_AT_START!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, timeout=60,
                          cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout

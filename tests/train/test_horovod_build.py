"""scripts/build-horovod-wheel.sh: idempotent (an existing wheel means no build) and honest
about what it needs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
import pytest

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "build-horovod-wheel.sh"


def test_an_existing_wheel_is_not_built_again(tmp_path):
    wheel = tmp_path / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl"
    wheel.write_bytes(b"already here")
    env = {**os.environ, "BYOC_WHEELHOUSE": str(tmp_path), "PYTHON": "/nonexistent/python"}
    result = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert f"already built: {wheel}" in result.stdout
    assert wheel.read_bytes() == b"already here"


def test_a_python_without_torch_is_a_clear_error(tmp_path):
    env = {**os.environ, "BYOC_WHEELHOUSE": str(tmp_path), "PYTHON": "/usr/bin/false"}
    result = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert "has no torch; run scripts/bootstrap.sh first" in result.stderr
    assert list(tmp_path.iterdir()) == []

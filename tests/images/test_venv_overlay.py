"""docker/scripts/venv-overlay.py: what an install step adds to a venv, laid over a copy of the
venv taken before it, gives the same venv (the CPU image lays Horovod's files over its
runtime's copy that way); an install that removed something is refused, since an overlay
cannot remove. Run as the build runs it: the script as a program, on real folders."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.images.image_harness import REPO_ROOT
import pytest

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

SCRIPT = REPO_ROOT / "docker" / "scripts" / "venv-overlay.py"


def _run(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=60)


def _tree(root: Path) -> dict[str, object]:
    """Every path under root with what it is: a link's target, a file's bytes and mode."""
    found: dict[str, object] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            found[rel] = ("link", os.readlink(path))
        elif path.is_dir():
            found[rel] = "dir"
        else:
            found[rel] = ("file", path.read_bytes(), path.stat().st_mode & 0o777)
    return found


def _venv(root: Path) -> Path:
    site = root / "lib" / "python3.11" / "site-packages"
    (site / "psutil").mkdir(parents=True)
    (site / "psutil" / "__init__.py").write_text("version = 1\n")
    (root / "bin").mkdir()
    (root / "bin" / "python3").symlink_to("/usr/bin/python3")
    return root


def test_the_overlay_over_the_copy_taken_before_gives_the_installed_venv(tmp_path):
    venv = _venv(tmp_path / "venv")
    state = tmp_path / "before.json"
    assert _run("snapshot", venv, state).returncode == 0
    copy = tmp_path / "runtime-copy"
    shutil.copytree(venv, copy, symlinks=True)
    # What an install does: new packages and a script, a new link, a changed file, an empty folder.
    site = venv / "lib" / "python3.11" / "site-packages"
    (site / "horovod" / "torch").mkdir(parents=True)
    (site / "horovod" / "torch" / "mpi_lib_v2.so").write_bytes(b"\x7fELF\x00\xff")
    (site / "horovod-0.28.1.dist-info").mkdir()
    (site / "horovod-0.28.1.dist-info" / "RECORD").write_text("horovod/__init__.py,,\n")
    script = venv / "bin" / "horovodrun"
    script.write_text("#!/opt/venv/bin/python3\n")
    script.chmod(0o755)
    (venv / "bin" / "python").symlink_to("python3")
    (site / "psutil" / "__init__.py").write_text("version = 2  # rewritten by the install\n")
    (site / "yaml" / "empty").mkdir(parents=True)

    done = _run("export", venv, state, tmp_path / "overlay")
    assert done.returncode == 0, done.stderr
    assert "5 file(s) or link(s) new or changed" in done.stdout  # .so, RECORD, horovodrun, psutil, bin/python
    shutil.copytree(tmp_path / "overlay", copy, symlinks=True, dirs_exist_ok=True)  # as COPY lays it
    assert _tree(copy) == _tree(venv)
    # Nothing unchanged travels in the overlay.
    assert not (tmp_path / "overlay" / "bin" / "python3").exists()


def test_an_install_that_removed_a_file_is_refused(tmp_path):
    venv = _venv(tmp_path / "venv")
    state = tmp_path / "before.json"
    assert _run("snapshot", venv, state).returncode == 0
    shutil.rmtree(venv / "lib" / "python3.11" / "site-packages" / "psutil")  # pip upgraded it away
    done = _run("export", venv, state, tmp_path / "overlay")
    assert done.returncode == 1
    assert "2 path(s) removed" in done.stderr and "psutil/__init__.py" in done.stderr


def test_an_unchanged_venv_gives_an_empty_overlay(tmp_path):
    venv = _venv(tmp_path / "venv")
    state = tmp_path / "before.json"
    assert _run("snapshot", venv, state).returncode == 0
    done = _run("export", venv, state, tmp_path / "overlay")
    assert done.returncode == 0 and "0 file(s) or link(s)" in done.stdout
    assert list((tmp_path / "overlay").rglob("*")) == []


def test_bad_arguments_print_the_usage(tmp_path):
    done = _run("export", tmp_path)
    assert done.returncode == 2 and "snapshot VENV STATE" in done.stderr

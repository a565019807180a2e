"""What the repository holds: text a reviewer can read. A binary (a file with a NUL byte in its
first 8 KiB: wheels, archives, images, compiled objects) belongs only in docker/wheelhouse/,
where the build keeps Horovod's wheel (git-ignored there, docker/wheelhouse/README.md); a
66 KB linter wheel once sat at the root."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

REPO = Path(__file__).resolve().parents[2]
BINARIES_ALLOWED_UNDER = ("docker/wheelhouse/",)


def find_binaries(root: Path, names: list[str]) -> list[str]:
    """Of these files (relative to root), the ones with a NUL byte in their first 8 KiB."""
    found = []
    for name in names:
        path = root / name
        if path.is_file() and not path.is_symlink():
            with open(path, "rb") as f:
                if b"\0" in f.read(8192):
                    found.append(name)
    return found


def test_find_binaries_tells_a_wheel_from_text(tmp_path):
    (tmp_path / "tool.whl").write_bytes(b"PK\x03\x04\0\0zip")
    (tmp_path / "notes.md").write_text("é text, no NUL\n")
    assert find_binaries(tmp_path, ["tool.whl", "notes.md", "missing.txt"]) == ["tool.whl"]


def test_no_binary_is_tracked_outside_the_wheelhouse():
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    names = [n.decode() for n in listed.split(b"\0") if n]
    if not names:
        pytest.skip("not a git checkout (no tracked files to read)")
    outside = [n for n in names if not n.startswith(BINARIES_ALLOWED_UNDER)]
    assert find_binaries(REPO, outside) == []


# The last commit whose subject ran over (issue 64's count: its detail belonged in the body).
LAST_LONG_SUBJECT = "05230de"
MAX_SUBJECT = 72


def test_commit_subjects_since_the_rule_are_at_most_72_characters():
    """`git log --oneline` reads as a list: a subject of at most 72 characters, the detail in
    the body."""
    known = subprocess.run(["git", "cat-file", "-e", f"{LAST_LONG_SUBJECT}^{{commit}}"], cwd=REPO, capture_output=True)
    if known.returncode != 0:
        pytest.skip(f"this clone lacks {LAST_LONG_SUBJECT} (a shallow clone): no history to read")
    subjects = subprocess.run(["git", "log", "--format=%h %s", f"{LAST_LONG_SUBJECT}..HEAD"], cwd=REPO,
                              capture_output=True, text=True, check=True).stdout.splitlines()
    assert subjects, "no commit since the rule"
    assert [s for s in subjects if len(s.split(" ", 1)[1]) > MAX_SUBJECT] == []

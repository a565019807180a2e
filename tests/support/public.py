"""A copy of one of this repository's packages where every user can read it."""

import os
import shutil
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def copy_package_for_everyone(package: str) -> str:
    """A folder every user can read holding a copy of this repository's `package`: the
    checkout may lie under /root (mode 0700), as on a fresh machine where root clones into its
    home, and pytest's own temporary folders are 0700 too. The caller removes it."""
    public = tempfile.mkdtemp(prefix="localcluster-public-")
    shutil.copytree(os.path.join(REPO, package), os.path.join(public, package), ignore=shutil.ignore_patterns("__pycache__"))
    for folder, dirs, files in os.walk(public):
        os.chmod(folder, 0o755)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o644)
    return public

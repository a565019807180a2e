"""What one install step adds to a venv, as a folder to lay over a copy of the venv taken
before that step.

The CPU image copies its 1 GB venv into the runtime stage before Horovod is installed (so
that scripts/run-main-job.sh builds that copy while Horovod compiles elsewhere), then lays
Horovod's files over it: `COPY --from=venv /opt/byoc-horovod-overlay/ /opt/venv/`.

    python3 venv-overlay.py snapshot VENV STATE       record every path under VENV
    python3 venv-overlay.py export VENV STATE OUT     copy what is new or changed since into OUT

An install that removed or replaced something (pip upgrading a dependency) cannot be laid
over the old copy, which would keep the old files: export fails and names them. Stdlib only,
for the image's Python."""

from __future__ import annotations

import json
import os
import shutil
import sys


def scan_venv(venv: str) -> dict[str, list[int]]:
    """Every file, link and folder under venv: relative path -> [mode, size, mtime_ns]."""
    found: dict[str, list[int]] = {}
    for folder, dirs, files in os.walk(venv):
        for name in dirs + files:
            path = os.path.join(folder, name)
            st = os.lstat(path)
            found[os.path.relpath(path, venv)] = [st.st_mode, st.st_size, st.st_mtime_ns]
    return found


def decide_overlay(before: dict[str, list[int]], after: dict[str, list[int]]) -> tuple[list[str], list[str]]:
    """(paths to copy: new or changed, paths gone since the snapshot)."""
    changed = sorted(p for p, facts in after.items() if before.get(p) != facts)
    gone = sorted(p for p in before if p not in after)
    return changed, gone


def write_overlay(venv: str, paths: list[str], out: str) -> None:
    os.makedirs(out, exist_ok=True)
    for rel in paths:
        src, dst = os.path.join(venv, rel), os.path.join(out, rel)
        if os.path.isdir(src) and not os.path.islink(src):
            os.makedirs(dst, exist_ok=True)
            shutil.copystat(src, dst)
            continue
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if os.path.islink(src):
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "snapshot":
        with open(argv[2], "w") as state:
            json.dump(scan_venv(argv[1]), state)
        return 0
    if len(argv) == 4 and argv[0] == "export":
        venv, state, out = argv[1:]
        with open(state) as f:
            before = json.load(f)
        changed, gone = decide_overlay(before, scan_venv(venv))
        # A changed file is fine (a RECORD rewritten); a folder only changes its mtime.
        if gone:
            print(f"venv-overlay: {len(gone)} path(s) removed since the snapshot, so the overlay cannot "
                  f"reproduce this venv: {', '.join(gone[:10])}", file=sys.stderr)
            return 1
        write_overlay(venv, changed, out)
        files = sum(1 for p in changed if os.path.islink(os.path.join(venv, p)) or not os.path.isdir(os.path.join(venv, p)))
        print(f"venv-overlay: {files} file(s) or link(s) new or changed under {venv}, in {out}")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env bash
# This repository's packages (entrypoint, train) from its pyproject.toml, with --no-deps:
# every dependency is already installed at the versions pinned in docker/versions.env, and
# `pip check` proves the set is consistent, with nothing filtered away. pyproject's own
# requirements are what every flavour satisfies (torch and numpy as ranges: trn1 keeps the
# torch torch-neuronx needs), so no flavour has a conflict to excuse.
# usage: install-our-packages.sh SRC_DIR
set -euo pipefail
src=${1:?usage: install-our-packages.sh SRC_DIR}

python3 -m pip install --no-cache-dir -q --no-deps --no-build-isolation "$src"

# Whole lines where no rank wrapper runs the ranks (SDK v3's drivers start them): with
# BYOC_WHOLE_LINES=1 (/etc/byoc/bash-env.sh sets it in a v3 job, its mpirun shim passes it to
# every host's ranks) every Python process of the image writes a line per write
# (entrypoint/rank/record_errors.py start_whole_lines). Without it, this line costs a lookup.
site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo 'import os; os.environ.get("BYOC_WHOLE_LINES") == "1" and __import__("entrypoint.rank.record_errors", fromlist=["start_whole_lines"]).start_whole_lines()' \
    > "$site/byoc-whole-lines.pth"

# The check: dependencies consistent, and the launcher module loads.
if ! report=$(python3 -m pip check 2>&1); then
    echo "install-our-packages: pip check found conflicts:" >&2
    echo "$report" >&2
    exit 1
fi
python3 -c 'import entrypoint, train; print("install-our-packages: entrypoint and train import")'

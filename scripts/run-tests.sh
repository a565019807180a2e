#!/usr/bin/env bash
# The test command: sets up what is missing, then runs the whole suite.
# Extra arguments go to pytest (e.g. scripts/run-tests.sh -k plan -x).
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
bash scripts/bootstrap.sh
exec .venv/bin/python -m pytest "$@"

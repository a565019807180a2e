#!/usr/bin/env bash
# The test command: sets up what is missing, then runs the whole suite.
#   scripts/run-tests.sh            the whole suite (what CI runs), in 4 parallel workers
#   scripts/run-tests.sh --quick    the quick tier: pure layers and goldens (marker `quick`),
#                                   for the edit-test loop (every commit passes it)
# Extra arguments go to pytest (e.g. scripts/run-tests.sh -k plan -x; `-n 0` runs in one process).
#
# Parallel: pytest-xdist, BYOC_TEST_WORKERS workers (default 4 on this 2-core machine kind: much
# of the suite waits on processes it started, hosts, containers; 0: one process). Tests that
# share a machine-wide resource are grouped so they never run beside each other
# (tests/conftest.py). The 10 slowest tests and the total time end the output
# (docs/development.md#test-times).
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
quick=0 args=()
for arg in "$@"; do
    if [ "$arg" = --quick ]; then quick=1; else args+=("$arg"); fi
done
bash scripts/bootstrap.sh  # seconds when everything is there
workers=${BYOC_TEST_WORKERS:-4}
parallel=()
if ((workers > 0)); then parallel=(-n "$workers" --dist load); fi
tier=()
if ((quick)); then tier=(-m quick); fi
exec .venv/bin/python -m pytest "${tier[@]}" "${parallel[@]}" --durations=10 "${args[@]}"

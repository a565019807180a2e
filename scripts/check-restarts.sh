#!/usr/bin/env bash
# check-restarts.sh [REPEATS]: the restart-in-place kill cases of tests/multihost/test_restarts.py
# (torchrun on 2 and 3 emulated hosts, a rank SIGKILLed on a worker host and on the leader's),
# each REPEATS times in a row (default 20): every run must succeed. Root needed (emulated hosts).
# Too long for CI, which runs each case once; run it before a release and quote its summary.
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-20}
started=$(date +%s)
BYOC_RESTART_REPEATS=$repeats .venv/bin/python -m pytest tests/multihost/test_restarts.py -q -p no:cacheprovider \
    -k test_a_rank_killed_once_is_restarted_on_every_host_and_the_job_succeeds
echo "check-restarts: 4 cases x $repeats runs passed in $(( $(date +%s) - started )) s"

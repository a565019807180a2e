#!/usr/bin/env bash
# check-torch-versions.sh [VERSION...]: the rank tests (tests/entrypoint/rank/, the seam's own
# tests among them: test_internals.py) and a 2-host restart job (tests/multihost/test_restarts.py:
# torchrun on 2 emulated hosts, a rank SIGKILLed on the worker host, restarted in place) under
# each torch the rank seam (entrypoint/rank/byoc_internals.py) says it was checked on; default
# 2.9.1 2.13.0 2.14.1. Each torch in a venv of its own, /var/tmp/byoc-torch-<version>, made
# once and reused (with the project's dependencies and test tools, never the project itself:
# a .pth names this checkout). Root needed (the emulated hosts). Not run in CI: run it before a
# stop, and quote its summary lines in docs/development.md.
#
# Prints, per version, each internal the seam's log named in its runs (the line a failed check
# writes: a test against the installed torch that fails shows it), then one summary line:
#   torch 2.13.0: passed (rank tests: 120 passed; 2-host restart: 1 passed) in 431 s
# and exits 1 when any version failed. Logs: /var/tmp/byoc-torch-logs/ (BYOC_CHECK_LOGS).
# --install-only: make the venvs (several GB to download for 2.9.1), run nothing.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
install_only=0
if [ "${1:-}" = --install-only ]; then
    install_only=1
    shift
fi
versions=("$@")
((${#versions[@]})) || versions=(2.9.1 2.13.0 2.14.1)
python_bin=${PYTHON:-python3}
logs=${BYOC_CHECK_LOGS:-/var/tmp/byoc-torch-logs}
rank_tests=(tests/entrypoint/rank)
restart_test=(tests/multihost/test_restarts.py
              -k "test_a_rank_killed_once_is_restarted_on_every_host_and_the_job_succeeds and 2-hosts and worker")
pytest_args=(-q -p no:cacheprovider -n 0 -rfE)

say() { echo "check-torch-versions: $*"; }
die() { echo "check-torch-versions: $*" >&2; exit 2; }

((install_only)) || [ "$(id -u)" -eq 0 ] || die "needs root (the 2-host job's emulated hosts)"
command -v "$python_bin" >/dev/null || die "no $python_bin (set PYTHON)"
mkdir -p "$logs"

# The project's dependencies and test tools, as pyproject.toml pins them, but torch (each venv's own).
mapfile -t requirements < <("$python_bin" - "$repo/pyproject.toml" <<'EOF'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
for requirement in project["dependencies"] + project["optional-dependencies"]["test"]:
    if not requirement.replace(" ", "").startswith(("torch>", "torch=", "torch<", "torch;")) and requirement != "torch":
        print(requirement)
EOF
)
((${#requirements[@]})) || die "no requirements read from pyproject.toml"

make_venv() {  # make_venv VERSION VENV: torch==VERSION and the requirements in VENV, once
    local version=$1 venv=$2 stamp="$2/.byoc-installed" want constraints
    want="torch==$version ${requirements[*]}"
    if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
        return 0
    fi
    say "torch $version: installing into $venv (log: $logs/install-$version.log)"
    [ -x "$venv/bin/python" ] || "$python_bin" -m venv "$venv"
    constraints="$venv/.byoc-constraints.txt"
    echo "torch==$version" >"$constraints"
    "$venv/bin/python" -m pip install --disable-pip-version-check --no-compile -c "$constraints" \
        "torch==$version" "${requirements[@]}" >"$logs/install-$version.log" 2>&1 \
        || { tail -5 "$logs/install-$version.log" >&2; return 1; }
    # This checkout's entrypoint and localcluster, as the dev venv's editable install gives them.
    "$venv/bin/python" -c 'import sys, sysconfig; open(sysconfig.get_paths()["purelib"] + "/byoc-checkout.pth", "w").write(sys.argv[1] + "\n")' "$repo"
    echo "$want" >"$stamp"
}

summarize() {  # summarize LOG: pytest's last counts line (`12 passed, 1 skipped`), or why there is none
    local line
    line=$(grep -E '^(=+ )?[0-9]+ (passed|failed|error|skipped)|no tests ran' "$1" | tail -1 | sed -E 's/^=+ //; s/ in [0-9.]+s.*$//; s/ =+$//')
    echo "${line:-no pytest summary, see $1}"
}

failed=0
results=()
for version in "${versions[@]}"; do
    venv="/var/tmp/byoc-torch-$version"
    started=$SECONDS
    if ! make_venv "$version" "$venv"; then
        results+=("torch $version: failed (install, see $logs/install-$version.log)")
        failed=1
        continue
    fi
    if ((install_only)); then
        results+=("torch $version: installed in $venv")
        continue
    fi
    python="$venv/bin/python"
    installed=$("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)
    if [ "${installed%%+*}" != "$version" ]; then
        results+=("torch $version: failed (the venv has torch $installed)")
        failed=1
        continue
    fi
    status=passed
    say "torch $version ($installed): rank tests (log: $logs/rank-$version.log)"
    "$python" -m pytest "${pytest_args[@]}" "${rank_tests[@]}" \
        >"$logs/rank-$version.log" 2>&1 || status=failed
    say "torch $version: 2-host restart job (log: $logs/restart-$version.log)"
    "$python" -m pytest "${pytest_args[@]}" "${restart_test[@]}" \
        >"$logs/restart-$version.log" 2>&1 || status=failed
    named=$(grep -ho '\[entrypoint\] .* is not what this image checked on .*' "$logs/rank-$version.log" \
                "$logs/restart-$version.log" | sort -u || true)
    if [ -n "$named" ]; then
        while IFS= read -r line; do
            echo "torch $version: internal differs: $line"
        done <<<"$named"
    else
        say "torch $version: every internal as the seam expects (no log line of a fallback)"
    fi
    [ "$status" = passed ] || failed=1
    results+=("torch $version: $status (rank tests: $(summarize "$logs/rank-$version.log"); 2-host restart: $(summarize "$logs/restart-$version.log")) in $((SECONDS - started)) s")
done
printf '%s\n' "${results[@]}"
exit "$failed"

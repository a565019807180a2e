# shellcheck shell=bash
# Set-up stages a person can follow: one line per stage with the time since the set-up began
# and what starts now; the stage's whole output goes to a log file whose path is on that
# line; a failing stage shows its log's last 40 lines and stops the script with its code.
# Sourced by scripts/bootstrap.sh and scripts/build-local-image.sh.
#
#   stage NAME "what it does" COMMAND [ARGS...]   runs COMMAND (a function is fine) under set -e
#
# Env: BYOC_SETUP_T0 (epoch seconds the set-up began; exported so that every script of one
# command counts from the same start), BYOC_SETUP_LOGS (default <repo>/.work/setup-logs).

: "${BYOC_SETUP_T0:=$(date +%s)}"
export BYOC_SETUP_T0
: "${BYOC_SETUP_LOGS:=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/.work/setup-logs}"
export BYOC_SETUP_LOGS

elapsed() {
    local s=$(($(date +%s) - BYOC_SETUP_T0))
    printf '%d:%02d' $((s / 60)) $((s % 60))
}

say_stage() {  # say_stage TEXT: one line on stderr, stamped with the time since the start
    printf 'setup [%5s] %s\n' "$(elapsed)" "$*" >&2
}

stage() {
    local name=$1 what=$2
    shift 2
    mkdir -p "$BYOC_SETUP_LOGS"
    local log="$BYOC_SETUP_LOGS/$name.log" began=$SECONDS rc
    say_stage "$what … (log: $log)"
    # Not `if "$@"`: bash ignores set -e in anything run as a condition, and a stage must stop
    # at its first failing command.
    set +e
    ( set -e; "$@" ) >"$log" 2>&1
    rc=$?
    set -e
    if ((rc != 0)); then
        say_stage "FAILED after $((SECONDS - began)) s: $what (exit code $rc). The last 40 lines of $log:"
        tail -n 40 "$log" | sed 's/^/    /' >&2
        exit "$rc"
    fi
}

# Stages that wait on the network and touch nothing of each other's run beside what follows
# (the set-up's SDK venvs beside its .venv): each keeps its own line and log.
#   stage_in_background NAME "what it does" COMMAND [ARGS...]
#   wait_background_stages   waits for them all; the first to fail (its log's tail shown)
#                            ends the script with its exit code, at once, and the others are stopped
BACKGROUND_STAGES=()

stage_in_background() {
    stage "$@" &
    BACKGROUND_STAGES+=($!)
}

kill_tree() {  # kill_tree PID: the process and everything it started (pip, cmake, the compilers)
    local child
    for child in $(pgrep -P "$1" || :); do kill_tree "$child"; done
    kill "$1" 2>/dev/null || :
}

stop_background_stages() {
    local pid
    for pid in "${BACKGROUND_STAGES[@]}"; do kill_tree "$pid"; done
    BACKGROUND_STAGES=()
}

wait_background_stages() {
    local pid rc running
    while ((${#BACKGROUND_STAGES[@]})); do
        running=()
        for pid in "${BACKGROUND_STAGES[@]}"; do
            if kill -0 "$pid" 2>/dev/null; then
                running+=("$pid")
                continue
            fi
            rc=0
            wait "$pid" || rc=$?  # an ended child's status, which bash keeps
            if ((rc != 0)); then
                stop_background_stages
                exit "$rc"
            fi
        done
        BACKGROUND_STAGES=("${running[@]}")
        if ((${#running[@]})); then sleep 0.2; fi  # not `wait -n`: it loses a job that ended before it
    done
}

#!/usr/bin/env bash
# A Docker engine for the image build, the SageMaker local-mode tests and the main job.
#
#   scripts/docker-engine.sh start   prints `export DOCKER_HOST=…` for the engine to use
#   scripts/docker-engine.sh stop    stops the engine this script started (nothing else)
#   scripts/docker-engine.sh status  says which engine answers, if any
#
# start is idempotent:
#   - an engine that already answers (DOCKER_HOST, or the default socket) is used as it is;
#   - otherwise Debian's docker.io, docker-compose and docker-registry are installed if
#     missing, and dockerd is started in the background with its own data root
#     ($BYOC_DOCKER_ROOT, default /var/lib/byoc-docker: kept between runs, so Docker's layer
#     cache survives), its own exec root, no iptables (these machines have none), on
#     /var/run/docker.sock, or on a socket of its own when that path is taken by something
#     that does not answer.
# Env: BYOC_DOCKER_ROOT (data root), BYOC_DOCKERD_ARGS (more dockerd arguments, split on
# spaces; e.g. --bridge=NAME where docker0 belongs to another engine on the same network).
# Use:  eval "$(bash scripts/docker-engine.sh start)"
set -euo pipefail

data_root=${BYOC_DOCKER_ROOT:-/var/lib/byoc-docker}
exec_root=/run/byoc-docker
pid_file=$exec_root/byoc-dockerd.pid
host_file=$exec_root/byoc-dockerd.host
log_file=$data_root.log
default_host=unix:///var/run/docker.sock

say() { echo "docker-engine: $*" >&2; }

answers() {  # answers HOST: does an engine answer there (within a few seconds)?
    DOCKER_HOST=$1 timeout 10 docker version --format '{{.Server.Version}}' >/dev/null 2>&1
}

ensure_packages() {
    local missing=() pkg
    for pkg in docker.io docker-compose docker-registry; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    # A docker CLI of another origin (e.g. /usr/local/bin/docker) still needs an engine.
    command -v dockerd >/dev/null || [[ " ${missing[*]} " == *" docker.io "* ]] || missing+=(docker.io)
    ((${#missing[@]})) || return 0
    if [ "$(id -u)" -ne 0 ]; then
        say "need root to apt-get install: ${missing[*]}"
        exit 1
    fi
    say "installing Debian packages: ${missing[*]}"
    apt-get update -qq
    # policy-rc.d-less machines would start the packaged services: we start our own.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

start() {
    # One start at a time: the test suite's parallel workers each ask for the engine, and two
    # dockerd on one data root corrupt it. The lock goes with this script's process.
    mkdir -p "$exec_root"
    exec 9>"$exec_root/start.lock"
    flock 9
    if [ -n "${DOCKER_HOST:-}" ] && answers "$DOCKER_HOST"; then
        echo "export DOCKER_HOST=$DOCKER_HOST"; return 0
    fi
    if [ -s "$host_file" ] && answers "$(cat "$host_file")"; then
        echo "export DOCKER_HOST=$(cat "$host_file")"; return 0
    fi
    ensure_packages
    if answers "$default_host"; then
        echo "export DOCKER_HOST=$default_host"; return 0
    fi
    local host=$default_host
    if [ -S /var/run/docker.sock ] || [ -e /var/run/docker.sock ]; then
        # Someone's socket that does not answer: leave it alone, use our own.
        host=unix://$exec_root/docker.sock
    fi
    mkdir -p "$data_root"
    say "starting dockerd (data root $data_root, log $log_file)"
    # setsid: the engine outlives this script and the shell that started it.
    local extra=()
    read -r -a extra <<<"${BYOC_DOCKERD_ARGS:-}"
    setsid dockerd --iptables=false --ip-masq=false --data-root "$data_root" \
        --exec-root "$exec_root" --pidfile "$exec_root/dockerd.pid" -H "$host" "${extra[@]}" \
        >>"$log_file" 2>&1 </dev/null 9>&- &  # 9>&-: the engine must not hold the start lock
    echo $! >"$pid_file"
    echo "$host" >"$host_file"
    local deadline=$((SECONDS + 60))
    until answers "$host"; do
        if ! kill -0 "$(cat "$pid_file")" 2>/dev/null; then
            say "dockerd exited; the end of $log_file:"
            tail -n 20 "$log_file" >&2
            exit 1
        fi
        if ((SECONDS > deadline)); then
            say "dockerd did not answer within 60 s; the end of $log_file:"
            tail -n 20 "$log_file" >&2
            exit 1
        fi
        sleep 0.5
    done
    echo "export DOCKER_HOST=$host"
}

stop() {
    [ -s "$pid_file" ] || { say "no engine started by this script"; return 0; }
    local pid
    pid=$(cat "$pid_file")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid"
        for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    fi
    rm -f "$pid_file" "$host_file"
    say "stopped dockerd $pid"
}

status() {
    local host
    for host in ${DOCKER_HOST:-} "$(cat "$host_file" 2>/dev/null)" "$default_host"; do
        [ -n "$host" ] || continue
        if answers "$host"; then echo "engine answers at $host"; return 0; fi
    done
    echo "no engine answers"; return 1
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# The project's "does the README work on a NEW machine" check: a clean clone of the
# committed tree, in a fresh Debian 12 root (a container from a debootstrap base), runs the
# README's two commands with nothing from this machine: no venv, no apt packages installed
# by hand, no Docker engine or images (the root starts its own engine, with its data on a
# scratch folder), no wheel caches. Run it before every submission.
#
# What a fresh machine of this kind does have, and so the root gets too (read-only): the
# local wheel folders and pip settings (`pip config list`, PIP_* variables) and the CA
# bundle that this machine's HTTPS to the package registries is signed with.
#
# usage: scripts/check-fresh-root.sh [--keep] [--only tests|main-job] [-- PYTEST_ARGS...]
#   --keep   keep the scratch folder (the clone, the root's Docker data) for a look
# Exit code: the first failing command's. Log: the scratch folder's check.log.
set -euo pipefail
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"

keep=0 only=''
pytest_args=()
while (($#)); do
    case "$1" in
        --keep) keep=1; shift ;;
        --only) only=${2:?}; shift 2 ;;
        --) shift; pytest_args=("$@"); break ;;
        *) echo "check-fresh-root: unknown argument $1" >&2; exit 2 ;;
    esac
done

eval "$(bash scripts/docker-engine.sh start)"
export DOCKER_HOST
# A fresh Debian 12 root: the pinned Debian base (made by debootstrap where Docker Hub is
# out of reach).
base=$(sed -n 's/^CPU_BASE_IMAGE=//p' docker/versions.env)
bash docker/local/make-debian-base.sh "$base" >&2

# A failed check keeps its root for inspection (3-4 GB each); the next check removes the ones
# kept before it, or they fill the disk (seen: pip's ENOSPC in tests/images after four).
for kept in /var/tmp/byoc-fresh-root.*; do
    [[ -d $kept ]] && echo "check-fresh-root: removing an earlier check's root, $kept" >&2 && rm -rf -- "$kept"
done
scratch=$(mktemp -d /var/tmp/byoc-fresh-root.XXXXXX)
# The root shares this machine's network (it needs the package registries, and there is no
# NAT here); its own Docker engine gets a bridge of its own instead of docker0, which
# belongs to this machine's engine.
bridge=byocfr$$
bridge=${bridge:0:15}
# shellcheck disable=SC2329  # run by the EXIT trap
cleanup() {
    docker rm -f "byoc-fresh-root-$$" >/dev/null 2>&1 || true
    ip link del "$bridge" 2>/dev/null || true
    if ((keep)); then echo "check-fresh-root: kept $scratch" >&2; else rm -rf -- "$scratch"; fi
}
trap cleanup EXIT

# A clean clone of what is committed (uncommitted edits are not part of a submission).
git clone -q --no-hardlinks "$repo_root" "$scratch/clone"
echo "check-fresh-root: clone of $(git -C "$scratch/clone" rev-parse --short HEAD) in $scratch" >&2

# This machine kind's pip settings, as a fresh machine has them.
mounts=()
for folder in /opt/wheels /opt/pypi /opt/pypi-more /etc/xdg/pip; do
    [ -e "$folder" ] && mounts+=(-v "$folder:$folder:ro")
done
ca=${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}
mounts+=(-v "$ca:/etc/byoc-fresh-root/ca.crt:ro")
pip_env=()
while IFS= read -r line; do pip_env+=(-e "$line"); done < <(env | grep '^PIP_' | grep -v '^PIP_CERT=' || true)
pip_env+=(-e PIP_CERT=/etc/ssl/certs/ca-certificates.crt)

case "$only" in
    '') commands='bash scripts/run-main-job.sh && bash scripts/run-tests.sh "$@"' ;;
    tests) commands='bash scripts/run-tests.sh "$@"' ;;
    main-job) commands='bash scripts/run-main-job.sh' ;;
    *) echo "check-fresh-root: --only tests|main-job" >&2; exit 2 ;;
esac

# Inside: the machine's CA joins Debian's bundle (as on the real machine), git is there to
# have cloned with, then exactly the README's commands. The nested Docker engine keeps its
# data on the scratch folder (overlay2 needs a real file system under it).
inner=$(cat <<'INNER'
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq && apt-get install -y -qq --no-install-recommends ca-certificates git iproute2 >/dev/null
ip link add "$BYOC_FRESH_BRIDGE" type bridge
ip addr add 172.30.0.1/16 dev "$BYOC_FRESH_BRIDGE"
ip link set "$BYOC_FRESH_BRIDGE" up
export BYOC_DOCKERD_ARGS="--bridge=$BYOC_FRESH_BRIDGE"
# On every way out: the root's containers, networks and engine go, so nothing of it stays
# on this machine's network.
finish() {
    docker rm -f $(docker ps -aq) >/dev/null 2>&1 || true
    docker network prune -f >/dev/null 2>&1 || true
    bash /root/project/scripts/docker-engine.sh stop >/dev/null 2>&1 || true
}
trap finish EXIT
cp /etc/byoc-fresh-root/ca.crt /usr/local/share/ca-certificates/byoc-machine-ca.crt
update-ca-certificates >/dev/null 2>&1
cp -a /scratch/clone /root/project && cd /root/project
echo "fresh-root: $(. /etc/os-release; echo "$PRETTY_NAME"), $(nproc) cores; running the README's commands"
INNER
)
inner+=$'\n'"$commands"

mkdir -p "$scratch/docker"
started=$SECONDS
set +e
# --add-host: a Debian install resolves its own host name (127.0.1.1 in /etc/hosts); a host-
# network container's name does not, and gloo/Horovod on one host then fail on it.
docker run --name "byoc-fresh-root-$$" --rm --network host --hostname fresh-root --add-host fresh-root:127.0.1.1 \
    --cap-add ALL --cap-drop SYS_RESOURCE --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
    -v /sys/fs/cgroup:/sys/fs/cgroup:rw \
    -v "$scratch:/scratch" -v "$scratch/docker:/var/lib/byoc-docker" \
    "${mounts[@]}" "${pip_env[@]}" -e BYOC_DOCKER_ROOT=/var/lib/byoc-docker -e "BYOC_FRESH_BRIDGE=$bridge" \
    "$base" bash -c "$inner" fresh-root "${pytest_args[@]}" 2>&1 | tee "$scratch/check.log"
rc=${PIPESTATUS[0]}
set -e
echo "check-fresh-root: exit $rc after $((SECONDS - started)) s (log: $scratch/check.log)" >&2
# The guard against a slow suite creeping in: the suite's total and its 10 slowest tests
# (scripts/run-tests.sh asks pytest for them), again at the very end where they are seen.
summary=$(sed -n '/slowest 10 durations/,/^=\+ .* in [0-9.]\+s/p' "$scratch/check.log" | grep -v '^SKIPPED' || :)
if [ -n "$summary" ]; then
    echo "check-fresh-root: the suite's slowest tests and its total time:" >&2
    echo "$summary" >&2
fi
((rc == 0)) || keep=1
exit "$rc"

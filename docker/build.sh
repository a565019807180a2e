#!/usr/bin/env bash
# Builds one flavour of the image with every version from docker/versions.env passed as
# a --build-arg (the Dockerfiles have no version defaults). Used by buildspec.yml,
# docker/build-and-push.sh and scripts/build-local-image.sh; works with Docker's BuildKit
# (buildx) or its legacy builder.
#
# usage: docker/build.sh --flavor cpu|gpu|trn1 --tag IMAGE:TAG [options] [-- ENGINE_ARGS...]
#   --builder auto|buildx|legacy  auto (default): buildx when `docker buildx` is there.
#                             buildx: `docker buildx build --load` with Docker media types
#                             and no provenance/SBOM attestations (SageMaker rejects OCI
#                             manifests and attestation indexes); legacy: `DOCKER_BUILDKIT=0
#                             docker build` with the same arguments and tags (it writes
#                             Docker media types and no attestations)
#   --set KEY=VALUE           override one versions.env entry for this build, e.g.
#                             --set CPU_BASE_IMAGE=localhost/debian:bookworm (repeatable)
#   --revision SHA            OCI revision label (default: git HEAD)
#   --version VERSION         OCI version label (default: pyproject.toml's version)
#   --source URL              OCI source label (default: git remote origin, if any)
#   --cache-from REF          an earlier image whose layers the build may reuse
#   --wheelhouse DIR          after the build, keep the Horovod wheel it made or reused in
#                             DIR (docker/wheelhouse/<flavor>, which the next build reads;
#                             docker/wheelhouse/README.md). cpu and gpu only
#   --log FILE                the build's whole output to FILE; on stderr one line per build
#                             step that runs, with the elapsed time (docker/build_progress.py;
#                             from $BYOC_SETUP_T0 when set), and on a failure the log's last
#                             40 lines with its path. Without it, Docker's output as it is
#   --print                   print the command (one argument a line) instead of running it
# ENGINE_ARGS go to the build command as they are (e.g. --network host).
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
versions_file="$repo_root/docker/versions.env"

die() { echo "build.sh: $*" >&2; exit 2; }

flavor='' tag='' builder=auto revision='' version='' source_url='' cache_from='' print=0
wheelhouse='' log_file=''
overrides=()
engine_args=()
while (($#)); do
    case "$1" in
        --flavor) flavor=${2:?--flavor needs a value}; shift 2 ;;
        --tag) tag=${2:?--tag needs a value}; shift 2 ;;
        --builder) builder=${2:?--builder needs a value}; shift 2 ;;
        --set) overrides+=("${2:?--set needs KEY=VALUE}"); shift 2 ;;
        --revision) revision=${2?}; shift 2 ;;
        --version) version=${2?}; shift 2 ;;
        --source) source_url=${2?}; shift 2 ;;
        --cache-from) cache_from=${2:?--cache-from needs a value}; shift 2 ;;
        --wheelhouse) wheelhouse=${2:?--wheelhouse needs a folder}; shift 2 ;;
        --log) log_file=${2:?--log needs a file}; shift 2 ;;
        --print) print=1; shift ;;
        --) shift; engine_args=("$@"); break ;;
        -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
done

case "$flavor" in
    cpu) dockerfile=docker/Dockerfile.cpu; prefix=CPU_ ;;
    gpu) dockerfile=Dockerfile.gpu; prefix=GPU_ ;;
    trn1) dockerfile=Dockerfile.trn1; prefix=TRN1_ ;;
    *) die "--flavor must be cpu, gpu or trn1 (got '${flavor}')" ;;
esac
[ -n "$tag" ] || die "--tag is required"
if [ -n "$wheelhouse" ] && [ "$flavor" = trn1 ]; then
    die "--wheelhouse: the trn1 image builds no Horovod"
fi
case "$builder" in auto|buildx|legacy) ;; *) die "--builder must be auto, buildx or legacy" ;; esac

# versions.env → KEY VALUE pairs; --set entries replace values of existing keys only
# (a typo must not pass silently).
declare -A pins=()
order=()
while IFS= read -r line || [ -n "$line" ]; do
    case "$line" in ''|'#'*) continue ;; esac
    [[ "$line" =~ ^[A-Z][A-Z0-9_]*= ]] || die "bad line in versions.env: $line"
    key=${line%%=*}
    pins[$key]=${line#*=}
    order+=("$key")
done <"$versions_file"
for kv in "${overrides[@]}"; do
    key=${kv%%=*}
    [[ "$kv" == *=* && -v "pins[$key]" ]] || die "--set $kv: no such key in versions.env"
    pins[$key]=${kv#*=}
done

# COMMON_X and <FLAVOR>_X become the build argument X; other flavours' keys are left out.
build_args=()
for key in "${order[@]}"; do
    case "$key" in
        COMMON_*) build_args+=(--build-arg "${key#COMMON_}=${pins[$key]}") ;;
        "$prefix"*) build_args+=(--build-arg "${key#"$prefix"}=${pins[$key]}") ;;
    esac
done

if [ -z "$revision" ]; then
    revision=$(git -C "$repo_root" rev-parse HEAD 2>/dev/null || echo unknown)
fi
if [ -z "$version" ]; then
    version=$(sed -n 's/^version *= *"\(.*\)"/\1/p' "$repo_root/pyproject.toml" | head -n1)
fi
if [ -z "$source_url" ]; then
    source_url=$(git -C "$repo_root" remote get-url origin 2>/dev/null || true)
fi
build_args+=(--build-arg "IMAGE_SOURCE=$source_url" --build-arg "IMAGE_REVISION=$revision"
             --build-arg "IMAGE_VERSION=$version")

if [ "$builder" = auto ]; then
    if docker buildx version >/dev/null 2>&1; then builder=buildx; else builder=legacy; fi
fi
if [ "$builder" = buildx ]; then
    cmd=(docker buildx build --provenance=false --sbom=false --load
         --file "$repo_root/$dockerfile" --tag "$tag")
    if [ -n "$cache_from" ]; then
        cmd+=(--cache-from "$cache_from" --build-arg BUILDKIT_INLINE_CACHE=1)
    fi
else
    # The legacy builder: what Docker engines without buildx (Debian's docker.io) have.
    # It reuses its own layer cache; --cache-from names an image whose layers it may reuse.
    cmd=(env DOCKER_BUILDKIT=0 docker build --file "$repo_root/$dockerfile" --tag "$tag")
    if [ -n "$cache_from" ]; then
        cmd+=(--cache-from "$cache_from")
    fi
fi
cmd+=("${build_args[@]}" "${engine_args[@]}" "$repo_root")

if ((print)); then
    printf '%s\n' "${cmd[@]}"
    exit 0
fi
echo "build.sh: building $flavor as $tag with Docker ($builder builder)${log_file:+; log: $log_file}" >&2
run_build() {  # run_build COMMAND...: as it is, or through the progress filter into the log
    if [ -z "$log_file" ]; then
        "$@"
        return
    fi
    mkdir -p "$(dirname "$log_file")"
    local rc=0
    "$@" 2>&1 | python3 "$repo_root/docker/build_progress.py" --log "$log_file" ${BYOC_SETUP_T0:+--start "$BYOC_SETUP_T0"} \
        || rc=$?
    if ((rc != 0)); then
        echo "build.sh: the build failed (exit code $rc). The last 40 lines of $log_file:" >&2
        tail -n 40 "$log_file" | sed 's/^/    /' >&2
    fi
    return "$rc"
}
if [ -z "$wheelhouse" ]; then
    run_build "${cmd[@]}"
    exit
fi
run_build "${cmd[@]}"
# A build whose Horovod step ran and reused a kept wheel made nothing new to keep (the wheel
# is in DIR already): the export below, a second build command and a container, is skipped.
if [ -n "$log_file" ] && grep -q "^install-horovod: reusing the kept wheel " "$log_file"; then
    echo "build.sh: the build reused the Horovod wheel kept in $wheelhouse; nothing new to keep" >&2
    exit 0
fi

# The `wheelhouse` stage: every step is a cache hit of the build above, so this costs
# seconds. Its files replace DIR's only when they differ (an untouched DIR keeps the next
# build's COPY of it a cache hit).
export_dir=$(mktemp -d)
trap 'rm -rf -- "$export_dir"' EXIT
# The same command without its tag, --load and context, and without --no-cache/--pull:
# it must reuse what the build above just made.
stage_cmd=()
for ((i = 0; i < ${#cmd[@]} - 1; i++)); do
    case "${cmd[i]}" in
        --tag) i=$((i + 1)) ;;
        --load|--no-cache|--no-cache=true|--pull|--pull=true) ;;
        *) stage_cmd+=("${cmd[i]}") ;;
    esac
done
if [ "$builder" = buildx ]; then
    stage_cmd+=(--target wheelhouse --output "type=local,dest=$export_dir" "$repo_root")
    if [ -n "$log_file" ]; then "${stage_cmd[@]}" >>"$log_file" 2>&1; else "${stage_cmd[@]}" >&2; fi
else
    stage_cmd+=(--quiet --target wheelhouse "$repo_root")
    stage_image=$("${stage_cmd[@]}")
    container=$(docker create "$stage_image" /none)
    docker cp "$container:/wheels" "$export_dir/" >/dev/null
    docker rm "$container" >/dev/null
fi
[ -d "$export_dir/wheels" ] || die "--wheelhouse: the build's wheelhouse stage has no /wheels"
mkdir -p "$wheelhouse"
if diff -r -q --exclude=.gitkeep "$export_dir/wheels" "$wheelhouse" >/dev/null 2>&1; then
    echo "build.sh: $wheelhouse already holds this build's Horovod wheel" >&2
else
    find "$wheelhouse" -mindepth 1 -maxdepth 1 ! -name .gitkeep -exec rm -rf -- {} +
    cp -r "$export_dir/wheels/." "$wheelhouse/"
    echo "build.sh: kept this build's Horovod wheel in $wheelhouse: $(cd "$wheelhouse" && echo horovod-*)" >&2
fi

#!/usr/bin/env bash
# Installs what the project's commands need on a fresh Debian 12 machine, and nothing twice:
#   - Debian packages: Python (with its headers: sagemaker-training builds a C extension),
#     Open MPI (mpirun + headers for mpi4py and Horovod), OpenSSH server/client, iproute2,
#     cmake/g++, and Docker: Debian's engine, docker-compose, a registry, debootstrap.
#   - A project-local virtual environment in .venv with the package and its exact torch stack.
#   - The SageMaker Python SDK v2 in .venv-sdk-v2 (the version pinned in pyproject.toml).
# and, for the tests only (--for tests, the default):
#   - Debian's chromium (tests/entrypoint/jobreport/test_report_html.py screenshots the job report);
#   - the test tools in .venv and Horovod (its wheel shared with the CPU image's build:
#     compiled at most once per machine, docker/wheelhouse/README.md);
#   - the SDK v3 in .venv-sdk-v3 (about 1 GB; only tests/localmode uses it).
#
# usage: scripts/bootstrap.sh [--for tests|main-job] [--sdk v2|v3] [--with-horovod]
#   --for main-job   what `scripts/run-main-job.sh` needs, nothing more
#   --sdk v3         the main job's SDK (run-main-job.sh --sdk v3): .venv-sdk-v3 instead of .venv-sdk-v2
#   --with-horovod   Horovod in .venv as well (the main job's --emulated runs need it)
#   --horovod-wheel  Horovod's wheel only, kept in docker/wheelhouse/cpu for the CPU image's
#                    build (run-main-job.sh: compiled here, beside the image's first stages)
#   --apt-only       the Debian packages only (run-main-job.sh starts the image build after them)
# Each stage with work to do prints one line (scripts/lib/stages.sh); its output goes to
# .work/setup-logs/. Safe to run again: each stage checks what is already there.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
# shellcheck source=scripts/lib/stages.sh
source scripts/lib/stages.sh

purpose=tests horovod=0 apt_only=0 main_sdk=v2
while (($#)); do
    case "$1" in
        --for) purpose=${2:?--for needs tests or main-job}; shift 2 ;;
        --with-horovod) horovod=1; shift ;;
        --horovod-wheel) ((horovod)) || horovod=wheel; shift ;;
        --apt-only) apt_only=1; shift ;;
        --sdk) main_sdk=${2:?--sdk needs v2 or v3}; shift 2 ;;
        *) echo "bootstrap: unknown argument $1" >&2; exit 2 ;;
    esac
done
case "$purpose" in
    tests) horovod=1 extras=test,stack sdks=(v2 v3) test_apt=(chromium) ;;  # Horovod installed in .venv
    main-job) extras=stack sdks=("$main_sdk") test_apt=() ;;
    *) echo "bootstrap: --for tests|main-job (got '$purpose')" >&2; exit 2 ;;
esac
started=$SECONDS did=0

apt_packages=(python3 python3-venv python3-dev python3-pip ca-certificates git
              openmpi-bin libopenmpi-dev openssh-server openssh-client iproute2 procps util-linux cmake g++ make
              docker.io docker-compose docker-registry debootstrap)
find_missing() {  # find_missing PKG...: the Debian packages of these not installed
    local pkg
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || echo "$pkg"
    done
}
install_apt() {  # install_apt PKG...
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"
}
need_root_for() {
    if [ "$(id -u)" -ne 0 ]; then
        echo "bootstrap: need root (or sudo) to apt-get install: $*" >&2
        exit 1
    fi
}
mapfile -t missing < <(find_missing "${apt_packages[@]}")
mapfile -t test_missing < <(find_missing "${test_apt[@]}")
if ((${#missing[@]})); then  # the test-only ones with them: one apt run
    need_root_for "${missing[@]}" "${test_missing[@]}"
    stage apt "Debian packages (${#missing[@]}: Python, Open MPI, OpenSSH, compilers, Docker${test_apt:+, chromium})" \
        install_apt "${missing[@]}" "${test_missing[@]}"
    test_missing=() did=1
fi

if ((apt_only)); then
    exit 0
fi

# What waits on the network and touches nothing of the venv's install runs beside it
# (stage_in_background, scripts/lib/stages.sh): the test-only Debian packages, Horovod's wheel,
# the SDKs' venvs. A failed set-up leaves none of them running.
trap stop_background_stages EXIT
if ((${#test_missing[@]})); then
    need_root_for "${test_missing[@]}"
    stage_in_background apt-tests "Debian packages for the tests (${test_missing[*]}), in the background" \
        install_apt "${test_missing[@]}"
    did=1
fi

python_bin="${PYTHON:-python3}"
# pip's notes about index folders this machine's pip.conf names but lacks are noise.
# --no-compile: pip would compile every module's bytecode at install (~60 s of CPU for the main
# job's venvs, beside Horovod's compile); Python compiles what is imported, once, instead.
pip_install() { "$@" --no-compile 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2); }

# .venv: reinstalled only when pyproject.toml changed. One stamp per extras set; the full set
# (test,stack) keeps the stamp's historic name, and satisfies the main job's too.
stamp_for() { if [ "$1" = test,stack ]; then echo .venv/.installed-pyproject.sha256; else echo ".venv/.installed-pyproject-$1.sha256"; fi; }
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
venv_current() {
    [ "$(cat "$(stamp_for "$extras")" 2>/dev/null)" = "$want" ] && return 0
    [ "$extras" = stack ] && [ "$(cat "$(stamp_for test,stack)" 2>/dev/null)" = "$want" ]
}
install_venv() {
    [ -x .venv/bin/python ] || "$python_bin" -m venv .venv
    pip_install .venv/bin/python -m pip install --disable-pip-version-check -e ".[$extras]"
    echo "$want" >"$(stamp_for "$extras")"
}
# Horovod: docker/scripts/install-horovod.sh, the image's own installer, run against .venv.
# It installs a wheel kept in docker/wheelhouse/cpu whose build facts (torch and its C++ ABI,
# Open MPI, the CPython ABI, compiler, cmake, glibc, the script) are this venv's, and
# compiles (~3 minutes on 2 cores, more beside other work) only when there is none; a
# compiled wheel is kept there, where the CPU image's build finds it. The compile needs only
# torch, so torch goes into .venv first and the wheel is made in the background, beside the
# rest of the venv and the SDKs' installs (they mostly download, it compiles); the install
# into .venv waits for them (one pip at a time in a venv).
horovod_step() {  # horovod_step wheel|install
    local out
    out=$(mktemp -d)
    PATH="$repo_root/.venv/bin:$PATH" WHEELHOUSE_IN="$repo_root/docker/wheelhouse/cpu" WHEELS_OUT="$out" \
        PYPI_HOROVOD_VERSION="$(sed -n 's/^CPU_PYPI_HOROVOD_VERSION=//p' docker/versions.env)" \
        HOROVOD_WHEEL_ONLY=$([ "$1" = wheel ] && echo 1 || echo 0) bash docker/scripts/install-horovod.sh
    local entry
    for entry in "$out"/horovod-*; do
        [ -e "docker/wheelhouse/cpu/$(basename "$entry")" ] || cp -r "$entry" docker/wheelhouse/cpu/
    done
    rm -rf -- "$out"
}
install_torch() {  # the stack extra's pins (torch, numpy): what Horovod's compile needs
    [ -x .venv/bin/python ] || "$python_bin" -m venv .venv
    local pins
    mapfile -t pins < <("$python_bin" -c 'import tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["stack"]))')
    pip_install .venv/bin/python -m pip install --disable-pip-version-check "${pins[@]}"
}
# A wheel kept for this Horovod and this installer: cheap to tell (no torch import), and what
# the image's build will most likely reuse (it checks all the facts itself).
kept_wheel_for_this_installer() {
    local version facts
    version=$(sed -n 's/^CPU_PYPI_HOROVOD_VERSION=//p' docker/versions.env)
    facts="install-horovod.sh $(sha256sum docker/scripts/install-horovod.sh | cut -d' ' -f1)"
    for entry in docker/wheelhouse/cpu/horovod-"$version"-*/; do
        [ "$(head -n1 "$entry/build-facts.txt" 2>/dev/null)" = "$facts" ] && compgen -G "$entry/*.whl" >/dev/null && return 0
    done
    return 1
}
wheel=0
if [ "$horovod" = wheel ] && kept_wheel_for_this_installer; then
    :  # nothing to make
elif [ "$horovod" != 0 ] && ! .venv/bin/python -c 'import horovod.torch' 2>/dev/null; then
    if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
        stage torch "torch and numpy in .venv first (Horovod's compile needs them)" install_torch
    fi
    stage_in_background horovod-wheel \
        "Horovod's wheel (a kept one when it matches, else a compile of ~3-6 min), in the background" horovod_step wheel
    wheel=1 did=1
fi

# The SDKs' venvs: only the pinned sagemaker package (each major version in its own venv,
# since both are the distribution `sagemaker`); reinstalled when its pin changes. In the
# background: they download, beside the venv's install.
for major in "${sdks[@]}"; do
    pin=$("$python_bin" - "$major" <<'PY'
import sys, tomllib
extras = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]
print(" ".join(extras["sdk-" + sys.argv[1]]))
PY
)
    venv=.venv-sdk-$major
    install_sdk() {
        [ -x "$venv/bin/python" ] || "$python_bin" -m venv "$venv"
        # shellcheck disable=SC2086
        pip_install "$venv/bin/python" -m pip install --disable-pip-version-check $pin
        echo "$pin" >"$venv/.installed"
    }
    if [ "$(cat "$venv/.installed" 2>/dev/null)" != "$pin" ]; then
        stage_in_background "sdk-$major" "the SageMaker Python SDK $major in $venv ($pin), in the background" install_sdk
        did=1
    fi
done

if ! venv_current; then
    stage venv "the development venv .venv: the project, torch and its stack (.[$extras])" install_venv
    did=1
fi

wait_background_stages  # the first that failed ends the set-up, with its exit code
trap - EXIT
if ((wheel)); then
    if [ "$horovod" = 1 ]; then
        stage horovod "Horovod in .venv (the wheel just kept)" horovod_step install
    fi
fi
if ((did)); then
    say_stage "set-up done in $((SECONDS - started)) s"
else
    say_stage "set-up: everything already installed"
fi

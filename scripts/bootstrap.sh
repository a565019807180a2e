#!/usr/bin/env bash
# Installs everything the project needs on a fresh Debian 12 machine, and nothing twice:
#   - Debian packages: Python (with its headers: sagemaker-training builds a C extension),
#     Open MPI (mpirun + headers for mpi4py), OpenSSH server/client, iproute2, and what the
#     image tests need: Debian's Docker engine, docker-compose, a registry, debootstrap.
#   - A project-local virtual environment in .venv with the package and its test extras.
#   - One venv per SageMaker Python SDK major version (.venv-sdk-v2, .venv-sdk-v3) with the
#     version pinned in pyproject.toml's sdk-v2 / sdk-v3 extras, for the local-mode tests.
# Safe to run again: each step checks what is already there.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

apt_packages=(python3 python3-venv python3-dev python3-pip ca-certificates git
              openmpi-bin libopenmpi-dev openssh-server openssh-client iproute2 procps util-linux cmake g++ make
              docker.io docker-compose docker-registry debootstrap)

missing=()
for pkg in "${apt_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
    echo "bootstrap: installing Debian packages: ${missing[*]}"
    if [ "$(id -u)" -ne 0 ]; then
        echo "bootstrap: need root (or sudo) to apt-get install: ${missing[*]}" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

python_bin="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    echo "bootstrap: creating .venv with $($python_bin --version)"
    "$python_bin" -m venv .venv
fi

# Reinstall only when the dependency list changed.
stamp=.venv/.installed-pyproject.sha256
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "bootstrap: installing the project and its test dependencies into .venv"
    .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test,stack]' \
        2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
    echo "$want" > "$stamp"
fi

# Horovod 0.28.1 needs a C++17 patch to build against torch 2.13: scripts/build-horovod-wheel.sh
# builds that wheel once into a wheelhouse outside the repo (~3 minutes on 2 cores).
if ! .venv/bin/python -c 'import horovod.torch' 2>/dev/null; then
    echo "bootstrap: building and installing Horovod (the horovod extra)"
    bash scripts/build-horovod-wheel.sh
    .venv/bin/python -m pip install -q --disable-pip-version-check \
        --find-links "${BYOC_WHEELHOUSE:-$HOME/.cache/byoc-wheelhouse}" -e '.[test,stack,horovod]' \
        2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
fi

# The SDKs' venvs: only the pinned sagemaker package (each major version in its own venv,
# since both are the distribution `sagemaker`); reinstalled when its pin changes.
for major in v2 v3; do
    pin=$(.venv/bin/python - "$major" <<'PY'
import sys, tomllib
extras = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]
print(" ".join(extras["sdk-" + sys.argv[1]]))
PY
)
    venv=.venv-sdk-$major
    if [ "$(cat "$venv/.installed" 2>/dev/null)" != "$pin" ]; then
        echo "bootstrap: installing $pin into $venv"
        [ -x "$venv/bin/python" ] || "$python_bin" -m venv "$venv"
        # shellcheck disable=SC2086
        "$venv/bin/python" -m pip install -q --disable-pip-version-check $pin \
            2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
        echo "$pin" >"$venv/.installed"
    fi
done

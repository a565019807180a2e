#!/usr/bin/env bash
# The image's Python environment: a venv at $VENV (default /opt/venv) on the system
# python3, with pip/setuptools/wheel pinned. The image puts $VENV/bin on PATH, so
# `python3` and `pip` are the venv's.
# Env: PYPI_PIP_VERSION, PYPI_SETUPTOOLS_VERSION, PYPI_WHEEL_VERSION (docker/versions.env).
set -euo pipefail
: "${PYPI_PIP_VERSION:?from docker/versions.env}"
: "${PYPI_SETUPTOOLS_VERSION:?from docker/versions.env}"
: "${PYPI_WHEEL_VERSION:?from docker/versions.env}"
venv=${VENV:-/opt/venv}

/usr/bin/python3 -m venv "$venv"
"$venv/bin/python3" -m pip install --no-cache-dir -q \
    "pip==$PYPI_PIP_VERSION" "setuptools==$PYPI_SETUPTOOLS_VERSION" "wheel==$PYPI_WHEEL_VERSION"

# The check.
"$venv/bin/python3" -m pip --version
test "$("$venv/bin/python3" -c 'import setuptools; print(setuptools.__version__)')" = "$PYPI_SETUPTOOLS_VERSION"

#!/usr/bin/env bash
# The check after installing torch.compile's run-time needs: g++ builds a shared object
# that includes Python.h, as Inductor's C++ backend does for every graph it compiles.
set -euo pipefail
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
include=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
printf '#include <Python.h>\nextern "C" int byoc_check(void) { return PY_MAJOR_VERSION; }\n' >"$work/check.cpp"
g++ -shared -fPIC -O2 -I"$include" "$work/check.cpp" -o "$work/check.so"
echo "check-compiler: $(g++ --version | head -n1); Python.h from $include"

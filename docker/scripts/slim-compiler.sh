#!/usr/bin/env bash
# After install-apt-packages.sh ${APT_COMPILE_PACKAGES}: removes the parts of the compilers
# that compiling a graph at run time never uses, in the same layer (about 130 MB of the
# 296 MB they add; docs/compile-cache.md). Inductor runs `g++ -shared -fPIC -O3 ...` against
# Python.h and torch's headers, and Triton `gcc -shared` on its launcher: neither asks for
# link-time optimisation (lto1, lto-dump), a sanitizer's runtime, libpython's static archive,
# or the compilers' translations and docs. dpkg still lists the files; reinstalling a package
# (`apt-get install --reinstall gcc-12`) brings them back.
set -euo pipefail
before=$(du -smc /usr 2>/dev/null | tail -n1 | cut -f1)
shopt -s nullglob
paths=(
    /usr/bin/lto-dump-* /usr/bin/x86_64-linux-gnu-lto-dump-*
    /usr/lib/gcc/x86_64-linux-gnu/*/lto1 /usr/libexec/gcc/x86_64-linux-gnu/*/lto1
    /usr/lib/x86_64-linux-gnu/lib{asan,tsan,lsan,ubsan,hwasan}.so.*
    /usr/lib/gcc/x86_64-linux-gnu/*/lib{asan,tsan,lsan,ubsan,hwasan}*
    /usr/lib/python3*/config-*/libpython3*.a /usr/lib/x86_64-linux-gnu/libpython3*.a
    /usr/share/locale/*/LC_MESSAGES/{gcc,cpplib,binutils,bfd,gas,gprof,gprofng,ld,opcodes}*.mo
    /usr/share/doc/{gcc,g++,cpp,binutils,libpython3,python3}*
)
rm -rf "${paths[@]}"
after=$(du -smc /usr 2>/dev/null | tail -n1 | cut -f1)
echo "slim-compiler: /usr ${before} MB -> ${after} MB"

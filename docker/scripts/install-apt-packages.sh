#!/usr/bin/env bash
# Installs Debian/Ubuntu packages in one layer and leaves no apt lists or caches behind.
# usage: install-apt-packages.sh PACKAGE[=VERSION]...
#        install-apt-packages.sh --update-lists   (only fetch the lists, for installers
#                                                  that run apt-get themselves, like EFA's)
# Versions come from docker/versions.env: exact `name=version` pins on Debian; on Ubuntu
# plain names read from the archive as it was at APT_SNAPSHOT (apt >= 2.7). The snapshot
# is set in /etc/apt/apt.conf.d/50-byoc-snapshot, so every later apt-get of the build
# (EFA's installer included) reads the same dated archive; the file stays in the image,
# so `apt-get install` in a derived image is reproducible too (delete it to read the
# live archive).
# Ends by checking that every named package is installed (at the pinned version).
set -euo pipefail

snapshot_conf=/etc/apt/apt.conf.d/50-byoc-snapshot
export DEBIAN_FRONTEND=noninteractive

update_lists() {
    if [ -z "${APT_SNAPSHOT:-}" ]; then
        apt-get -o Acquire::Retries=3 update -qq
        return
    fi
    # apt finds a source's snapshot server from the Release file of a plain update, and
    # the snapshot service is https only: a bare base first needs the CA bundle, from the
    # archive state the base image was made with.
    rm -f "$snapshot_conf"
    apt-get -o Acquire::Retries=3 update -qq
    if [ ! -s /etc/ssl/certs/ca-certificates.crt ]; then
        apt-get install -y -qq --no-install-recommends ca-certificates >/dev/null
    fi
    printf 'APT::Snapshot "%s";\n' "$APT_SNAPSHOT" >"$snapshot_conf"
    apt-get -o Acquire::Retries=3 update -qq
}

if [ "${1:-}" = --update-lists ]; then
    update_lists
    exit 0
fi
if (($# == 0)); then
    # The Dockerfiles pass ${APT_RUNTIME_PACKAGES} / ${APT_BUILD_PACKAGES}: empty means the
    # build was started without the build arguments (a plain `docker build`).
    echo "install-apt-packages: no packages named: the build argument APT_RUNTIME_PACKAGES" \
         "(or APT_BUILD_PACKAGES) is empty. Every build argument's value is in" \
         "docker/versions.env; build with docker/build.sh --flavor cpu|gpu|trn1, which passes" \
         "them all as --build-arg." >&2
    exit 2
fi

update_lists
# dpkg's progress lines go nowhere; errors still reach stderr.
apt-get -o Acquire::Retries=3 install -y -qq --no-install-recommends "$@" >/dev/null
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt/* /var/log/dpkg.log

# The check: each package is installed, at the version asked for where one was.
for spec in "$@"; do
    name=${spec%%=*}
    installed=$(dpkg-query -W -f='${db:Status-Status} ${Version}' "$name" 2>/dev/null || true)
    case "$installed" in
        "installed "*) ;;
        *) echo "install-apt-packages: $name is not installed" >&2; exit 1 ;;
    esac
    # Unquoted on the right: a pin may end in `*` (Neuron's versions carry a build suffix).
    # shellcheck disable=SC2053
    if [ "$spec" != "$name" ] && [[ "${installed#installed }" != ${spec#*=} ]]; then
        echo "install-apt-packages: $name is ${installed#installed }, wanted ${spec#*=}" >&2
        exit 1
    fi
done
echo "install-apt-packages: installed $*"

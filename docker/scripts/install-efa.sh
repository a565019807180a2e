#!/usr/bin/env bash
# AWS EFA from AWS's installer tarball at exactly EFA_INSTALLER_VERSION, its signature
# checked against AWS's EFA signing key (by EFA_GPG_FINGERPRINT) before anything runs.
# Brings libfabric, rdma-core, Open MPI (/opt/amazon/openmpi) and, on CUDA images, the
# aws-ofi-nccl plugin. Container flags: no kernel module, no limits.conf, no self-test
# (no EFA device at build time); --disable-ngc keeps the NCCL plugin on nvidia/cuda bases.
# usage: install-efa.sh [--with-nccl-plugin] [--mpi-headers]
# Needs curl and gnupg (installed by the stage's apt step) and install-apt-packages.sh.
#
# EFA_INSTALLER_VERSION=none builds without EFA, for instance types without it (g5, g6, …)
# and for machines that cannot download the installer: Open MPI then comes from the
# distribution (openmpi-bin; with --mpi-headers, for the builder stage, libopenmpi-dev), and
# the image has no libfabric and no aws-ofi-nccl plugin. record-versions.py writes
# EFA_INSTALLER=none, and the launcher's EFA pre-flight names what such an image lacks when a
# multi-host job runs on an instance with EFA (docs/images.md).
set -euo pipefail
: "${EFA_INSTALLER_VERSION:?from docker/versions.env (none: no EFA)}"
with_plugin='' mpi_headers=0
for arg in "$@"; do
    case "$arg" in
        --with-nccl-plugin) with_plugin=$arg ;;
        --mpi-headers) mpi_headers=1 ;;
        *) echo "install-efa: unknown argument $arg" >&2; exit 2 ;;
    esac
done

if [ "$EFA_INSTALLER_VERSION" = none ]; then
    packages=(openmpi-bin)
    ((mpi_headers)) && packages+=(libopenmpi-dev)
    /usr/local/byoc/build/install-apt-packages.sh "${packages[@]}"
    echo "install-efa: EFA_INSTALLER_VERSION=none: no EFA, no libfabric, no aws-ofi-nccl plugin;" \
         "Open MPI from the distribution: $(mpirun --version | head -n1)"
    exit 0
fi
: "${EFA_GPG_FINGERPRINT:?from docker/versions.env}"

base_url=https://efa-installer.amazonaws.com
work=$(mktemp -d)
trap 'rm -rf -- "$work"' EXIT
cd "$work"
tarball="aws-efa-installer-$EFA_INSTALLER_VERSION.tar.gz"
curl -fsSL --retry 3 -o "$tarball" "$base_url/$tarball"
curl -fsSL --retry 3 -o "$tarball.sig" "$base_url/$tarball.sig"
curl -fsSL --retry 3 -o efa.key "$base_url/aws-efa-installer.key"

export GNUPGHOME="$work/gnupg"
install -d -m 700 "$GNUPGHOME"
gpg --batch --quiet --import efa.key
fingerprints=$(gpg --batch --with-colons --fingerprint | awk -F: '$1 == "fpr" {print $10}')
grep -qx "$EFA_GPG_FINGERPRINT" <<<"$fingerprints" || {
    echo "install-efa: the EFA signing key's fingerprint is not $EFA_GPG_FINGERPRINT" >&2
    exit 1
}
gpg --batch --verify "$tarball.sig" "$tarball"

tar -xzf "$tarball"
flags=(-y --skip-kmod --skip-limit-conf --no-verify)
if [ "$with_plugin" = --with-nccl-plugin ]; then
    flags+=(--disable-ngc)
fi
# The installer runs apt-get itself: give it lists (of the snapshot, where one is pinned).
/usr/local/byoc/build/install-apt-packages.sh --update-lists
(cd aws-efa-installer && ./efa_installer.sh "${flags[@]}")
apt-get clean
rm -rf /var/lib/apt/lists/*

# The check: libfabric lists the efa provider build, Open MPI runs, and on CUDA images
# the aws-ofi-nccl plugin file exists.
/opt/amazon/efa/bin/fi_info --version
/opt/amazon/openmpi/bin/mpirun --version | head -n1
if [ "$with_plugin" = --with-nccl-plugin ]; then
    plugin=$(compgen -G '/opt/amazon/ofi-nccl/lib*/libnccl-net-ofi.so' | head -n1 || true)
    [ -n "$plugin" ] || { echo "install-efa: no libnccl-net-ofi.so under /opt/amazon/ofi-nccl" >&2; exit 1; }
    echo "install-efa: NCCL plugin $plugin"
fi

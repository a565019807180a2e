#!/usr/bin/env bash
# Open MPI defaults for containers on SageMaker: no process binding (the launcher decides)
# and slot mapping. Written to the openmpi-mca-params.conf of whichever Open MPI
# `ompi_info` belongs to (Debian's under /etc/openmpi, EFA's under /opt/amazon/openmpi/etc).
# Not set here: btl_tcp_if_exclude (the AWS images set lo,docker0). Open MPI refuses
# btl_tcp_if_include and btl_tcp_if_exclude together ("mutually exclusive"), and the
# launcher passes btl_tcp_if_include <iface>; with both, the TCP BTL drops out and ranks on
# different hosts crash in their first collective (seen in tests/images). Open MPI's own
# default exclude already leaves out the loopback, and a container has no docker0.
# Running as root is allowed through OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM) in the image ENV,
# not through a wrapper script around mpirun.
# usage: configure-openmpi.sh [--nccl-conf]   (--nccl-conf also writes /etc/nccl.conf)
set -euo pipefail

sysconfdir=$(ompi_info --parsable --path sysconfdir | awk -F: '$1 == "path" && $2 == "sysconfdir" {print $3}')
if [ -z "$sysconfdir" ] || [ ! -d "$sysconfdir" ]; then
    echo "configure-openmpi: ompi_info names no sysconfdir" >&2
    exit 1
fi
conf="$sysconfdir/openmpi-mca-params.conf"
cat >>"$conf" <<'CONF'

# --- sagemaker-byoc-training (docker/scripts/configure-openmpi.sh) ---
hwloc_base_binding_policy = none
rmaps_base_mapping_policy = slot
CONF

if [ "${1:-}" = "--nccl-conf" ]; then
    printf 'NCCL_SOCKET_IFNAME=^docker0,lo\n' >/etc/nccl.conf
fi

# The check: mpirun runs and Open MPI reads the values back from the file.
mpirun --version | head -n1
params=$(ompi_info --parsable --all)
for want in 'hwloc_base_binding_policy:value:none' 'rmaps_base_mapping_policy:value:slot'; do
    grep -q "$want" <<<"$params" || { echo "configure-openmpi: $want not in effect" >&2; exit 1; }
done
echo "configure-openmpi: $conf"

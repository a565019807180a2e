#!/usr/bin/env bash
# The Neuron system packages for trn1 from Neuron's apt repository (signed-by its
# keyring), each at its pinned version: aws-neuronx-runtime-lib, aws-neuronx-collectives,
# aws-neuronx-tools. No aws-neuronx-dkms: the driver lives on the host.
set -euo pipefail
: "${NEURON_APT_URL:?from docker/versions.env}"
: "${NEURON_RUNTIME_LIB_VERSION:?from docker/versions.env}"
: "${NEURON_COLLECTIVES_VERSION:?from docker/versions.env}"
: "${NEURON_TOOLS_VERSION:?from docker/versions.env}"

# shellcheck source=/dev/null
. /etc/os-release
install -d -m 755 /etc/apt/keyrings
curl -fsSL --retry 3 "$NEURON_APT_URL/GPG-PUB-KEY-AMAZON-AWS-NEURON.PUB" \
    | gpg --batch --dearmor -o /etc/apt/keyrings/neuron.gpg
echo "deb [signed-by=/etc/apt/keyrings/neuron.gpg] $NEURON_APT_URL $VERSION_CODENAME main" \
    >/etc/apt/sources.list.d/neuron.list
# Neuron's package versions carry a build suffix (2.33.10.0-<hash>): the pin matches the
# release part and install-apt-packages.sh checks it.
/usr/local/byoc/build/install-apt-packages.sh \
    "aws-neuronx-runtime-lib=$NEURON_RUNTIME_LIB_VERSION-*" \
    "aws-neuronx-collectives=$NEURON_COLLECTIVES_VERSION-*" \
    "aws-neuronx-tools=$NEURON_TOOLS_VERSION-*"

# The check: the tools run (neuron-ls needs no device for --version).
/opt/aws/neuron/bin/neuron-ls --version
test -e /opt/aws/neuron/lib/libnrt.so.1 || compgen -G '/opt/aws/neuron/lib/libnrt.so*' >/dev/null

# shellcheck shell=bash
# Read by every non-interactive bash (the image sets BASH_ENV to this file), which
# includes the driver scripts SageMaker SDK v3 runs with `bash -c`, bypassing the
# ENTRYPOINT. Prepares what sshd needs and the image does not bake in:
#   - /run/sshd, sshd's privilege-separation folder (/run is often a fresh tmpfs);
#   - host keys of this container only (ssh-keygen -A makes just the missing ones), so
#     no two containers of the image share a private key.
# Quiet and never fails (not even under `bash -e`): it runs before whatever the caller
# asked bash to do.
if [ "$(id -u)" = 0 ]; then
    { [ -d /run/sshd ] || mkdir -m 755 /run/sshd; } 2>/dev/null || :
    { [ -e /etc/ssh/ssh_host_ed25519_key ] || ssh-keygen -A; } >/dev/null 2>&1 || :
fi

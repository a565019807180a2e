#!/usr/bin/env bash
# sshd for mpirun over SSH between the hosts of one training job, with NO key baked into
# the image: host keys and the root key pair are made per job at run time (by the
# launcher, or by /etc/byoc/bash-env.sh when a platform bypasses the ENTRYPOINT), so no
# two copies of the image share a private key.
#  - removes the host keys the openssh-server package generated at install time; the one
#    host key sshd uses with this configuration is /dev/shm/byoc-sshd/ssh_host_ed25519_key;
#  - a drop-in sshd config: keys only, root by key only, no PAM (pam_loginuid fails in
#    containers), no DNS lookups, and the image's PATH/LD_LIBRARY_PATH for SSH sessions
#    (sshd otherwise gives them its own default PATH, without the venv or Open MPI);
#  - root's ssh client config: no host key prompts or known_hosts (host keys are new for
#    every job), batch mode.
# /run/sshd (sshd's privilege-separation folder) is made at run time: /run is often a
# fresh tmpfs in a container.
set -euo pipefail

rm -f /etc/ssh/ssh_host_*
rm -rf /root/.ssh
install -d -m 700 /root/.ssh

conf_d=/etc/ssh/sshd_config.d
install -d -m 755 "$conf_d"
{
    echo "# sagemaker-byoc-training (docker/scripts/configure-sshd.sh)"
    # Made per container by /etc/byoc/bash-env.sh, on a tmpfs (never in the writable layer).
    echo "HostKey /dev/shm/byoc-sshd/ssh_host_ed25519_key"
    echo "PermitRootLogin prohibit-password"
    echo "PubkeyAuthentication yes"
    echo "PasswordAuthentication no"
    echo "KbdInteractiveAuthentication no"
    echo "UsePAM no"
    echo "UseDNS no"
    echo "X11Forwarding no"
    echo "PrintMotd no"
    echo "SetEnv PATH=$PATH${LD_LIBRARY_PATH:+ LD_LIBRARY_PATH=$LD_LIBRARY_PATH}"
} >"$conf_d/50-byoc.conf"

cat >/root/.ssh/config <<'CONF'
Host *
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    LogLevel ERROR
    BatchMode yes
    ConnectTimeout 10
CONF
chmod 600 /root/.ssh/config

# The check: sshd accepts the configuration (with a throwaway host key that is deleted
# right after), and no key is left in the image.
tmp=$(mktemp -d)
trap 'rm -rf -- "$tmp"' EXIT
ssh-keygen -q -t ed25519 -N '' -f "$tmp/hostkey"
install -d -m 755 /run/sshd
/usr/sbin/sshd -t -h "$tmp/hostkey"
rmdir /run/sshd
if compgen -G '/etc/ssh/ssh_host_*' >/dev/null || compgen -G '/root/.ssh/id_*' >/dev/null; then
    echo "configure-sshd: a key is left in the image" >&2
    exit 1
fi
ssh -V
echo "configure-sshd: sshd configured, no keys baked in"

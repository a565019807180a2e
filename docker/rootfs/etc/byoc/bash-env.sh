# shellcheck shell=bash
# Read by every non-interactive bash (the image sets BASH_ENV to this file), which
# includes the driver scripts SageMaker SDK v3 runs with `bash -c`, bypassing the
# ENTRYPOINT. Prepares what sshd needs and the image does not bake in:
#   - /run/sshd, sshd's privilege-separation folder (/run is often a fresh tmpfs);
#   - this container's own ed25519 host key, so no two containers of the image share a
#     private key. It lives in /dev/shm (a tmpfs in every container, Docker's and
#     SageMaker's), which the image's sshd drop-in names as its HostKey: nothing private is
#     written to the container's writable layer, so `docker export` of a stopped container
#     finds no key. mkdir is the once-per-container guard, as below; ssh-keygen never reads
#     the caller's stdin.
# In any SDK v3 job, BYOC_WHOLE_LINES=1: its ranks write whole lines (docker/scripts/
# install-our-packages.sh); and BYOC_JOB_NCCL_PROTO records, before v3's drivers overwrite it
# with "simple", whether the job set NCCL_PROTO itself (`set:<value>`) or not (`unset`).
# In an SDK v3 MPI or torchrun job (its sm_train.sh runs mpi_driver.py or torchrun_driver.py):
#   - /usr/local/byoc/sdk-v3/bin first on PATH: an `mpirun` that corrects v3's process count
#     and its nonexistent "ethwe" interface (entrypoint/sdk_v3/mpirun.py), and, like a
#     `torchrun` there (entrypoint/sdk_v3/torchrun.py), gives the ranks back the job's own
#     NCCL protocol choice (NCCL's and aws-ofi-nccl's when the job made none);
# In an MPI job also, once per container:
#   - in the background, the per-job SSH trust exchange v3's driver needs (root's client key is
#     this container's host key; the peers' keys are learnt with ssh-keyscan and authorized
#     only from their addresses: entrypoint/sdk_v3/peer_trust.py, docs/multi-host.md).
# Quiet, fast and never fails (not even under `bash -e` or `bash -u`): it runs before whatever
# the caller asked bash to do, in the caller's shell. Hence builtins only on the common path
# ($EUID, not `id -u`), every name it sets starts with _byoc_ and is unset at the end, and the
# helper is started detached (a subshell's child), so no caller's `wait` waits for it.
#
# First, an SDK v3 ModelTrainer job: the `bash -c "… sm_drivers/sm_train.sh"` v3 runs instead of
# the ENTRYPOINT hands the job to our launcher before sm_train.sh starts. exec keeps the PID (1,
# as under `docker run <image> train`); the launcher reads v3's definition (entrypoint/job/
# v3_definition.py) and runs it, or runs this same command again with BYOC_SDK_V3_RUN=sdk when it
# does not understand it or BYOC_SDK_V3_DRIVERS=sdk asks for v3's own drivers. Its processes carry
# BYOC_SDK_V3_RUN=launched: no bash below it hands anything over or prepares for v3's drivers.
if [ -z "${BYOC_SDK_V3_RUN:-}" ] && [ -f /opt/ml/input/data/sm_drivers/sm_train.sh ]; then
    case "${BASH_EXECUTION_STRING:-}" in
        *sm_drivers/sm_train.sh*)
            export BYOC_SDK_V3_RUN=byoc BYOC_SDK_V3_COMMAND="$BASH_EXECUTION_STRING"
            exec python3 -m entrypoint train ;;  # as the ENTRYPOINT; cwd: the WORKDIR, v3 mounts no code there
    esac
fi
# What follows serves v3's own drivers (the fallback above, and v3 jobs started otherwise).
if [ "${EUID:-}" = 0 ] && [ "${BYOC_SDK_V3_RUN:-}" != launched ]; then
    { [ -d /run/sshd ] || mkdir -m 755 /run/sshd; } 2>/dev/null || :
    # `[ -d ]` first: a builtin, so a bash after the first forks nothing here.
    [ -d /dev/shm/byoc-sshd ] || { mkdir -m 700 /dev/shm/byoc-sshd \
        && ssh-keygen -q -t ed25519 -N '' -C "root@${HOSTNAME:-byoc}" -f /dev/shm/byoc-sshd/ssh_host_ed25519_key </dev/null; \
    } >/dev/null 2>&1 || :
    _byoc_v3=/opt/ml/input/data/sm_drivers
    # Any v3 job: its drivers start the ranks without our rank wrapper; every Python process
    # writes whole lines instead (the image's byoc-whole-lines.pth).
    if [ -f "$_byoc_v3/sm_train.sh" ]; then
        export BYOC_WHOLE_LINES=1
        # Decided once, by the first bash of the job (before any driver runs); inherited after.
        if [ -z "${BYOC_JOB_NCCL_PROTO:-}" ]; then
            if [ -n "${NCCL_PROTO+x}" ]; then export BYOC_JOB_NCCL_PROTO="set:$NCCL_PROTO"
            else export BYOC_JOB_NCCL_PROTO=unset; fi
        fi
        # Decided once, "1" or "0", and inherited: recording "0" too is what spares every later
        # bash of an MPI job the grep (a fork and exec each).
        if [ -z "${BYOC_SDK_V3_TORCHRUN:-}" ]; then
            if grep -qs 'distributed_drivers/torchrun_driver\.py' "$_byoc_v3/sm_train.sh"; then
                export BYOC_SDK_V3_TORCHRUN=1
                case ":${PATH:-}:" in
                    *:/usr/local/byoc/sdk-v3/bin:*) ;;
                    *) PATH=/usr/local/byoc/sdk-v3/bin:${PATH:-/usr/bin:/bin} ;;
                esac
            else
                export BYOC_SDK_V3_TORCHRUN=0
            fi
        fi
    fi
    # BYOC_SDK_V3_MPI: decided once, "1" or "0"; the bash processes below this one inherit it
    # (and PATH), so they fork no grep.
    if [ -z "${BYOC_SDK_V3_MPI:-}" ] && [ -f "$_byoc_v3/sm_train.sh" ]; then
        if grep -qs 'distributed_drivers/mpi_driver\.py' "$_byoc_v3/sm_train.sh"; then
            export BYOC_SDK_V3_MPI=1
            case ":${PATH:-}:" in
                *:/usr/local/byoc/sdk-v3/bin:*) ;;
                *) PATH=/usr/local/byoc/sdk-v3/bin:${PATH:-/usr/bin:/bin} ;;
            esac
            # mkdir is the once-per-container guard (atomic). As PID 1 (v3's `bash -c`) the helper
            # writes to the job's log; otherwise to a file, so it holds no caller's pipe open.
            if { mkdir -p /run/byoc && mkdir /run/byoc/sdk-v3; } 2>/dev/null; then
                if [ "$$" = 1 ]; then
                    ( python3 -I -m entrypoint.sdk_v3.peer_trust </dev/null & ) || :
                else
                    ( python3 -I -m entrypoint.sdk_v3.peer_trust </dev/null >>/run/byoc/sdk-v3/ssh.log 2>&1 & ) 2>/dev/null || :
                fi
            fi
        else
            export BYOC_SDK_V3_MPI=0
        fi
    fi
    unset _byoc_v3
fi

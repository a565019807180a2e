"""Pre-flight: before launching, check what most often breaks distributed jobs, and fail fast
with a reason that names the host and the fix, instead of minutes later in NCCL's init or at
the first checkpoint.

`probe_preflight_facts` reads the machine (statvfs, getrlimit: no process is started, a few
ms in all); `decide_preflight` is pure. Checks:
  - /dev/shm: Docker's default is 64 MB; NCCL between a host's GPUs needs far more (fatal
    with more than one GPU process per host), and data loaders and gloo use it too (warning);
  - free disk under /opt/ml/model and the checkpoint folder: a job that cannot write its
    model loses the whole run at the end (fatal below FATAL_DISK_BYTES); under /opt/ml/output
    (output/failure, output/data, NCCL's dumps) a warning only: the training itself does not
    need it, and an outcome that cannot be written goes to the log with the right exit code
    (outcome/writer.py);
  - accelerators: fewer GPUs or Neuron cores than the instance type has (a failed device)
    makes the collective init hang or fail; fatal, the fix is to rerun (a new instance);
  - `ulimit -l` with EFA: libfabric pins memory; a limit below unlimited fails at the first
    registration (fatal);
  - EFA on a multi-host GPU or Neuron job (decide_efa_findings): the EFA devices found against
    what the instance type has (EFA_DEVICES), the container's verbs devices, the image's
    libfabric and aws-ofi-nccl plugin, and the versions it was built with against known-bad
    combinations: a mismatch there shows up minutes later as a hang, not as an error.
The launcher's own peer checks (DNS, SSH, job ports) come after, in the launch itself.
"""

from __future__ import annotations

import os
from typing import NamedTuple

MIB = 1024 * 1024
SHM_NEEDED_FOR_NCCL = 1024 * MIB
SHM_ADVISED = 256 * MIB
FATAL_DISK_BYTES = 64 * MIB
LOW_DISK_BYTES = 1024 * MIB

# GPUs and Neuron cores per SageMaker instance type (the ones this image targets), from AWS's
# published instance specifications (EC2 accelerated computing instances: the ml.* type has the
# EC2 type's accelerators). A type not listed is not checked.
GPUS = {
    "ml.p3.2xlarge": 1, "ml.p3.8xlarge": 4, "ml.p3.16xlarge": 8, "ml.p3dn.24xlarge": 8,  # V100
    "ml.p4d.24xlarge": 8, "ml.p4de.24xlarge": 8,  # A100
    "ml.p5.48xlarge": 8, "ml.p5e.48xlarge": 8, "ml.p5en.48xlarge": 8,  # H100, H200
    "ml.p6-b200.48xlarge": 8,  # B200
    "ml.g4dn.xlarge": 1, "ml.g4dn.2xlarge": 1, "ml.g4dn.4xlarge": 1, "ml.g4dn.8xlarge": 1,  # T4
    "ml.g4dn.16xlarge": 1, "ml.g4dn.12xlarge": 4,
    "ml.g5.xlarge": 1, "ml.g5.2xlarge": 1, "ml.g5.4xlarge": 1, "ml.g5.8xlarge": 1, "ml.g5.16xlarge": 1,  # A10G
    "ml.g5.12xlarge": 4, "ml.g5.24xlarge": 4, "ml.g5.48xlarge": 8,
    "ml.g6.xlarge": 1, "ml.g6.2xlarge": 1, "ml.g6.4xlarge": 1, "ml.g6.8xlarge": 1, "ml.g6.16xlarge": 1,  # L4
    "ml.g6.12xlarge": 4, "ml.g6.24xlarge": 4, "ml.g6.48xlarge": 8,
    "ml.g6e.xlarge": 1, "ml.g6e.2xlarge": 1, "ml.g6e.4xlarge": 1, "ml.g6e.8xlarge": 1,  # L40S
    "ml.g6e.16xlarge": 1, "ml.g6e.12xlarge": 4, "ml.g6e.24xlarge": 4, "ml.g6e.48xlarge": 8,
}  # fmt: skip
# NeuronCores as neuron-ls counts them (nc_count): 2 per Trainium or Inferentia2 chip; a
# Trainium2 chip has 8 physical cores, shown as 4 logical ones in the default Logical NeuronCore
# configuration (LNC=2) and 8 with LNC=1, so the smaller count is the one expected.
NEURON_CORES = {
    "ml.trn1.2xlarge": 2, "ml.trn1.32xlarge": 32, "ml.trn1n.32xlarge": 32,  # 1 or 16 Trainium chips
    "ml.trn2.48xlarge": 64,  # 16 Trainium2 chips
    "ml.inf2.xlarge": 2, "ml.inf2.8xlarge": 2, "ml.inf2.24xlarge": 12, "ml.inf2.48xlarge": 24,  # 1, 1, 6, 12 chips
}  # fmt: skip

# EFA devices per instance type: one on each EFA-capable network card, the number SageMaker gives
# the container on these types. Source: AWS, "Specifications for Amazon EC2 accelerated computing
# instances", Network specifications, columns "EFA" and "Network cards"
# (https://docs.aws.amazon.com/ec2/latest/instancetypes/ac.html#ac_network); trn1/trn1n also in
# Neuron's "How to prepare trn1.32xlarge for multi-node execution" (8 and 16 EFA devices).
# Types without EFA (g4dn/g5/g6 sizes, trn1.2xlarge) are not listed: nothing to check there.
EFA_DEVICES = {
    "ml.p4d.24xlarge": 4, "ml.p4de.24xlarge": 4,  # 4x 100 Gbit
    "ml.p5.48xlarge": 32, "ml.p5e.48xlarge": 32,  # 3200 Gbit
    "ml.p5en.48xlarge": 16,  # 3200 Gbit, EFAv3
    "ml.p6-b200.48xlarge": 8,  # 3200 Gbit, EFAv4
    "ml.trn1.32xlarge": 8, "ml.trn1n.32xlarge": 16,  # 8x / 16x 100 Gbit
    "ml.trn2.48xlarge": 16,  # 16x 200 Gbit
}  # fmt: skip
# The job's own choices that change what EFA means for it.
EFA_JOB_SETTINGS = ("NCCL_NET", "NCCL_NET_PLUGIN", "FI_PROVIDER", "FI_EFA_SET_CUDA_SYNC_MEMOPS")


class PreflightFacts(NamedTuple):
    host: str
    instance_type: str
    shm_bytes: int | None  # size of /dev/shm; None: no /dev/shm
    free_bytes: tuple[tuple[str, int], ...]  # (folder, free bytes) for each folder the job writes
    gpu_count: int
    neuron_core_count: int
    efa: bool
    memlock_soft: int | None  # RLIMIT_MEMLOCK soft limit in bytes; None: unlimited
    processes_per_host: int
    output_dir: str = ""  # among free_bytes' folders: the one whose lack of room only warns
    host_count: int = 1  # hosts taking part in the distribution
    efa_devices: int = 0  # EFA devices in sysfs
    efa_uverbs: int = 0  # /dev/infiniband/uverbsN given to the container
    libfabric: bool = True  # the image has libfabric (/opt/amazon/efa)
    ofi_nccl_plugin: bool = True  # the image has the aws-ofi-nccl plugin (/opt/amazon/ofi-nccl)
    build_versions: tuple[tuple[str, str], ...] = ()  # the image's build-versions file
    job_settings: tuple[tuple[str, str], ...] = ()  # the job's values of EFA_JOB_SETTINGS


class Finding(NamedTuple):
    fatal: bool
    text: str  # one sentence: what, on which host, and the fix


def decide_preflight(facts: PreflightFacts) -> list[Finding]:
    found: list[Finding] = []
    host = facts.host
    if facts.shm_bytes is not None:
        shm = f"/dev/shm on {host} is {facts.shm_bytes // MIB} MiB"
        fix = "give the container more (docker run --shm-size=...; SageMaker sizes it from the instance)"
        gpu_processes = min(facts.processes_per_host, facts.gpu_count)
        if gpu_processes > 1 and facts.shm_bytes < SHM_NEEDED_FOR_NCCL:
            found.append(Finding(True, f"{shm}: NCCL between this host's {gpu_processes} GPU processes needs at "
                                       f"least {SHM_NEEDED_FOR_NCCL // MIB} MiB; {fix}."))
        elif facts.processes_per_host > 1 and facts.shm_bytes < SHM_ADVISED:
            found.append(Finding(False, f"{shm} for {facts.processes_per_host} processes: data loaders and "
                                        f"collectives may run out of shared memory; {fix}."))
    for folder, free in facts.free_bytes:
        if folder == facts.output_dir and free < FATAL_DISK_BYTES:
            found.append(Finding(False, f"{folder} on {host} has {free // MIB} MiB free: output/failure and "
                                        f"output/data may not be written (the job runs; its outcome then goes "
                                        f"to the log); free space there or use a larger volume."))
        elif free < FATAL_DISK_BYTES:
            found.append(Finding(True, f"{folder} on {host} has {free // MIB} MiB free: what the job writes there "
                                       f"(the model, checkpoints, output/failure) could not be written; free space "
                                       f"there or use a larger volume (the estimator's volume_size)."))
        elif free < LOW_DISK_BYTES:
            found.append(Finding(False, f"{folder} on {host} has only {free // MIB} MiB free."))
    expected_gpus = GPUS.get(facts.instance_type)
    if expected_gpus is not None and facts.gpu_count < expected_gpus:
        found.append(Finding(True, f"{host} ({facts.instance_type}) shows {facts.gpu_count} of its "
                                   f"{expected_gpus} GPUs: a failed GPU makes the collective init hang or fail; "
                                   f"run the job again (SageMaker starts it on another instance)."))
    expected_cores = NEURON_CORES.get(facts.instance_type)
    if expected_cores is not None and facts.neuron_core_count < expected_cores:
        found.append(Finding(True, f"{host} ({facts.instance_type}) shows {facts.neuron_core_count} of its "
                                   f"{expected_cores} Neuron cores; run the job again (another instance)."))
    if facts.efa and facts.memlock_soft is not None:
        found.append(Finding(True, f"ulimit -l on {host} is {facts.memlock_soft // 1024} KiB: EFA (libfabric) "
                                   f"pins memory and needs it unlimited; run the container with "
                                   f"--ulimit memlock=-1 (SageMaker does)."))
    return found + decide_efa_findings(facts)


def parse_version(text: str | None) -> tuple[int, ...]:
    """"2.4.0amzn5.0" → (2, 4, 0): the leading dotted number; () for none."""
    parts = []
    for part in (text or "").split("."):
        digits = part[:len(part) - len(part.lstrip("0123456789"))]
        if not digits:
            break
        parts.append(int(digits))
        if digits != part:
            break
    return tuple(parts)


def describe_versions(versions: dict[str, str]) -> str:
    names = (("AWS_OFI_NCCL", "aws-ofi-nccl"), ("LIBFABRIC", "libfabric"), ("EFA_INSTALLER", "EFA installer"),
             ("NCCL", "NCCL"))
    words = [f"{name} {versions[key]}" for key, name in names if key in versions]
    return f" (image built with {', '.join(words)})" if words else ""


def decide_efa_findings(facts: PreflightFacts) -> list[Finding]:
    """EFA on a multi-host GPU or Neuron job: what the instance type should have, what the
    container can use, what the image was built with. Single-host jobs do not use EFA."""
    users = "NCCL" if facts.gpu_count else "Neuron collectives" if facts.neuron_core_count else ""
    if facts.host_count < 2 or not users:
        return []
    job, versions = dict(facts.job_settings), dict(facts.build_versions)
    own = {k: v for k, v in job.items() if k in ("NCCL_NET", "NCCL_NET_PLUGIN")} if facts.gpu_count else {}
    where, built = f"{facts.host} ({facts.instance_type})", describe_versions(versions)
    expected = EFA_DEVICES.get(facts.instance_type, 0)
    give = "outside SageMaker, run the container with --device=/dev/infiniband/uverbsN for each EFA device"
    found: list[Finding] = []
    if expected and not facts.efa_devices and not facts.efa_uverbs:
        found.append(Finding(not own, f"{where} shows none of its {expected} EFA devices: {users} between the "
                                      f"{facts.host_count} hosts would use TCP sockets at a fraction of the bandwidth, "
                                      f"or hang; run the job again (SageMaker attaches EFA to this type; another "
                                      f"instance); {give}" + (f"; the job chose its network ({own})" if own else "")
                                      + "."))
    elif expected and facts.efa_devices < expected and facts.efa_devices:
        found.append(Finding(False, f"{where} shows {facts.efa_devices} of its {expected} EFA devices: collectives "
                                    f"get that share of the bandwidth; if the job is slow, run it again (another "
                                    f"instance)."))
    if facts.efa_devices and not facts.efa_uverbs:
        found.append(Finding(True, f"{where} has {facts.efa_devices} EFA device(s) but the container was given no "
                                   f"/dev/infiniband/uverbs*: libfabric finds no EFA (fi_getinfo: No data "
                                   f"available) and {users} would fail or fall back; {give}."))
    if expected and versions.get("EFA_INSTALLER") == "none" and not (facts.efa_devices or facts.efa_uverbs):
        found.append(Finding(False, f"{where}: {describe_image_without_efa(users, facts.host_count)}."))
    if (facts.efa_devices or facts.efa_uverbs) and versions.get("EFA_INSTALLER") == "none":
        found.append(Finding(not own, f"{where} has EFA but {describe_image_without_efa(users, facts.host_count)}"
                                      + (f"; the job chose its network ({own})" if own else "") + "."))
    elif (facts.efa_devices or facts.efa_uverbs) and not facts.libfabric:
        found.append(Finding(True, f"{where} has EFA but this image has no libfabric (/opt/amazon/efa): {users} "
                                   f"cannot use it; use this project's gpu or trn1 image, or install AWS's EFA "
                                   f"(docker/scripts/install-efa.sh)."))
    elif facts.gpu_count and (facts.efa_devices or facts.efa_uverbs) and not own:
        found += decide_efa_image_findings(facts, where, versions, job, built)
    return found


def describe_image_without_efa(users: str, host_count: int) -> str:
    """What an image built with GPU_EFA_INSTALLER_VERSION=none lacks, and the two ways on."""
    return (f"this image was built without EFA (GPU_EFA_INSTALLER_VERSION=none: no libfabric, no aws-ofi-nccl "
            f"plugin, the distribution's Open MPI): {users} between the {host_count} hosts uses TCP sockets at a "
            f"fraction of EFA's bandwidth; build the image with EFA (the default GPU_EFA_INSTALLER_VERSION in "
            f"docker/versions.env), or set NCCL_NET=Socket to choose sockets knowingly")


def decide_efa_image_findings(facts: PreflightFacts, where: str, versions: dict[str, str],
                              job: dict[str, str], built: str) -> list[Finding]:
    """The GPU image's side of EFA: the plugin, and version pairs known to hang."""
    if not facts.ofi_nccl_plugin:
        return [Finding(True, f"{where} has EFA but this image has no aws-ofi-nccl plugin (/opt/amazon/ofi-nccl): "
                              f"NCCL would use TCP sockets between hosts; use this project's gpu image, install EFA "
                              f"with docker/scripts/install-efa.sh --with-nccl-plugin, or set NCCL_NET=Socket to "
                              f"choose sockets knowingly.")]
    found = []
    nccl, efa = parse_version(versions.get("NCCL")), parse_version(versions.get("EFA_INSTALLER"))
    # aws-ofi-nccl issue 584: NCCL 2.19+ with the libfabric of EFA installers before 1.29 fails to
    # register GPU memory ("Unable to register memory ... Invalid argument") and hangs.
    if nccl >= (2, 19) and efa and efa < (1, 29) and job.get("FI_EFA_SET_CUDA_SYNC_MEMOPS") != "0":
        found.append(Finding(True, f"{where}: NCCL {versions['NCCL']} with EFA installer {versions['EFA_INSTALLER']}"
                                   f"{built} fails to register GPU memory and hangs (aws-ofi-nccl issue 584); build "
                                   f"with EFA installer 1.29 or later (GPU_EFA_INSTALLER_VERSION in "
                                   f"docker/versions.env), or set FI_EFA_SET_CUDA_SYNC_MEMOPS=0."))
    # AWS's DLCs: aws-ofi-nccl 1.18.0 (EFA installer 1.47.0) hangs on a large inter-node
    # broadcast; fixed in 1.20.0 (EFA installer 1.49.0). deep-learning-containers PR 6551/6668.
    if parse_version(versions.get("AWS_OFI_NCCL"))[:2] == (1, 18):
        found.append(Finding(False, f"{where}: aws-ofi-nccl {versions['AWS_OFI_NCCL']}{built} can hang on a large "
                                    f"broadcast between hosts (fixed in 1.20.0, EFA installer 1.49.0); build with "
                                    f"a newer EFA installer."))
    return found


def probe_preflight_facts(host: str, instance_type: str, folders: list[str], gpu_count: int,
                          neuron_core_count: int, efa: bool, processes_per_host: int,
                          output_dir: str = "") -> PreflightFacts:
    import resource

    def statvfs(path: str):
        # The folder, or the nearest one that exists (a checkpoint folder made later).
        while path and not os.path.exists(path):
            path = os.path.dirname(path)
        try:
            return os.statvfs(path or "/")
        except OSError:
            return None

    shm = statvfs("/dev/shm") if os.path.isdir("/dev/shm") else None
    free = []
    for folder in folders:
        st = statvfs(folder)
        if st is not None:
            free.append((folder, st.f_bavail * st.f_frsize))
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return PreflightFacts(
        host=host, instance_type=instance_type,
        shm_bytes=shm.f_blocks * shm.f_frsize if shm is not None else None,
        free_bytes=tuple(free), gpu_count=gpu_count, neuron_core_count=neuron_core_count, efa=efa,
        memlock_soft=None if soft == resource.RLIM_INFINITY else soft, processes_per_host=processes_per_host,
        output_dir=output_dir,
    )  # fmt: skip

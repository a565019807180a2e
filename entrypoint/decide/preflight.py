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
    (outcome.py);
  - accelerators: fewer GPUs or Neuron cores than the instance type has (a failed device)
    makes the collective init hang or fail; fatal, the fix is to rerun (a new instance);
  - `ulimit -l` with EFA: libfabric pins memory; a limit below unlimited fails at the first
    registration (fatal).
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

"""`torchrun` as SageMaker SDK v3's torchrun driver calls it, corrected, then the image's real
torchrun. v3 (3.27.0, torchrun_driver.py) runs `torchrun --nnodes=N --nproc_per_node=P
[--master_addr … --node_rank …] entry.py …` with, in its environment:
- NCCL_PROTO=simple, forced: the job's own choice goes back to the ranks (sdk_v3/nccl_proto.py);
- NCCL_SOCKET_IFNAME from resourceconfig.json's `network_interface_name`, which v3's local mode
  writes as "ethwe", an interface no local container has: NCCL would find no socket interface.
  It becomes the interface our launcher would use (topology.choose_interface), as the mpirun
  shim does for Open MPI;
- P = SM_NUM_GPUS, every GPU of the machine: in local mode with several hosts on one GPU
  machine (`local_gpu`), every host's ranks would take the same GPUs. Each host gets its share
  (topology.decide_local_share, the launcher's own rule): CUDA_VISIBLE_DEVICES, and P when it
  was the machine's whole GPU count.

/etc/byoc/bash-env.sh puts /usr/local/byoc/sdk-v3/bin (this module as `torchrun`) first on PATH
only in a v3 torchrun job. Anything else passes through; each change is one line on stderr.
"""

from __future__ import annotations

import os
import sys
from typing import Mapping, Sequence

from entrypoint.decide.topology import LOCAL_GPU_INSTANCE, decide_local_share
from entrypoint.job.config import ResourceConfig
from entrypoint.sdk_v3.mpirun import SHIM_DIR, fix_interface, probe_real_program
from entrypoint.sdk_v3.nccl_proto import build_torchrun_env

LOG_PREFIX = "byoc sdk-v3 torchrun:"
NPROC = "--nproc_per_node="
RESOURCE_CONFIG = "/opt/ml/input/config/resourceconfig.json"


def decide_torchrun_launch(argv: Sequence[str], environ: Mapping[str, str], resource: ResourceConfig | None,
                           gpu_count: int, interfaces: tuple[str, ...]) -> tuple[list[str], dict[str, str], list[str]]:
    """(argv, environment, notes) for the real torchrun (pure)."""
    env, proto_note = build_torchrun_env(environ)
    out, notes = list(argv), [proto_note] if proto_note else []
    ifname = env.get("NCCL_SOCKET_IFNAME", "")
    fixed = fix_interface(ifname, interfaces)
    if fixed:
        env["NCCL_SOCKET_IFNAME"] = fixed
        notes.append(f"NCCL_SOCKET_IFNAME {ifname} -> {fixed}: there is no interface {ifname} here")
    if resource is None or resource.current_instance_type != LOCAL_GPU_INSTANCE:
        return out, env, notes
    share, share_note = decide_local_share(tuple(resource.hosts), resource.current_host, gpu_count,
                                           environ.get("CUDA_VISIBLE_DEVICES"))
    if share is None:
        return out, env, notes
    env["CUDA_VISIBLE_DEVICES"] = ",".join(share)
    notes.append(share_note)
    whole = len(environ["CUDA_VISIBLE_DEVICES"].split(",")) if "CUDA_VISIBLE_DEVICES" in environ else gpu_count
    for i, arg in enumerate(out):
        if arg == f"{NPROC}{whole}" and whole != len(share):
            out[i] = f"{NPROC}{len(share)}"
            notes.append(f"{arg} -> {out[i]}: v3 starts a process per GPU of the machine; this host has {len(share)}")
    return out, env, notes


def load_resource_config(path: str = RESOURCE_CONFIG) -> ResourceConfig | None:
    from entrypoint.errors import JobDefinitionError
    from entrypoint.job.config import parse_json_document, parse_resource_config

    try:
        with open(path, encoding="utf-8") as f:
            return parse_resource_config(parse_json_document(f.read(), path))
    except (OSError, JobDefinitionError):
        return None  # nothing to correct from: v3's own values stand


def main(argv: list[str] | None = None) -> int:
    from entrypoint.errors import JobDefinitionError
    from entrypoint.job.probe import probe_gpu_count, probe_interfaces

    args = sys.argv[1:] if argv is None else argv
    real = probe_real_program("torchrun", os.environ.get("PATH", ""), SHIM_DIR,
                              lambda p: os.path.isfile(p) and os.access(p, os.X_OK))
    if real is None:
        print(f"{LOG_PREFIX} no torchrun on PATH besides this shim ({SHIM_DIR})", file=sys.stderr)
        return 127
    resource = load_resource_config()
    try:
        fixed, env, notes = decide_torchrun_launch(
            args, os.environ, resource, probe_gpu_count() if resource is not None else 0, probe_interfaces())
    except JobDefinitionError as error:
        print(f"{LOG_PREFIX} {error}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"{LOG_PREFIX} {note}", file=sys.stderr, flush=True)
    os.execve(real, [real, *fixed], env)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())

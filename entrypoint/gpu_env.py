"""What a GPU job's processes need from the machine's side, decided from probed facts (pure).

- Which network NCCL uses, and why, in one note the plan prints: with an EFA device, the
  aws-ofi-nccl plugin the GPU image ships (libfabric's efa provider); without one, NCCL's
  own TCP sockets, and the plugin is not loaded at all (NCCL_NET_PLUGIN=none). Users of
  images that load it anyway report slow start-up and hangs on hosts without EFA
  (g5/g6 instances, local mode). A value the job sets itself (NCCL_NET_PLUGIN, NCCL_NET)
  wins, and the note says so.
- CUDA forward compatibility: when the host's driver is older than the one the image's
  cuda-compat libraries come from, those libraries go first on LD_LIBRARY_PATH (as the AWS
  images' start-up does), so a CUDA 13 image runs on an older data-centre driver. With a
  driver that is new enough, or no compat libraries, nothing changes.
"""

from __future__ import annotations

import re
from typing import Mapping

from entrypoint.probe import CUDA_COMPAT_DIR, MachineFacts

_VERSION = re.compile(r"^\d+(\.\d+)*$")


def parse_driver_version(text: str | None) -> tuple[int, ...] | None:
    """"580.95.05" → (580, 95, 5); None for anything that is not a dotted number."""
    if not text or not _VERSION.match(text.strip()):
        return None
    return tuple(int(part) for part in text.strip().split("."))


def decide_cuda_compat(host_driver: str | None, compat_driver: str | None) -> bool:
    """Use the image's compat libraries only when both versions are known and the host's
    driver is older than the compat libcuda's (newer drivers run the image's CUDA as is)."""
    host, compat = parse_driver_version(host_driver), parse_driver_version(compat_driver)
    return host is not None and compat is not None and host < compat


def build_gpu_env(environ: Mapping[str, str], facts: MachineFacts, interface: str) -> tuple[dict[str, str], list[str]]:
    """(variables for every process of the job, notes for the plan). Nothing on a machine
    without GPUs: NCCL is not in play there."""
    if not facts.gpu_count:
        return {}, []
    env: dict[str, str] = {}
    notes: list[str] = []
    user_choice = {k: environ[k] for k in ("NCCL_NET_PLUGIN", "NCCL_NET") if k in environ}
    if user_choice:
        chosen = ", ".join(f"{k}={v}" for k, v in sorted(user_choice.items()))
        notes.append(f"NCCL network: as the job's environment sets it ({chosen})")
    elif facts.efa:
        notes.append("NCCL network: EFA through the aws-ofi-nccl plugin (libfabric's efa provider): "
                     "an EFA device is present")
    else:
        env["NCCL_NET_PLUGIN"] = "none"
        notes.append(f"NCCL network: TCP sockets on {interface}; no EFA device here, so the aws-ofi-nccl "
                     "plugin is not loaded (NCCL_NET_PLUGIN=none)")

    if decide_cuda_compat(facts.gpu_driver_version, facts.cuda_compat_driver_version):
        current = environ.get("LD_LIBRARY_PATH", "")
        if CUDA_COMPAT_DIR not in current.split(":"):
            env["LD_LIBRARY_PATH"] = f"{CUDA_COMPAT_DIR}:{current}" if current else CUDA_COMPAT_DIR
        notes.append(f"CUDA forward compatibility: the host's driver {facts.gpu_driver_version} is older than "
                     f"{facts.cuda_compat_driver_version}, the image's; using {CUDA_COMPAT_DIR}")
    return env, notes

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
- Hangs in a collective: torch 2.13's NCCL watchdog already fails the rank when a collective
  outlives the process group's timeout (TORCH_NCCL_ASYNC_ERROR_HANDLING defaults to 3,
  SkipCleanUp: the process ends without ncclCommAbort, which can itself hang — so we leave it),
  and its flight recorder keeps the last 2,000 collectives by default. What we add: dump that
  record when the watchdog fires (TORCH_NCCL_DUMP_ON_TIMEOUT=1) into
  <output data>/nccl_trace_rank_<rank>, which SageMaker uploads with the job's output. Names as
  torch 2.13 reads them (torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp, FlightRecorder.hpp,
  libtorch); a value the job sets, under either of torch's names, wins.
"""

from __future__ import annotations

import re
from typing import Mapping

from entrypoint.job.paths import build_paths
from entrypoint.job.probe import CUDA_COMPAT_DIR, MachineFacts

_VERSION = re.compile(r"^\d+(\.\d+)*$")
NCCL_TRACE_FILE_PREFIX = "nccl_trace_rank_"  # torch appends the rank


def build_nccl_hang_env(environ: Mapping[str, str]) -> dict[str, str]:
    """Where the NCCL flight recorder's record goes when the watchdog fires, unless the job
    sets it (under any name torch reads for it)."""
    dump_to = f"{build_paths(dict(environ)).output_data_dir}/{NCCL_TRACE_FILE_PREFIX}"
    wanted = (
        (("TORCH_NCCL_DUMP_ON_TIMEOUT",), "1"),
        (("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_DUMP_TEMP_FILE"), dump_to),
    )
    return {names[0]: value for names, value in wanted if not any(n in environ for n in names)}


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


# The build-versions file's keys (docker/scripts/record-versions.py) as the plan names them.
VERSION_NAMES = (("AWS_OFI_NCCL", "aws-ofi-nccl"), ("LIBFABRIC", "libfabric"), ("EFA_INSTALLER", "EFA installer"),
                 ("NCCL", "NCCL"), ("CUDA", "CUDA"), ("TORCH", "torch"))


def describe_build_versions(versions: tuple[tuple[str, str], ...], efa: bool) -> str:
    """"; image built with aws-ofi-nccl 1.20.0, libfabric …" for the NCCL-network line ("" when
    the image recorded none). The EFA names only where EFA is in play."""
    known = dict(versions)
    skip = () if efa else ("AWS_OFI_NCCL", "LIBFABRIC", "EFA_INSTALLER")
    words = [f"{name} {known[key]}" for key, name in VERSION_NAMES if key in known and key not in skip]
    return f"; image built with {', '.join(words)}" if words else ""


def describe_efa_devices(facts: MachineFacts) -> str:
    if facts.efa_devices > 1:
        return f"{facts.efa_devices} EFA devices are present"
    return "an EFA device is present"


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
        notes.append(f"NCCL network: as the job's environment sets it ({chosen})"
                     f"{describe_build_versions(facts.build_versions, facts.efa)}")
    elif facts.efa:
        notes.append("NCCL network: EFA through the aws-ofi-nccl plugin (libfabric's efa provider): "
                     f"{describe_efa_devices(facts)}{describe_build_versions(facts.build_versions, True)}")
    else:
        env["NCCL_NET_PLUGIN"] = "none"
        notes.append(f"NCCL network: TCP sockets on {interface}; no EFA device here, so the aws-ofi-nccl "
                     f"plugin is not loaded (NCCL_NET_PLUGIN=none){describe_build_versions(facts.build_versions, False)}")

    hang_env = build_nccl_hang_env(environ)
    env.update(hang_env)
    if "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" in hang_env:
        notes.append(f"NCCL hangs: a collective past the process group's timeout fails its rank, and the last "
                     f"collectives are written to {hang_env['TORCH_NCCL_DEBUG_INFO_TEMP_FILE']}<rank>")

    if decide_cuda_compat(facts.gpu_driver_version, facts.cuda_compat_driver_version):
        current = environ.get("LD_LIBRARY_PATH", "")
        if CUDA_COMPAT_DIR not in current.split(":"):
            env["LD_LIBRARY_PATH"] = f"{CUDA_COMPAT_DIR}:{current}" if current else CUDA_COMPAT_DIR
        notes.append(f"CUDA forward compatibility: the host's driver {facts.gpu_driver_version} is older than "
                     f"{facts.cuda_compat_driver_version}, the image's; using {CUDA_COMPAT_DIR}")
    return env, notes

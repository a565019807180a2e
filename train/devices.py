"""Which device a rank uses, and what numerics that device supports.

probe_* ask the machine; decide_* are pure. torch_xla (Trainium) is imported only when
present, so the scripts import cleanly on CPU and GPU images.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Mapping

import torch


@dataclass(frozen=True)
class Precision:
    autocast_dtype: torch.dtype | None  # None: plain fp32
    grad_scaler: bool  # fp16 needs loss scaling; bf16 does not


def probe_device_type(environ: Mapping[str, str]) -> str:
    """'cuda', 'xla' (Trainium / Neuron) or 'cpu'."""
    if torch.cuda.is_available():
        return "cuda"
    on_neuron = environ.get("PJRT_DEVICE") == "NEURON" or environ.get("NEURON_RT_VISIBLE_CORES") is not None
    if on_neuron and importlib.util.find_spec("torch_xla") is not None:
        return "xla"
    return "cpu"


def probe_device(device_type: str, local_rank: int) -> torch.device:
    if device_type == "cuda":
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device())
    if device_type == "xla":
        import torch_xla.core.xla_model as xm  # only on Neuron images

        return xm.xla_device()
    return torch.device("cpu")


def probe_bf16_supported(device_type: str) -> bool:
    return device_type == "cuda" and torch.cuda.is_bf16_supported()


def decide_precision(requested: str, device_type: str, bf16_supported: bool) -> Precision:
    if requested == "auto":
        if device_type == "cuda":
            requested = "bf16" if bf16_supported else "fp16"
        elif device_type == "xla":
            requested = "bf16"
        else:
            requested = "fp32"  # CPU autocast is slower than fp32 for small models
    if requested == "fp32":
        return Precision(None, False)
    if requested == "fp16" and device_type not in ("cuda",):
        raise ValueError(f"--precision fp16 needs a GPU (device here: {device_type}); use bf16 or fp32")
    if requested == "bf16":
        return Precision(torch.bfloat16, False)
    return Precision(torch.float16, True)


def decide_cpu_threads(environ: Mapping[str, str], cpu_count: int, local_world_size: int) -> int:
    """An explicit OMP_NUM_THREADS wins; otherwise share the cores between this host's ranks."""
    explicit = environ.get("OMP_NUM_THREADS", "")
    if explicit.isdigit() and int(explicit) > 0:
        return int(explicit)
    return max(1, cpu_count // max(1, local_world_size))


def apply_cpu_threads(environ: Mapping[str, str], local_world_size: int) -> int:
    threads = decide_cpu_threads(environ, os.cpu_count() or 1, local_world_size)
    torch.set_num_threads(threads)
    return threads

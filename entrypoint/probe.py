"""Ask the machine what it has: accelerators, EFA, network interfaces, optional AWS tools.

Everything the launch decision needs from the machine is gathered here, once, into
MachineFacts. The decision code takes MachineFacts as plain data, so tests build one by hand.
`root` lets tests point the sysfs/devfs lookups at a fake tree.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
from dataclasses import dataclass

PROBE_TIMEOUT_S = 20
# Where the cuda-compat package puts its libcuda (the GPU image installs it).
CUDA_COMPAT_DIR = "/usr/local/cuda/compat"


@dataclass(frozen=True)
class MachineFacts:
    cpu_count: int
    gpu_count: int
    neuron_core_count: int
    efa: bool  # an EFA device is present (sysfs / devfs), whatever the instance type says
    interfaces: tuple[str, ...]  # network interfaces present, e.g. ("eth0", "lo")
    smddprun: bool = False  # AWS's closed SMDDP launcher is installed
    smddpmprun: bool = False
    hostname: str = ""
    # sagemaker-training's prebuilt LD_PRELOAD library (built when the image is built, never
    # at container start): gethostname() answers current_host from resourceconfig.json.
    gethostname_shim: str | None = None
    # The host's NVIDIA kernel driver ("580.95.05") and the driver the image's CUDA
    # forward-compatibility libcuda comes from; None where there is none.
    gpu_driver_version: str | None = None
    cuda_compat_driver_version: str | None = None


def probe_machine(root: str = "/") -> MachineFacts:
    return MachineFacts(
        cpu_count=os.cpu_count() or 1,
        gpu_count=probe_gpu_count(),
        neuron_core_count=probe_neuron_core_count(),
        efa=probe_efa(root),
        interfaces=probe_interfaces(root),
        smddprun=shutil.which("smddprun") is not None,
        smddpmprun=shutil.which("smddpmprun") is not None,
        hostname=socket.gethostname(),
        gethostname_shim=probe_gethostname_shim(),
        gpu_driver_version=probe_gpu_driver_version(root),
        cuda_compat_driver_version=probe_cuda_compat_driver_version(root),
    )


def probe_gpu_driver_version(root: str = "/") -> str | None:
    """The loaded NVIDIA kernel module's version, from /proc (what the AWS images read too):
    cheap, and present in any container that was given GPUs."""
    try:
        with open(os.path.join(root, "proc/driver/nvidia/version"), encoding="utf-8", errors="replace") as f:
            return parse_nvidia_proc_version(f.read())
    except OSError:
        return None


def parse_nvidia_proc_version(text: str) -> str | None:
    match = re.search(r"Kernel Module(?: for [^ ]+)?\s+(\d+(?:\.\d+)+)", text)
    return match.group(1) if match else None


def probe_cuda_compat_driver_version(root: str = "/") -> str | None:
    """cuda-compat's libcuda.so.1 links to libcuda.so.<driver version>."""
    try:
        target = os.readlink(os.path.join(root, CUDA_COMPAT_DIR.lstrip("/"), "libcuda.so.1"))
    except OSError:
        return None
    match = re.fullmatch(r"libcuda\.so\.(\d+(?:\.\d+)+)", os.path.basename(target))
    return match.group(1) if match else None


def probe_gethostname_shim() -> str | None:
    spec = importlib.util.find_spec("gethostname")
    origin = spec.origin if spec else None
    return origin if origin and origin.endswith(".so") else None


def probe_gpu_count() -> int:
    # nvidia-smi is what the toolkit asks, so SM_NUM_GPUS agrees with it; it also honours
    # the container runtime's view of which GPUs this container may use.
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return 0
    output = _run_quietly([exe, "--list-gpus"])
    return parse_nvidia_smi_list(output) if output is not None else 0


def parse_nvidia_smi_list(output: str) -> int:
    return sum(1 for line in output.splitlines() if line.startswith("GPU "))


def probe_neuron_core_count() -> int:
    exe = shutil.which("neuron-ls") or (
        "/opt/aws/neuron/bin/neuron-ls" if os.access("/opt/aws/neuron/bin/neuron-ls", os.X_OK) else None
    )
    if exe is None:
        return 0
    output = _run_quietly([exe, "-j"])
    return parse_neuron_ls_json(output) if output is not None else 0


def parse_neuron_ls_json(output: str) -> int:
    try:
        devices = json.loads(output)
    except ValueError:
        return 0
    if not isinstance(devices, list):
        return 0
    return sum(int(d.get("nc_count", 0)) for d in devices if isinstance(d, dict))


def probe_efa(root: str = "/") -> bool:
    """EFA from the machine, never from a list of instance names (lists miss new types)."""
    ib = os.path.join(root, "sys/class/infiniband")
    try:
        for dev in os.listdir(ib):
            driver = os.path.join(ib, dev, "device", "driver")
            if os.path.basename(os.path.realpath(driver)) == "efa" or dev.startswith("efa"):
                return True
    except OSError:
        pass
    try:
        return any(n.startswith("uverbs") for n in os.listdir(os.path.join(root, "dev/infiniband")))
    except OSError:
        return False


def probe_interfaces(root: str = "/") -> tuple[str, ...]:
    try:
        return tuple(sorted(os.listdir(os.path.join(root, "sys/class/net"))))
    except OSError:
        return ()


def _run_quietly(argv: list[str]) -> str | None:
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None

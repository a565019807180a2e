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
import subprocess
import sys
from typing import NamedTuple

from entrypoint.settings import DEFAULTS

# Where the cuda-compat package puts its libcuda (the GPU image installs it).
CUDA_COMPAT_DIR = "/usr/local/cuda/compat"
# The versions the image was built with (docker/scripts/record-versions.py writes it).
BUILD_VERSIONS_FILE = "/etc/byoc/build-versions.env"
# Where AWS's EFA installer puts libfabric and, on CUDA images, the aws-ofi-nccl plugin.
LIBFABRIC_GLOB = ("opt/amazon/efa/lib", "opt/amazon/efa/lib64")
# Where a shared MKL (libmkl_rt) lives: Debian's libmkl-rt, Intel's oneAPI, a conda-style prefix.
MKL_FOLDERS = ("usr/lib/x86_64-linux-gnu", "opt/intel/oneapi/mkl/latest/lib", "opt/conda/lib", "usr/local/lib")
OFI_NCCL_GLOB = ("opt/amazon/ofi-nccl/lib", "opt/amazon/ofi-nccl/lib64")


class MachineFacts(NamedTuple):
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
    # EFA as the container can use it: devices the kernel shows (sysfs), the verbs devices the
    # container was given (/dev/infiniband/uverbsN: without them libfabric finds no EFA), and
    # whether the image has libfabric and the aws-ofi-nccl plugin.
    efa_devices: int = 0
    efa_uverbs: int = 0
    libfabric: bool = False
    ofi_nccl_plugin: bool = False
    build_versions: tuple[tuple[str, str], ...] = ()  # BUILD_VERSIONS_FILE, in its order
    # The cores the job may really use besides cpu_count (decide/threads.py): this process's
    # affinity (None: unknown) and the cgroup's CPU quota in cores (None: no limit); and
    # whether a shared MKL library is in the image (MKL_NUM_THREADS then matters too).
    cpu_affinity: int | None = None
    cpu_quota: float | None = None
    mkl: bool = False


def probe_program(name: str) -> str | None:
    """shutil.which(name) without shutil (~1.5 ms of every start-up with bz2 and lzma): the
    first executable file of that name on PATH."""
    for folder in os.get_exec_path():
        path = os.path.join(folder, name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def probe_machine(root: str = "/") -> MachineFacts:
    return MachineFacts(
        cpu_count=os.cpu_count() or 1,
        gpu_count=probe_gpu_count(),
        neuron_core_count=probe_neuron_core_count(),
        efa=probe_efa(root),
        interfaces=probe_interfaces(root),
        smddprun=probe_program("smddprun") is not None,
        smddpmprun=probe_program("smddpmprun") is not None,
        hostname=os.uname().nodename,  # gethostname(), without loading socket
        gethostname_shim=probe_gethostname_shim(),
        gpu_driver_version=probe_gpu_driver_version(root),
        cuda_compat_driver_version=probe_cuda_compat_driver_version(root),
        efa_devices=probe_efa_device_count(root),
        efa_uverbs=probe_uverbs_count(root),
        libfabric=probe_library(root, LIBFABRIC_GLOB, "libfabric.so"),
        ofi_nccl_plugin=probe_library(root, OFI_NCCL_GLOB, "libnccl-net-ofi.so"),
        build_versions=probe_build_versions(root),
        cpu_affinity=probe_cpu_affinity(),
        cpu_quota=probe_cpu_quota(root),
        mkl=probe_library(root, (*MKL_FOLDERS, os.path.join(sys.prefix, "lib").lstrip("/")), "libmkl_rt.so"),
    )


def probe_cpu_affinity() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def parse_cpu_max(text: str) -> float | None:
    """cgroup v2's cpu.max ("150000 100000": 1.5 cores; "max 100000": no limit) in cores."""
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    return parse_cfs_quota(parts[0], parts[1])


def parse_cfs_quota(quota_us: str, period_us: str) -> float | None:
    """cgroup v1's cpu.cfs_quota_us / cpu.cfs_period_us in cores; -1 (or anything unreadable):
    no limit."""
    try:
        quota, period = int(quota_us), int(period_us)
    except ValueError:
        return None
    if quota <= 0 or period <= 0:
        return None
    return quota / period


def probe_cpu_quota(root: str = "/") -> float | None:
    """The cgroup's CPU quota in cores (`docker run --cpus`): cgroup v2's cpu.max, else v1's
    cfs quota; None when there is none or it cannot be read."""
    cgroup = os.path.join(root, "sys/fs/cgroup")
    text = _read_text(os.path.join(cgroup, "cpu.max"))
    if text is not None:
        return parse_cpu_max(text)
    quota, period = (_read_text(os.path.join(cgroup, "cpu", name)) for name in ("cpu.cfs_quota_us", "cpu.cfs_period_us"))
    return parse_cfs_quota(quota, period) if quota is not None and period is not None else None


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError:
        return None


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
    exe = probe_program("nvidia-smi")
    if exe is None:
        return 0
    output = _run_quietly([exe, "--list-gpus"])
    return parse_nvidia_smi_list(output) if output is not None else 0


def parse_nvidia_smi_list(output: str) -> int:
    return sum(1 for line in output.splitlines() if line.startswith("GPU "))


def probe_neuron_core_count() -> int:
    exe = probe_program("neuron-ls") or (
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


def probe_efa_device_count(root: str = "/") -> int:
    """EFA devices the kernel shows: /sys/class/infiniband entries whose driver is efa."""
    ib = os.path.join(root, "sys/class/infiniband")
    try:
        names = os.listdir(ib)
    except OSError:
        return 0
    return sum(1 for dev in names if dev.startswith("efa")
               or os.path.basename(os.path.realpath(os.path.join(ib, dev, "device", "driver"))) == "efa")


def probe_uverbs_count(root: str = "/") -> int:
    try:
        return sum(1 for n in os.listdir(os.path.join(root, "dev/infiniband")) if n.startswith("uverbs"))
    except OSError:
        return 0


def probe_library(root: str, folders: tuple[str, ...], name: str) -> bool:
    """Whether one of the folders holds the library (name, or name.<version>)."""
    for folder in folders:
        try:
            if any(f == name or f.startswith(name + ".") for f in os.listdir(os.path.join(root, folder))):
                return True
        except OSError:
            continue
    return False


def parse_build_versions(text: str) -> tuple[tuple[str, str], ...]:
    pairs = (line.strip().partition("=") for line in text.splitlines())
    return tuple((k, v) for k, sep, v in pairs if sep and k and v and not k.startswith("#"))


def probe_build_versions(root: str = "/") -> tuple[tuple[str, str], ...]:
    try:
        with open(os.path.join(root, BUILD_VERSIONS_FILE.lstrip("/")), encoding="utf-8", errors="replace") as f:
            return parse_build_versions(f.read(64 * 1024))
    except OSError:
        return ()


def probe_interfaces(root: str = "/") -> tuple[str, ...]:
    try:
        return tuple(sorted(os.listdir(os.path.join(root, "sys/class/net"))))
    except OSError:
        return ()


def _run_quietly(argv: list[str]) -> str | None:
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=DEFAULTS.tool_probe_timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


# --- the kernel's out-of-memory kills in this container's memory cgroup ------------------------


def decide_oom_event_files(proc_self_cgroup: str, cgroup_root: str = "/sys/fs/cgroup") -> list[str]:
    """Where this process's memory cgroup counts OOM kills, most specific first: cgroup v2's
    memory.events (`oom_kill N`) and v1's memory.oom_control (`oom_kill N`, kernel >= 4.13).
    In a container the cgroup's path reads "/" (its own namespace) and the mount is its own."""
    files = []
    for line in proc_self_cgroup.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        path = path.strip().rstrip("/")
        if hierarchy == "0" and controllers == "":
            files += [f"{cgroup_root}{path}/memory.events", f"{cgroup_root}/unified{path}/memory.events"]
        elif "memory" in controllers.split(","):
            files.append(f"{cgroup_root}/memory{path}/memory.oom_control")
    files += [f"{cgroup_root}/memory.events", f"{cgroup_root}/memory/memory.oom_control"]
    return list(dict.fromkeys(files))


def parse_oom_kill_count(text: str) -> int | None:
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


def load_oom_kill_count(cgroup_root: str = "/sys/fs/cgroup") -> int | None:
    """The OOM kills counted so far in this process's memory cgroup; None if it cannot be read
    (then nobody can tell an OOM kill from another SIGKILL, and the report says so)."""
    try:
        with open("/proc/self/cgroup") as f:
            candidates = decide_oom_event_files(f.read(), cgroup_root)
    except OSError:
        return None
    for path in candidates:
        try:
            with open(path) as f:
                count = parse_oom_kill_count(f.read())
        except OSError:
            continue
        if count is not None:
            return count
    return None

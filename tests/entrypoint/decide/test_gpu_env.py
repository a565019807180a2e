"""GPU jobs: which network NCCL uses (and the plan saying why), and CUDA forward
compatibility, decided from probed facts; the probes against fake /proc and compat trees."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from entrypoint.decide.gpu_env import build_gpu_env, build_nccl_hang_env, decide_cuda_compat, parse_driver_version
from entrypoint.job.probe import (
    CUDA_COMPAT_DIR,
    parse_nvidia_proc_version,
    probe_cuda_compat_driver_version,
    probe_gpu_driver_version,
)
from support.jobs import CPU, GPU4, GPU8_EFA, make_job, plan_for

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

NCCL_HANG = {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/opt/ml/output/data/nccl_trace_rank_"}
PROPRIETARY = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\nGCC version:  gcc version 10.2.1\n"
OPEN = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder@U16)  Tue Sep 23 2025\n"


def test_driver_version_from_proc_both_kernel_module_kinds():
    assert parse_nvidia_proc_version(PROPRIETARY) == "535.104.05"
    assert parse_nvidia_proc_version(OPEN) == "580.95.05"
    assert parse_nvidia_proc_version("garbage") is None


def test_probes_read_proc_and_the_compat_link(tmp_path):
    assert probe_gpu_driver_version(str(tmp_path)) is None
    assert probe_cuda_compat_driver_version(str(tmp_path)) is None
    (tmp_path / "proc/driver/nvidia").mkdir(parents=True)
    (tmp_path / "proc/driver/nvidia/version").write_text(OPEN)
    compat = tmp_path / CUDA_COMPAT_DIR.lstrip("/")
    compat.mkdir(parents=True)
    (compat / "libcuda.so.580.95.05").touch()
    os.symlink("libcuda.so.580.95.05", compat / "libcuda.so.1")
    assert probe_gpu_driver_version(str(tmp_path)) == "580.95.05"
    assert probe_cuda_compat_driver_version(str(tmp_path)) == "580.95.05"


@pytest.mark.parametrize("host, compat, use", [
    ("535.104.05", "580.95.05", True),    # older driver: the image's CUDA 13 needs the compat libcuda
    ("580.95.05", "580.95.05", False),    # the same driver
    ("590.10.01", "580.95.05", False),    # newer driver: runs CUDA 13 by itself
    ("580.95.5", "580.95.05", False),     # numerically equal, compared as numbers not strings
    ("580.9.05", "580.95.05", True),      # 9 < 95 as numbers ("580.9" > "580.95" as text)
    (None, "580.95.05", False),           # no GPU driver visible
    ("535.104.05", None, False),          # no compat libraries in this image
    ("bogus", "580.95.05", False),
])
def test_cuda_compat_only_for_an_older_driver(host, compat, use):
    assert decide_cuda_compat(host, compat) is use


def test_version_parser():
    assert parse_driver_version("580.95.05") == (580, 95, 5)
    assert parse_driver_version(" 535.104.05\n") == (535, 104, 5)
    assert parse_driver_version("") is None and parse_driver_version("5a.1") is None


def test_no_gpu_no_nccl_or_cuda_settings():
    old_driver = CPU._replace(gpu_driver_version="535.104.05", cuda_compat_driver_version="580.95.05")
    assert build_gpu_env({}, old_driver, "eth0") == ({}, [])


def test_efa_leaves_the_plugin_to_load_and_says_so():
    env, notes = build_gpu_env({}, GPU8_EFA, "eth0")
    assert env == NCCL_HANG
    assert notes[0] == "NCCL network: EFA through the aws-ofi-nccl plugin (libfabric's efa provider): an EFA device is present"


def test_no_efa_turns_the_plugin_off():
    env, notes = build_gpu_env({}, GPU4, "ens5")
    assert env == {"NCCL_NET_PLUGIN": "none", **NCCL_HANG}
    assert notes[0].startswith("NCCL network: TCP sockets on ens5")


@pytest.mark.parametrize("environ", [{"NCCL_NET_PLUGIN": "ofi"}, {"NCCL_NET": "Socket"}])
def test_the_jobs_own_nccl_network_choice_wins(environ):
    for facts in (GPU4, GPU8_EFA):
        env, notes = build_gpu_env(environ, facts, "eth0")
        assert "NCCL_NET_PLUGIN" not in env
        assert notes[0].startswith("NCCL network: as the job's environment sets it (")


@pytest.mark.parametrize("facts", [GPU4, GPU8_EFA])
def test_gpu_jobs_get_the_nccl_watchdog_and_flight_recorder_with_the_trace_in_the_jobs_output(facts):
    env, notes = build_gpu_env({}, facts, "eth0")
    assert {k: env[k] for k in NCCL_HANG} == NCCL_HANG
    assert "NCCL hangs: a collective past the process group's timeout fails its rank, and the last collectives are " \
           "written to /opt/ml/output/data/nccl_trace_rank_<rank>" in notes
    # Outside /opt/ml (SAGEMAKER_BASE_DIR), the trace follows the job's output folder.
    env, _ = build_gpu_env({"SAGEMAKER_BASE_DIR": "/tmp/ml"}, facts, "eth0")
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "/tmp/ml/output/data/nccl_trace_rank_"


def test_no_gpu_no_nccl_hang_settings():
    env, notes = build_gpu_env({}, CPU, "eth0")
    assert not any(k.startswith("TORCH_") for k in env) and not any("NCCL hangs" in n for n in notes)
    assert not any(k.startswith("TORCH_") for k in plan_for(make_job(), CPU).env_dict)


@pytest.mark.parametrize("environ, kept", [
    ({"TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}, "TORCH_NCCL_DUMP_ON_TIMEOUT"),
    ({"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/mnt/traces/rank_"}, "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"),
    ({"TORCH_FR_DUMP_TEMP_FILE": "/mnt/traces/rank_"}, "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"),
])  # fmt: skip
def test_the_jobs_own_nccl_hang_setting_wins_under_either_of_torchs_names(environ, kept):
    env, _ = build_gpu_env(environ, GPU4, "eth0")
    assert kept not in env
    assert {k: v for k, v in NCCL_HANG.items() if k != kept} == {k: env[k] for k in NCCL_HANG if k != kept}
    assert build_nccl_hang_env(environ) == {k: v for k, v in NCCL_HANG.items() if k != kept}


def test_the_nccl_hang_settings_reach_every_rank_of_a_gpu_job():
    plan = plan_for(make_job(hosts=("algo-1", "algo-2"), hps={"sagemaker_mpi_enabled": True}), GPU4)
    argv = plan.processes[0].argv
    assert set(NCCL_HANG) <= {argv[i + 1] for i, a in enumerate(argv) if a == "-x"}  # forwarded by mpirun
    torchrun = plan_for(make_job(hosts=("algo-1", "algo-2"), hps={"sagemaker_torch_distributed_enabled": True}), GPU4)
    assert {k: torchrun.env_dict[k] for k in NCCL_HANG} == NCCL_HANG  # torchrun's ranks inherit its env


def test_the_nccl_hang_setting_names_are_torchs():
    """The names as the installed torch reads them: its C++ headers (shipped in the wheel, CPU
    or CUDA) for most, the library's strings for the trace file's."""
    import importlib.util
    import mmap

    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        pytest.skip("torch is not installed in this environment: nothing to check the names against")
    root = Path(spec.origin).parent
    include = root / "include/torch/csrc/distributed/c10d"
    text = (include / "ProcessGroupNCCL.hpp").read_text() + (include / "FlightRecorder.hpp").read_text()
    assert '"TORCH_NCCL_DUMP_ON_TIMEOUT"' in text
    # What we rely on torch's defaults for instead of setting: the watchdog ends a rank whose
    # collective timed out without ncclCommAbort (3, SkipCleanUp), and the recorder is on.
    assert "the default value (3 - SkipCleanUp)" in text
    assert '{"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"}, 2000)' in text
    with open(root / "lib/libtorch_cpu.so", "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as library:
        for name in (b"TORCH_NCCL_DEBUG_INFO_TEMP_FILE\0", b"TORCH_FR_DUMP_TEMP_FILE\0"):
            assert library.find(name) >= 0, name


def test_compat_goes_first_on_the_library_path_once():
    facts = GPU8_EFA._replace(gpu_driver_version="535.104.05", cuda_compat_driver_version="580.95.05")
    env, notes = build_gpu_env({"LD_LIBRARY_PATH": "/opt/amazon/efa/lib"}, facts, "eth0")
    assert env["LD_LIBRARY_PATH"] == f"{CUDA_COMPAT_DIR}:/opt/amazon/efa/lib"
    assert any("535.104.05 is older than 580.95.05" in n for n in notes)
    env, _ = build_gpu_env({"LD_LIBRARY_PATH": f"{CUDA_COMPAT_DIR}:/x"}, facts, "eth0")
    assert "LD_LIBRARY_PATH" not in env  # already there: not added twice
    assert build_gpu_env({}, facts, "eth0")[0]["LD_LIBRARY_PATH"] == CUDA_COMPAT_DIR
    new_driver = facts._replace(gpu_driver_version="590.1.1")
    assert "LD_LIBRARY_PATH" not in build_gpu_env({"LD_LIBRARY_PATH": "/x"}, new_driver, "eth0")[0]


def test_plan_for_a_one_gpu_host_carries_the_settings_and_forwards_them_to_mpi_ranks():
    facts = GPU4._replace(gpu_driver_version="535.104.05", cuda_compat_driver_version="580.95.05")
    single = plan_for(make_job(), facts)
    assert single.env_dict["NCCL_NET_PLUGIN"] == "none" and single.env_dict["LD_LIBRARY_PATH"] == CUDA_COMPAT_DIR
    mpi = plan_for(make_job(hosts=("algo-1", "algo-2"), hps={"sagemaker_mpi_enabled": True}), facts)
    argv = mpi.processes[0].argv
    forwarded = {argv[i + 1] for i, a in enumerate(argv) if a == "-x"}
    assert {"NCCL_NET_PLUGIN", "LD_LIBRARY_PATH"} <= forwarded

"""GPU jobs: which network NCCL uses (and the plan saying why), and CUDA forward
compatibility, decided from probed facts; the probes against fake /proc and compat trees."""

from __future__ import annotations

import os

import pytest

from entrypoint.gpu_env import build_gpu_env, decide_cuda_compat, parse_driver_version
from entrypoint.probe import (
    CUDA_COMPAT_DIR,
    parse_nvidia_proc_version,
    probe_cuda_compat_driver_version,
    probe_gpu_driver_version,
)
from support.jobs import CPU, GPU4, GPU8_EFA, make_job, plan_for

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
    assert env == {}
    assert notes == ["NCCL network: EFA through the aws-ofi-nccl plugin (libfabric's efa provider): an EFA device is present"]


def test_no_efa_turns_the_plugin_off():
    env, notes = build_gpu_env({}, GPU4, "ens5")
    assert env == {"NCCL_NET_PLUGIN": "none"}
    assert notes[0].startswith("NCCL network: TCP sockets on ens5")


@pytest.mark.parametrize("environ", [{"NCCL_NET_PLUGIN": "ofi"}, {"NCCL_NET": "Socket"}])
def test_the_jobs_own_nccl_network_choice_wins(environ):
    for facts in (GPU4, GPU8_EFA):
        env, notes = build_gpu_env(environ, facts, "eth0")
        assert "NCCL_NET_PLUGIN" not in env
        assert notes[0].startswith("NCCL network: as the job's environment sets it (")


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

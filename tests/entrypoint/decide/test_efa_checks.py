"""EFA, NCCL and the instance checked before a hang: the EFA devices found against the sourced
table (entrypoint/decide/preflight.py EFA_DEVICES), the container's verbs devices, the image's
libfabric and aws-ofi-nccl plugin, the versions the image was built with (its build-versions
file) against known-bad pairs, and the plan's NCCL-network line naming those versions. A fake
/sys/class/infiniband and /dev/infiniband tree stands in for EFA hosts (none here)."""

from __future__ import annotations

import os

import pytest

from entrypoint.cli import run_preflight
from entrypoint.decide.gpu_env import build_gpu_env
from entrypoint.decide.preflight import EFA_DEVICES, MIB, PreflightFacts, decide_efa_findings, parse_version
from entrypoint.job.paths import MlPaths
from entrypoint.job.probe import (
    BUILD_VERSIONS_FILE,
    parse_build_versions,
    probe_build_versions,
    probe_efa_device_count,
    probe_library,
    probe_uverbs_count,
)
from support.jobs import GPU8_EFA, TRN1_EFA, make_job, plan_for

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

VERSIONS = (("EFA_INSTALLER", "1.49.0"), ("LIBFABRIC", "2.4.0amzn5.0"), ("AWS_OFI_NCCL", "1.20.0"),
            ("NCCL", "2.29.7"), ("CUDA", "13.0.2"), ("TORCH", "2.13.0"))  # fmt: skip
P4D = PreflightFacts(host="algo-1", instance_type="ml.p4d.24xlarge", shm_bytes=64 * 1024 * MIB, free_bytes=(),
                     gpu_count=8, neuron_core_count=0, efa=True, memlock_soft=None, processes_per_host=8,
                     host_count=2, efa_devices=4, efa_uverbs=4, build_versions=VERSIONS)  # fmt: skip


def texts(facts: PreflightFacts) -> list[tuple[bool, str]]:
    return [(f.fatal, f.text) for f in decide_efa_findings(facts)]


# --- the table, from AWS's network specifications (Network cards, one EFA each) --------------

@pytest.mark.parametrize("instance_type, devices", [
    ("ml.p4d.24xlarge", 4), ("ml.p4de.24xlarge", 4), ("ml.p5.48xlarge", 32), ("ml.p5e.48xlarge", 32),
    ("ml.p5en.48xlarge", 16), ("ml.p6-b200.48xlarge", 8), ("ml.trn1.32xlarge", 8), ("ml.trn1n.32xlarge", 16),
    ("ml.trn2.48xlarge", 16),
])  # fmt: skip
def test_every_efa_instance_type_is_checked_for_its_devices(instance_type, devices):
    assert EFA_DEVICES[instance_type] == devices
    trn = instance_type.startswith("ml.trn")
    facts = P4D._replace(instance_type=instance_type, efa_devices=devices, efa_uverbs=devices,
                         gpu_count=0 if trn else 8, neuron_core_count=32 if trn else 0)
    assert texts(facts) == []
    [(fatal, text)] = texts(facts._replace(efa_devices=0, efa_uverbs=0))
    assert fatal and f"algo-1 ({instance_type}) shows none of its {devices} EFA devices" in text
    assert "run the job again" in text and "--device=/dev/infiniband/uverbsN" in text


def test_a_single_host_or_a_cpu_job_does_not_need_efa():
    assert texts(P4D._replace(host_count=1, efa_devices=0, efa_uverbs=0)) == []
    assert texts(P4D._replace(gpu_count=0, efa_devices=0, efa_uverbs=0)) == []
    assert texts(P4D._replace(instance_type="ml.g5.48xlarge", efa_devices=0, efa_uverbs=0)) == []  # no EFA there


def test_missing_efa_with_the_jobs_own_nccl_network_only_warns_on_gpu_but_not_on_trainium():
    [(fatal, text)] = texts(P4D._replace(efa_devices=0, efa_uverbs=0, job_settings=(("NCCL_NET", "Socket"),)))
    assert not fatal and "the job chose its network ({'NCCL_NET': 'Socket'})" in text
    trn = P4D._replace(instance_type="ml.trn1.32xlarge", gpu_count=0, neuron_core_count=32, efa_devices=0,
                       efa_uverbs=0, job_settings=(("NCCL_NET", "Socket"),))
    [(fatal, text)] = texts(trn)
    assert fatal and "Neuron collectives between the 2 hosts" in text


def test_fewer_efa_devices_than_the_type_has_warns():
    [(fatal, text)] = texts(P4D._replace(efa_devices=3, efa_uverbs=3))
    assert not fatal and "shows 3 of its 4 EFA devices" in text


def test_efa_the_container_was_not_given_is_fatal():
    [(fatal, text)] = texts(P4D._replace(efa_uverbs=0))
    assert fatal and "has 4 EFA device(s) but the container was given no /dev/infiniband/uverbs*" in text


def test_an_image_without_libfabric_or_the_plugin_cannot_use_efa():
    [(fatal, text)] = texts(P4D._replace(libfabric=False))
    assert fatal and "this image has no libfabric (/opt/amazon/efa)" in text
    [(fatal, text)] = texts(P4D._replace(ofi_nccl_plugin=False))
    assert fatal and "no aws-ofi-nccl plugin" in text and "install-efa.sh --with-nccl-plugin" in text
    assert texts(P4D._replace(ofi_nccl_plugin=False, job_settings=(("NCCL_NET_PLUGIN", "none"),))) == []


def test_nccl_2_19_with_an_efa_installer_before_1_29_is_fatal_with_the_fix():
    old = P4D._replace(build_versions=(("EFA_INSTALLER", "1.28.0"), ("NCCL", "2.29.7"), ("AWS_OFI_NCCL", "1.7.3")))
    [(fatal, text)] = texts(old)
    assert fatal and "NCCL 2.29.7 with EFA installer 1.28.0" in text and "aws-ofi-nccl issue 584" in text
    assert "FI_EFA_SET_CUDA_SYNC_MEMOPS=0" in text and "(image built with aws-ofi-nccl 1.7.3" in text
    assert texts(old._replace(job_settings=(("FI_EFA_SET_CUDA_SYNC_MEMOPS", "0"),))) == []
    assert texts(old._replace(build_versions=(("EFA_INSTALLER", "1.28.0"), ("NCCL", "2.18.5")))) == []


def test_aws_ofi_nccl_1_18_warns_of_the_broadcast_hang():
    [(fatal, text)] = texts(P4D._replace(build_versions=(("EFA_INSTALLER", "1.47.0"), ("AWS_OFI_NCCL", "1.18.0"))))
    assert not fatal and "aws-ofi-nccl 1.18.0" in text and "1.20.0" in text


def test_version_parser():
    assert parse_version("2.4.0amzn5.0") == (2, 4, 0)
    assert parse_version("1.29.1") == (1, 29, 1) and parse_version("13.0") == (13, 0)
    assert parse_version(None) == () and parse_version("unknown") == ()


# --- the probes, on a fake tree ------------------------------------------------------------

def fake_efa_host(root, devices: int, uverbs: int):
    (root / "drivers/efa").mkdir(parents=True)
    (root / "drivers/mlx5").mkdir(parents=True)
    for i in range(devices):
        dev = root / f"sys/class/infiniband/rdmap{i}s0/device"
        dev.mkdir(parents=True)
        os.symlink(root / "drivers/efa", dev / "driver")
    other = root / "sys/class/infiniband/mlx5_0/device"
    other.mkdir(parents=True)
    os.symlink(root / "drivers/mlx5", other / "driver")
    (root / "dev/infiniband").mkdir(parents=True)
    for i in range(uverbs):
        (root / f"dev/infiniband/uverbs{i}").touch()
    (root / "dev/infiniband/rdma_cm").touch()


def test_probes_count_efa_devices_and_verbs_devices_and_find_the_libraries(tmp_path):
    assert (probe_efa_device_count(str(tmp_path)), probe_uverbs_count(str(tmp_path))) == (0, 0)
    fake_efa_host(tmp_path, devices=4, uverbs=3)
    assert probe_efa_device_count(str(tmp_path)) == 4  # the mlx5 device is not EFA
    assert probe_uverbs_count(str(tmp_path)) == 3
    lib = tmp_path / "opt/amazon/efa/lib"
    lib.mkdir(parents=True)
    assert not probe_library(str(tmp_path), ("opt/amazon/efa/lib", "opt/amazon/efa/lib64"), "libfabric.so")
    (lib / "libfabric.so.1").touch()
    assert probe_library(str(tmp_path), ("opt/amazon/efa/lib", "opt/amazon/efa/lib64"), "libfabric.so")


def test_the_build_versions_file_is_read_in_its_order(tmp_path):
    assert probe_build_versions(str(tmp_path)) == ()
    path = tmp_path / BUILD_VERSIONS_FILE.lstrip("/")
    path.parent.mkdir(parents=True)
    path.write_text("".join(f"{k}={v}\n" for k, v in VERSIONS) + "# a comment\nBROKEN\n")
    assert probe_build_versions(str(tmp_path)) == VERSIONS
    assert parse_build_versions("A=\n=B\n") == ()


# --- the plan's NCCL-network line names the versions ---------------------------------------

def test_the_nccl_network_line_names_the_versions_the_image_was_built_with():
    _, notes = build_gpu_env({}, GPU8_EFA._replace(efa_devices=4, build_versions=VERSIONS), "eth0")
    assert notes[0] == ("NCCL network: EFA through the aws-ofi-nccl plugin (libfabric's efa provider): 4 EFA devices "
                        "are present; image built with aws-ofi-nccl 1.20.0, libfabric 2.4.0amzn5.0, EFA installer "
                        "1.49.0, NCCL 2.29.7, CUDA 13.0.2, torch 2.13.0")
    _, notes = build_gpu_env({}, GPU8_EFA._replace(efa=False, build_versions=VERSIONS), "eth0")
    assert notes[0].endswith("(NCCL_NET_PLUGIN=none); image built with NCCL 2.29.7, CUDA 13.0.2, torch 2.13.0")


def test_the_plans_note_carries_the_versions_through_decide():
    plan = plan_for(make_job(hosts=("algo-1", "algo-2"), hps={"sagemaker_torch_distributed_enabled": True}),
                    GPU8_EFA._replace(efa_devices=4, efa_uverbs=4, build_versions=VERSIONS))
    assert any(n.startswith("NCCL network: EFA") and "aws-ofi-nccl 1.20.0" in n for n in plan.notes), plan.notes


# --- the pre-flight as the launcher runs it -------------------------------------------------

def test_the_launcher_stops_a_multi_host_job_on_an_efa_type_without_efa(tmp_path):
    job = make_job(hosts=("algo-1", "algo-2"), hps={"sagemaker_torch_distributed_enabled": True},
                   resource_extra={"current_instance_type": "ml.p4d.24xlarge"})
    facts = GPU8_EFA._replace(efa=False, efa_devices=0, efa_uverbs=0, libfabric=True, ofi_nccl_plugin=True)
    outcome = run_preflight(job, facts, plan_for(job, facts), MlPaths(str(tmp_path)))
    assert outcome is not None and outcome.exit_code == 2
    assert "algo-1 (ml.p4d.24xlarge) shows none of its 4 EFA devices" in outcome.reason
    healthy = facts._replace(efa=True, efa_devices=4, efa_uverbs=4, build_versions=VERSIONS)
    outcome = run_preflight(job, healthy, plan_for(job, healthy), MlPaths(str(tmp_path)))
    assert outcome is None or "EFA device" not in outcome.reason  # /dev/shm or ulimit -l here may fail


def test_trainium_multi_host_without_efa_devices_in_the_container_stops(tmp_path):
    job = make_job(hosts=("algo-1", "algo-2"), hps={"sagemaker_torch_distributed_enabled": True},
                   resource_extra={"current_instance_type": "ml.trn1.32xlarge"})
    facts = TRN1_EFA._replace(efa_devices=8, efa_uverbs=0, libfabric=True)
    outcome = run_preflight(job, facts, plan_for(job, facts), MlPaths(str(tmp_path)))
    assert outcome is not None and "the container was given no /dev/infiniband/uverbs*" in outcome.reason


# --- an image built without EFA (GPU_EFA_INSTALLER_VERSION=none) ---------------------------------

NO_EFA_IMAGE = P4D._replace(libfabric=False, ofi_nccl_plugin=False,
                            build_versions=(("EFA_INSTALLER", "none"), ("NCCL", "2.29.7"), ("CUDA", "13.0.2")))


def test_an_image_built_without_efa_on_an_efa_instance_is_named_with_both_ways_on():
    [(fatal, text)] = texts(NO_EFA_IMAGE)
    assert fatal and "algo-1 (ml.p4d.24xlarge) has EFA but this image was built without EFA" in text
    assert "GPU_EFA_INSTALLER_VERSION=none: no libfabric, no aws-ofi-nccl plugin" in text
    assert "NCCL between the 2 hosts uses TCP sockets" in text and "set NCCL_NET=Socket" in text
    # The job chose sockets knowingly: a warning, which says so.
    [(fatal, text)] = texts(NO_EFA_IMAGE._replace(job_settings=(("NCCL_NET", "Socket"),)))
    assert not fatal and "the job chose its network ({'NCCL_NET': 'Socket'})" in text


def test_an_image_built_without_efa_where_no_efa_shows_adds_what_it_lacks():
    found = texts(NO_EFA_IMAGE._replace(efa_devices=0, efa_uverbs=0))
    assert [fatal for fatal, _ in found] == [True, False]
    assert "shows none of its 4 EFA devices" in found[0][1]
    assert "this image was built without EFA" in found[1][1] and found[1][1].endswith(".")
    # One host, or an instance type without EFA: nothing to say.
    assert texts(NO_EFA_IMAGE._replace(host_count=1)) == []
    assert texts(NO_EFA_IMAGE._replace(instance_type="ml.g5.48xlarge", efa_devices=0, efa_uverbs=0)) == []

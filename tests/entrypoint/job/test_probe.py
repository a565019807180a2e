"""The probe reads the machine; fake sysfs/devfs trees stand in for EFA hosts."""

import os

import pytest

from entrypoint.job.probe import parse_neuron_ls_json, parse_nvidia_smi_list, probe_efa, probe_interfaces, probe_machine
from entrypoint.decide.topology import choose_interface

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick


def test_efa_from_sysfs_driver_link(tmp_path):
    dev = tmp_path / "sys/class/infiniband/rdmap16s27/device"
    dev.mkdir(parents=True)
    (tmp_path / "drivers/efa").mkdir(parents=True)
    os.symlink(tmp_path / "drivers/efa", dev / "driver")
    assert probe_efa(str(tmp_path)) is True


def test_efa_from_uverbs_device(tmp_path):
    (tmp_path / "dev/infiniband").mkdir(parents=True)
    (tmp_path / "dev/infiniband/uverbs0").touch()
    assert probe_efa(str(tmp_path)) is True


def test_no_efa_on_an_empty_machine(tmp_path):
    assert probe_efa(str(tmp_path)) is False


def test_interfaces_listed(tmp_path):
    for name in ("lo", "eth0", "ens5"):
        (tmp_path / "sys/class/net" / name).mkdir(parents=True)
    assert probe_interfaces(str(tmp_path)) == ("ens5", "eth0", "lo")


def test_parsers():
    assert parse_nvidia_smi_list("GPU 0: NVIDIA A100 (UUID: x)\nGPU 1: NVIDIA A100 (UUID: y)\n") == 2
    assert parse_neuron_ls_json('[{"nc_count": 2}, {"nc_count": 2}]') == 4
    assert parse_neuron_ls_json("not json") == 0


def test_interface_fallbacks():
    assert choose_interface("ethwe", ("eth0", "lo"))[0] == "eth0"
    assert choose_interface("ethwe", ("ens5", "lo"))[0] == "ens5"
    assert choose_interface("eth0", ("eth0", "lo")) == ("eth0", None)


def test_probe_of_this_machine_is_plain_data():
    facts = probe_machine()
    assert facts.gpu_count >= 0 and facts.neuron_core_count >= 0
    assert "lo" in facts.interfaces and facts.cpu_count >= 1


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root for a private mount namespace over /opt")
def test_gethostname_shim_answers_current_host(tmp_path):
    """The toolkit's prebuilt library, preloaded, makes gethostname() say current_host. It
    reads /opt/ml itself, so the test gives it one in a private mount namespace."""
    import json
    import subprocess
    import sys

    from entrypoint.job.probe import probe_gethostname_shim

    shim = probe_gethostname_shim()
    assert shim is not None  # sagemaker-training is a dependency
    config = tmp_path / "resourceconfig.json"
    config.write_text(json.dumps({"current_host": "algo-7", "hosts": ["algo-7"]}))
    script = (
        "mount -t tmpfs none /opt && mkdir -p /opt/ml/input/config && "
        'cp "$1" /opt/ml/input/config/ && LD_PRELOAD="$2" "$3" -c "import socket; print(socket.gethostname())"'
    )
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(config), shim, sys.executable],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "algo-7"

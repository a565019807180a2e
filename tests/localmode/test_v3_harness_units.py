"""The v3 harness's pure parts (no Docker, no SDK)."""

from pathlib import Path

import pytest

from localmode.v3_harness import (
    build_docker_run_argv,
    build_resource_config,
    build_v3_spec,
    decide_sdk_v3_python,
    parse_inspect_exits,
)
from support.docker import parse_engine_exports as parse_docker_engine_exports

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick


def test_spec_is_what_the_driver_reads():
    spec = build_v3_spec(image="img", container_root=Path("/r"), source_dir=Path("/s"), entry_script="train.py",
                         instance_count=2, distributed={"kind": "mpi", "process_count_per_node": 2},
                         hyperparameters={"epochs": 3}, environment={"X": 1})
    assert (spec.instance_type, spec.environment, spec.command) == ("local_cpu", {"X": "1"}, None)
    with pytest.raises(ValueError, match="expected 'torchrun' or 'mpi'"):
        build_v3_spec(image="i", container_root=Path("/r"), source_dir=Path("/s"), entry_script="t.py",
                      instance_count=1, distributed={"kind": "pytorchddp"})


def test_container_exits_by_host():
    text = "algo-1 0\nalgo-2 137\n\ngarbage\n"
    assert parse_inspect_exits(text) == {"algo-1": 0, "algo-2": 137}


def test_engine_exports():
    assert parse_docker_engine_exports("export DOCKER_HOST=unix:///run/x.sock\nnoise\n") == {"DOCKER_HOST": "unix:///run/x.sock"}


def test_hosts_are_laid_out_as_v3_local_mode_lays_them_out():
    assert build_resource_config("algo-2", ["algo-1", "algo-2"]) == {
        "current_host": "algo-2", "hosts": ["algo-1", "algo-2"],
        "network_interface_name": "ethwe", "current_instance_type": "local_cpu",
    }
    argv = build_docker_run_argv("img", "c", "net", "algo-1", [("/a", "/b")], "exec sshd -D", {"K": "v"})
    assert argv == ["docker", "run", "-d", "--name", "c", "--network", "net", "--network-alias", "algo-1",
                    "-v", "/a:/b", "-e", "K=v", "--entrypoint", "/bin/bash", "img", "-c", "exec sshd -D"]


def test_another_sdk_v3_interpreter_can_be_named():
    assert decide_sdk_v3_python({"BYOC_SDK_V3_PYTHON": "/opt/v3/bin/python"}) == Path("/opt/v3/bin/python")
    assert decide_sdk_v3_python({}).parts[-3:] == (".venv-sdk-v3", "bin", "python")

"""The harness's pure parts: what the driver is told, where artifacts are looked for."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from localmode.harness import (
    DRIVER,
    build_clean_log,
    build_driver_argv,
    build_v2_spec,
    decide_artifact_path,
)
from support.docker import decide_image_tag
from support.docker import parse_engine_exports as parse_docker_engine_exports

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick


def test_image_tag_from_environment_or_default():
    assert decide_image_tag({}) == "byoc-training:cpu-local"
    assert decide_image_tag({"BYOC_IMAGE_TAG": "byoc-training:h-v2"}) == "byoc-training:h-v2"


def test_docker_engine_exports_parsed():
    assert parse_docker_engine_exports("export DOCKER_HOST=unix:///run/x.sock\nnoise\n") == {"DOCKER_HOST": "unix:///run/x.sock"}


def test_spec_turns_folders_into_file_uris_and_keeps_values(tmp_path):
    spec = build_v2_spec(image_uri="img:1", container_root=tmp_path / "root", source_dir=tmp_path / "code",
                         entry_point="train.py", instance_count=2, hyperparameters={"layers": [1, 2]},
                         distribution={"mpi": {"enabled": True}}, environment={"N": 1},
                         channels={"train": tmp_path / "data", "s3": "s3://b/k"})
    assert spec.channels == {"train": f"file://{tmp_path}/data", "s3": "s3://b/k"}
    assert spec.environment == {"N": "1"} and spec.hyperparameters == {"layers": [1, 2]}
    assert spec.instance_type == "local"


def test_generic_estimator_takes_no_distribution(tmp_path):
    with pytest.raises(ValueError, match="no distribution="):
        build_v2_spec(image_uri="i", container_root=tmp_path, source_dir=tmp_path, entry_point="t.py", instance_count=1,
                      hyperparameters=None, distribution={"mpi": {"enabled": True}}, environment=None, channels=None,
                      estimator="estimator")


def test_artifact_paths_and_log_cleaning():
    assert decide_artifact_path("file:///r/j/compressed_artifacts/model.tar.gz", "output.tar.gz") == \
        Path("/r/j/compressed_artifacts/output.tar.gz")
    assert decide_artifact_path("s3://b/k/model.tar.gz", "model.tar.gz") is None
    assert build_clean_log("a\r\nb\rc\n") == "a\nb\nc\n"
    assert build_clean_log("\x1b[36mx-algo-1-ab |\x1b[0m hi\r\n") == "x-algo-1-ab | hi\n"


def test_driver_argv_and_driver_uses_only_the_sdk_and_stdlib():
    argv = build_driver_argv(Path("/v/bin/python"), Path("/s.json"), Path("/r.json"))
    assert argv == ["/v/bin/python", str(DRIVER), "/s.json", "/r.json"]
    # It runs in the SDK's venv, where the project is not installed.
    imported = {n.names[0].name.split(".")[0] for n in ast.walk(ast.parse(DRIVER.read_text())) if isinstance(n, ast.Import)}
    imported |= {n.module.split(".")[0] for n in ast.walk(ast.parse(DRIVER.read_text())) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= {"__future__", "json", "logging", "sys", "time", "traceback", "sagemaker"}, imported

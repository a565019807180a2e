"""Pure pieces of train/, tested by value."""

from __future__ import annotations

import io
import json
import re
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from train.batches import build_batch_indices, build_epoch_order, build_eval_indices, build_steps_per_epoch
from train.channels import ChannelConfig, decide_shard, load_input_data_config, parse_input_data_config
from train.config import HyperparameterError, parse_config
from train.metrics import format_metrics, format_progress
from train.paths import load_job_paths, parse_job_paths
from train.records import RECORDIO_MAGIC, iter_recordio_payloads
from train.ranks import RankInfo, parse_rank_info
from train.schedule import build_lr, build_peak_lr, build_warmup_steps

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

DOCS = Path(__file__).resolve().parents[2] / "docs" / "training.md"


# -- ranks -------------------------------------------------------------------------------
@pytest.mark.parametrize("environ, expected", [
    ({}, RankInfo(0, 0, 1, 1, "single")),
    ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, RankInfo(3, 1, 4, 2, "torchrun")),
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, RankInfo(2, 0, 4, 2, "openmpi")),
    ({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "2"},
     RankInfo(1, 1, 2, 2, "horovod")),
    ({"PMI_RANK": "1", "PMI_SIZE": "2"}, RankInfo(1, 0, 2, 2, "pmi", local_rank_known=False)),
    # The PS launch: the training rank is the worker rank, RANK counts the shards too.
    ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "BYOC_PS_ROLE": "worker", "BYOC_PS_SERVERS": "ps0,ps1",
      "BYOC_NUM_WORKERS": "2", "BYOC_WORKER_RANK": "1"}, RankInfo(1, 0, 2, 1, "ps")),
    # torchrun wins over the MPI variables an outer mpirun may leave behind.
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8"},
     RankInfo(0, 0, 2, 1, "torchrun")),
])
def test_rank_info_from_each_launcher(environ, expected):
    assert parse_rank_info(environ) == expected


@pytest.mark.parametrize("environ, message", [
    ({"RANK": "2", "WORLD_SIZE": "2"}, "outside world size"),
    ({"RANK": "x", "WORLD_SIZE": "2"}, "not an integer"),
    ({"BYOC_PS_ROLE": "server", "RANK": "0"}, "only a parameter-server worker"),
])
def test_rank_info_errors(environ, message):
    with pytest.raises(ValueError, match=message):
        parse_rank_info(environ)


# -- hyperparameters ---------------------------------------------------------------------
def test_hyperparameters_as_sagemaker_sends_them():
    argv = ["--batch_size", "32", "--hidden_sizes", "[128, 64]", "--lr", "0.1", "--optimizer", "adam",
            "--scale_lr", "false", "--sync_batchnorm", "true", "--warmup_epochs", "5"]
    config = parse_config(argv)
    assert (config.batch_size, config.hidden_sizes, config.lr, config.optimizer) == (32, (128, 64), 0.1, "adam")
    assert config.scale_lr is False and config.sync_batchnorm is True and config.warmup_epochs == 5.0


def test_hyperparameters_in_the_old_toolkit_rendering_and_equals_form():
    config = parse_config(["--hidden_sizes=['16', '8']", "--shuffle", "False", "--optimizer", '"sgd"'])
    assert config.hidden_sizes == (16, 8) and config.shuffle is False and config.optimizer == "sgd"


def test_string_hyperparameter_keeps_text_that_looks_like_json():
    assert parse_config(["--train_channel", "1"]).train_channel == "1"


@pytest.mark.parametrize("argv, message", [
    (["--epochz", "3"], "unknown hyperparameter --epochz"),
    (["--epochs", "2.5"], "expected an integer"),
    (["--lr", "NaN"], "expected a finite number"),  # JSON's NaN
    (["--lr", "1e999"], "expected a finite number"),  # overflows to inf
    (["--lr", "-Infinity"], "expected a finite number"),
    (["--lr", "9" * 400], "expected a finite number"),  # a whole number no float holds
    (["--scale_lr", "yes"], "expected true or false"),
    (["--hidden_sizes", "64"], "expected a JSON list"),
    (["--optimizer", "rmsprop"], "expected one of sgd, adam"),
    (["--epochs", "0"], "must be >= 1"),
    (["--lr"], "has no value"),
    (["stray"], "unexpected argument"),
])
def test_bad_hyperparameters_are_clear_errors(argv, message):
    with pytest.raises(HyperparameterError, match=re.escape(message)):
        parse_config(argv)


# -- batches: the property the correctness tests rely on ----------------------------------
def test_rank_batches_concatenate_to_the_global_batch():
    order = build_epoch_order(100, seed=1, epoch=2, shuffle=True)
    for step in range(build_steps_per_epoch(100, 8, 3)):
        parts = [build_batch_indices(order, step, 8, rank, 3) for rank in range(3)]
        assert np.array_equal(np.concatenate(parts), build_batch_indices(order, step, 24, 0, 1))


def test_epoch_order_is_a_seeded_permutation_that_changes_per_epoch():
    a, b = build_epoch_order(50, 1, 0, True), build_epoch_order(50, 1, 1, True)
    assert sorted(a) == list(range(50)) and not np.array_equal(a, b)
    assert np.array_equal(a, build_epoch_order(50, 1, 0, True))
    assert np.array_equal(build_epoch_order(5, 1, 0, False), np.arange(5))


def test_eval_indices_cover_every_record_once():
    parts = [build_eval_indices(11, r, 3) for r in range(3)]
    assert sorted(np.concatenate(parts)) == list(range(11))


# -- learning rate -----------------------------------------------------------------------
def test_linear_scaling_and_warmup():
    peak = build_peak_lr(0.1, 8, True)
    assert peak == pytest.approx(0.8) and build_peak_lr(0.1, 8, False) == 0.1
    warmup = build_warmup_steps(5, 100)
    assert warmup == 500
    assert build_lr(0, 0.1, peak, warmup) == pytest.approx(0.1)
    assert build_lr(250, 0.1, peak, warmup) == pytest.approx(0.45)
    assert build_lr(500, 0.1, peak, warmup) == pytest.approx(0.8)
    assert build_lr(0, 0.1, peak, 0) == pytest.approx(0.8)


# -- channels ----------------------------------------------------------------------------
def test_input_data_config_and_sharding(tmp_path):
    config = parse_input_data_config({"train": {"TrainingInputMode": "Pipe", "S3DistributionType": "ShardedByS3Key",
                                                "RecordWrapperType": "RecordIO"}, "validation": {}})
    assert config["train"] == ChannelConfig("train", "Pipe", "ShardedByS3Key", "", "RecordIO")
    assert config["validation"] == ChannelConfig("validation")
    # Sharded by S3 key: the host already has its own part; split among the host's ranks only.
    assert decide_shard("ShardedByS3Key", rank=3, world_size=4, local_rank=1, local_world_size=2).count == 2
    assert decide_shard("FullyReplicated", rank=3, world_size=4, local_rank=1, local_world_size=2).index == 3
    (tmp_path / "inputdataconfig.json").write_text(json.dumps({"train": {"TrainingInputMode": "FastFile"}}))
    assert load_input_data_config({}, str(tmp_path))["train"].mode == "FastFile"
    env = {"SM_INPUT_DATA_CONFIG": json.dumps({"train": {"TrainingInputMode": "File"}})}
    assert load_input_data_config(env, str(tmp_path))["train"].mode == "File"
    with pytest.raises(ValueError, match="TrainingInputMode 'Stream'"):
        parse_input_data_config({"train": {"TrainingInputMode": "Stream"}})


# -- paths -------------------------------------------------------------------------------
def test_paths_from_sagemaker_variables_and_checkpoint_config(tmp_path):
    paths = parse_job_paths({})
    assert (paths.model_dir, paths.checkpoint_dir, paths.tensorboard_dir) == (
        "/opt/ml/model", "/opt/ml/checkpoints", "/opt/ml/output/tensorboard")
    assert parse_job_paths({"SM_MODEL_DIR": "/m"}).model_dir == "/m"
    (tmp_path / "input/config").mkdir(parents=True)
    (tmp_path / "input/config/checkpointconfig.json").write_text(json.dumps({"LocalPath": "/ckpt"}))
    assert load_job_paths({"SAGEMAKER_BASE_DIR": str(tmp_path)}).checkpoint_dir == "/ckpt"


# -- metrics: the documented regexes parse what the loop prints -----------------------------
def load_documented_regexes() -> dict[str, str]:
    text = DOCS.read_text()
    block = text.split("```json\n", 1)[1].split("```", 1)[0]
    return {d["Name"]: d["Regex"] for d in json.loads(block)}


def test_metric_lines_match_the_documented_regexes():
    regexes = load_documented_regexes()
    line = format_metrics(3, 120, {"train_loss": 1.5e-05, "lr": 0.4, "samples_per_sec": 12345.678})
    assert line == "[metrics] epoch=3 step=120 train_loss=1.5e-05 lr=0.4 samples_per_sec=12345.7"
    final = format_metrics(9, 500, {"validation_accuracy": 0.975, "validation_loss": 0.0812})
    found = {name: re.search(regex, line) or re.search(regex, final) for name, regex in regexes.items()}
    assert {name: float(m.group(1)) for name, m in found.items() if m} == {
        "train:loss": 1.5e-05, "train:lr": 0.4, "train:throughput": 12345.7, "train:epoch": 3.0,
        "validation:accuracy": 0.975, "validation:loss": 0.0812}


def test_progress_line_is_readable():
    assert format_progress(1, 10, 250, 1000, 0.12345, 20480.4, 3725) == \
        "[progress] epoch 2/10 step 250/1000 (25%) loss 0.1235 20,480 samples/s ETA 1:02:05"


# -- properties ----------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), batch=st.integers(1, 16), ranks=st.integers(1, 4), seed=st.integers(0, 2**31),
       epoch=st.integers(0, 50))
def test_batches_partition_the_global_batch_for_any_shape(n, batch, ranks, seed, epoch):
    order = build_epoch_order(n, seed, epoch, True)
    steps = build_steps_per_epoch(n, batch, ranks)
    seen = []
    for step in range(steps):
        parts = [build_batch_indices(order, step, batch, r, ranks) for r in range(ranks)]
        assert all(len(p) == batch for p in parts)
        seen += [int(i) for p in parts for i in p]
    assert len(seen) == len(set(seen)) == steps * batch * ranks  # no record twice in an epoch


@settings(max_examples=40, deadline=None)
@given(payloads=st.lists(st.binary(min_size=0, max_size=40), min_size=1, max_size=6),
       split=st.integers(1, 5))
def test_recordio_unwrapping_round_trips_split_records(payloads, split):
    def record(cflag, data):
        return (struct.pack("<II", RECORDIO_MAGIC, (cflag << 29) | len(data)) + data
                + b"\0" * ((4 - len(data) % 4) % 4))

    stream = b""
    for payload in payloads:  # long payloads split over parts: start (1), middle (2), end (3)
        parts = [payload[i:i + split] for i in range(0, len(payload), split)] or [b""]
        if len(parts) == 1:
            stream += record(0, parts[0])
        else:
            stream += record(1, parts[0]) + b"".join(record(2, p) for p in parts[1:-1]) + record(3, parts[-1])
    assert list(iter_recordio_payloads(io.BytesIO(stream), "test")) == payloads


@pytest.mark.parametrize("environ, expected", [
    # The entrypoint exports MASTER_ADDR/MASTER_PORT for every job (as the DLC does); one rank
    # must still not rendezvous, or every host's rank 0 would join the leader's store.
    ({"MASTER_ADDR": "algo-1", "MASTER_PORT": "7777"}, "local"),
    ({}, "local"),
    ({"MASTER_ADDR": "algo-1", "MASTER_PORT": "7777", "RANK": "1", "WORLD_SIZE": "2"}, "env"),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, "mpi"),
])
def test_ddp_rendezvous_choice(environ, expected):
    from train.ddp_train import decide_rendezvous

    assert decide_rendezvous(environ, parse_rank_info(environ)) == expected


def test_rendezvous_host_under_plain_mpirun():
    """An unresolvable gethostname() used to hang every rank for the collective timeout."""
    import pytest

    from train.ddp_train import decide_rendezvous_host

    resolves = {"algo-1", "vm"}.__contains__
    assert decide_rendezvous_host({"SM_CURRENT_HOST": "algo-1"}, "c0ffee", resolves, all_local=False) == "algo-1"
    assert decide_rendezvous_host({}, "vm", resolves, all_local=False) == "vm"
    assert decide_rendezvous_host({}, "c0ffee", resolves, all_local=True) == "127.0.0.1"
    with pytest.raises(RuntimeError, match="'c0ffee' does not resolve and the ranks span several hosts"):
        decide_rendezvous_host({}, "c0ffee", resolves, all_local=False)

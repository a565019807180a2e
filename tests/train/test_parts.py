"""Pieces of the trainers that need torch but no second process."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from train.checkpoints import build_checkpoint_path, load_checkpoint, save_checkpoint
from train.devices import decide_cpu_threads, decide_precision
from train.loop import build_parameter_digest
from jobs.main_job import build_hyperparameters, build_job_files, load_digits_split
from train.models import build_mlp, load_model, save_model
from train.mpi_train import build_bucket_plan
from train.ps import ParameterShard, build_shard_plan, parse_ps_topology
from jobs.ps_local import build_ps_processes


def test_bucket_plan_walks_backwards_and_cuts_at_the_size():
    # 4-byte elements: 100 elements = 400 bytes.
    plan = build_bucket_plan([100, 10, 100, 10], bucket_bytes=400)
    assert plan.buckets == ((3, 2), (1, 0))
    assert build_bucket_plan([5, 5], bucket_bytes=10**9).buckets == ((1, 0),)


def test_shard_plan_balances_by_size_and_is_deterministic():
    sizes = {"a.weight": 1000, "a.bias": 10, "b.weight": 900, "b.bias": 10, "c.weight": 50}
    plan = build_shard_plan(sizes, 2)
    # 1000 | 900, then every small one goes to the lighter second shard (950, 960, 970 < 1000).
    assert plan == (("a.weight",), ("b.weight", "c.weight", "a.bias", "b.bias"))
    assert sorted(n for shard in plan for n in shard) == sorted(sizes)


def test_ps_processes_follow_the_entrypoint_contract():
    specs = build_ps_processes(2, 2, ["python", "w.py"], "10.0.0.1", 29500, python="python3")
    assert [s.name for s in specs] == ["ps0", "ps1", "worker0", "worker1", "worker2", "worker3"]
    assert specs[0].argv == ("python3", "-m", "train.ps_server")
    assert dict(specs[0].env) == {
        "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "WORLD_SIZE": "6", "RANK": "0", "LOCAL_RANK": "0",
        "BYOC_PS_ROLE": "server", "BYOC_PS_SERVERS": "ps0,ps1", "BYOC_NUM_WORKERS": "4"}
    assert dict(specs[5].env) == {
        "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "WORLD_SIZE": "6", "RANK": "5", "LOCAL_RANK": "1",
        "BYOC_PS_ROLE": "worker", "BYOC_PS_SERVERS": "ps0,ps1", "BYOC_NUM_WORKERS": "4", "BYOC_WORKER_RANK": "3"}
    for spec in specs:  # what each process itself reads back
        topology = parse_ps_topology(dict(spec.env))
        assert topology.rpc_name == spec.name


def test_ps_topology_errors():
    base = {"MASTER_ADDR": "a", "MASTER_PORT": "1", "WORLD_SIZE": "3", "RANK": "2", "BYOC_PS_ROLE": "worker",
            "BYOC_PS_SERVERS": "ps0", "BYOC_NUM_WORKERS": "2", "BYOC_WORKER_RANK": "1"}
    assert parse_ps_topology(base).worker_rank == 1
    with pytest.raises(ValueError, match="WORLD_SIZE=4 but 1 servers"):
        parse_ps_topology({**base, "WORLD_SIZE": "4"})
    with pytest.raises(ValueError, match="does not match"):
        parse_ps_topology({**base, "BYOC_WORKER_RANK": "0"})
    with pytest.raises(ValueError, match="missing MASTER_ADDR"):
        parse_ps_topology({k: v for k, v in base.items() if k != "MASTER_ADDR"})


def test_checkpoint_is_replaced_atomically_and_loads_with_weights_only(tmp_path):
    assert load_checkpoint(str(tmp_path)) is None
    model = build_mlp(4, 3, [5])
    save_checkpoint(str(tmp_path), {"step": 7, "model": model.state_dict(), "optimizer": None})
    save_checkpoint(str(tmp_path), {"step": 8, "model": model.state_dict(), "optimizer": None})
    assert load_checkpoint(str(tmp_path))["step"] == 8
    assert os.listdir(tmp_path) == ["checkpoint.pt"]  # no partial file left behind
    open(build_checkpoint_path(str(tmp_path)), "wb").write(b"torn")
    with pytest.raises(RuntimeError, match="cannot read checkpoint"):
        load_checkpoint(str(tmp_path))


def test_saved_model_loads_with_plain_torch_load(tmp_path):
    model = build_mlp(4, 3, [5], batchnorm=True)
    arch = {"name": "mlp", "in_features": 4, "num_classes": 3, "hidden_sizes": [5], "batchnorm": True}
    path = save_model(model, arch, str(tmp_path), {"validation_accuracy": 0.5})
    saved = torch.load(path)  # weights_only, torch's default
    assert saved["arch"] == arch and saved["metrics"] == {"validation_accuracy": 0.5}
    x = torch.randn(2, 4)
    rebuilt = load_model(path).eval()
    assert torch.equal(rebuilt(x), model.eval()(x))


def test_parameter_digest_sees_one_bit():
    model = build_mlp(4, 3, [5])
    before = build_parameter_digest(model)
    assert before < 2**48 and float(before) == before
    with torch.no_grad():
        weight = model[1].weight.view(-1)
        weight[0] = torch.nextafter(weight[0], torch.tensor(10.0))
    assert build_parameter_digest(model) != before


def test_precision_decisions():
    assert decide_precision("auto", "cpu", False).autocast_dtype is None
    assert decide_precision("auto", "cuda", True).autocast_dtype is torch.bfloat16
    fp16 = decide_precision("auto", "cuda", False)
    assert fp16.autocast_dtype is torch.float16 and fp16.grad_scaler
    assert decide_precision("bf16", "cpu", False).autocast_dtype is torch.bfloat16
    with pytest.raises(ValueError, match="fp16 needs a GPU"):
        decide_precision("fp16", "cpu", False)
    assert decide_cpu_threads({}, 16, 4) == 4 and decide_cpu_threads({"OMP_NUM_THREADS": "1"}, 16, 1) == 1


def test_synchronous_shard_averages_all_workers_before_one_step():
    shard = ParameterShard({"w": torch.zeros(2)}, "sgd", {"lr": 1.0, "momentum": 0.0, "weight_decay": 0.0},
                           None, num_workers=2, mode="sync")

    class LocalRRef:  # what rref.local_value() gives on the owner
        def local_value(self):
            return shard

    push = ParameterShard.push_pull._wrapped_async_rpc_function if hasattr(
        ParameterShard.push_pull, "_wrapped_async_rpc_function") else ParameterShard.push_pull
    first = push(LocalRRef(), {"w": torch.tensor([2.0, 0.0])}, 1.0, False)
    assert not first.done()  # waits for the other worker
    second = push(LocalRRef(), {"w": torch.tensor([0.0, 4.0])}, 1.0, True)
    (params_a, stop_a), (params_b, stop_b) = first.wait(), second.wait()
    assert torch.equal(params_a["w"], torch.tensor([-1.0, -2.0])) and torch.equal(params_a["w"], params_b["w"])
    assert stop_a and stop_b  # one worker's SIGTERM reaches everyone in the same round


def test_main_job_files_and_hyperparameters():
    split = load_digits_split()
    assert len(split.train) + len(split.validation) == 1797 and split.train.x.shape[1] == 64
    files = build_job_files("mpi4py", processes_per_host=2, split=split)
    assert sorted(files) == ["code/train_digits.py", "input/config/hyperparameters.json",
                             "input/config/inputdataconfig.json", "input/data/train/digits-000.npz",
                             "input/data/train/digits-001.npz", "input/data/train/digits-002.npz",
                             "input/data/train/digits-003.npz", "input/data/validation/digits-000.npz"]
    assert "from train.mpi_train import main" in files["code/train_digits.py"].decode()
    assert build_hyperparameters("ps", 1) == {
        "batch_size": "32", "checkpoint_every": "200", "epochs": "20", "log_every": "20", "lr": "0.05",
        "sagemaker_parameter_server_enabled": "true", "sagemaker_program": '"train_digits.py"',
        "warmup_epochs": "1.0"}
    assert build_hyperparameters("horovod", 4)["sagemaker_mpi_num_of_processes_per_host"] == "4"
    with pytest.raises(ValueError, match="backend 'tf'"):
        build_job_files("tf", split=split)


def test_scripts_import_without_optional_frameworks():
    # torch_xla is absent here and horovod may be: importing the scripts must not need them.
    for module in ("train.ddp_train", "train.horovod_train", "train.mpi_train", "train.ps_train", "train.ps_server"):
        __import__(module)
    assert "torch_xla" not in sys.modules


def test_local_ps_outcome_reports_the_first_failure():
    from jobs.ps_local import Outcome

    assert Outcome((0, 0, 0), None).exit_code == 0
    assert Outcome((-15, -15, 1, -15), 2).exit_code == 1
    assert Outcome((-9, 0), 0).exit_code == 137


def test_a_full_disk_leaves_the_previous_checkpoint_and_no_partial_file(tmp_path):
    """The checkpoint folder is a 1 MiB tmpfs (a private mount namespace): a small checkpoint
    fits, a 4 MB one does not."""
    import shutil
    import subprocess
    import textwrap
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    if os.geteuid() != 0 or shutil.which("unshare") is None or subprocess.run(
            ["unshare", "--mount", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs root and unshare(1) allowed: the full disk is a small tmpfs in a private mount namespace")
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    check = textwrap.dedent(f"""
        import os, torch
        from train.checkpoints import CheckpointWriteError, load_checkpoint, save_checkpoint
        folder = {str(folder)!r}
        save_checkpoint(folder, {{"step": 1, "model": {{"w": torch.zeros(10)}}}})
        try:
            save_checkpoint(folder, {{"step": 2, "model": {{"w": torch.zeros(1_000_000)}}}})
        except CheckpointWriteError as err:
            print("ERROR", err)
        print("STEP", load_checkpoint(folder)["step"])
        print("FILES", sorted(os.listdir(folder)))
    """)
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
         f'mount -t tmpfs -o size=1m tmpfs "{folder}" && exec "$0" -c "$1"', sys.executable, check],
        capture_output=True, text=True, timeout=120, cwd=str(repo),
        env={**os.environ, "PYTHONPATH": str(repo)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"ERROR checkpoint not written: the disk holding {folder} is full (" in done.stdout
    assert f"the previous checkpoint {folder}/checkpoint.pt is intact" in done.stdout
    assert "STEP 1" in done.stdout
    assert "FILES ['checkpoint.pt']" in done.stdout  # no partial file left


def test_a_partial_file_left_by_a_killed_writer_is_removed_by_the_next_save(tmp_path):
    stale = tmp_path / "checkpoint.pt.999999999.partial"  # no such process
    stale.write_bytes(b"half a checkpoint")
    mine = tmp_path / f"checkpoint.pt.{os.getpid() + 1}.partial"  # a live writer's name is left alone
    save_checkpoint(str(tmp_path), {"step": 3, "model": {"w": torch.zeros(2)}})
    assert not stale.exists()
    assert load_checkpoint(str(tmp_path))["step"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]
    del mine

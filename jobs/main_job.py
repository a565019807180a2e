"""The default job: a small MLP on scikit-learn's 8x8 digits (shipped with scikit-learn, no
download), exported as .npz shards in a `train` and a `validation` channel.

`build_job_files` returns every file of the job as {path under the SageMaker root: bytes}
(pure except for reading the digits that ship with scikit-learn); `write_job` writes them
under a root such as /opt/ml or an emulated host's folder. Per-host files
(resourceconfig.json) come from `build_resource_config`.

    python -m jobs.main_job --root /tmp/job --backend ddp [--hosts algo-1,algo-2 --processes-per-host 2]

The job's script ends by printing `[result] validation_accuracy=<acc> model=<path>`.
"""

from __future__ import annotations

import argparse
import io
import json
import os
from dataclasses import dataclass

import numpy as np

from train.records import Table

BACKENDS = {  # backend -> (module with main(), distribution hyperparameters the SDK would write)
    "ddp": ("train.ddp_train", {"sagemaker_torch_distributed_enabled": True}),
    "horovod": ("train.horovod_train", {"sagemaker_mpi_enabled": True}),
    "mpi4py": ("train.mpi_train", {"sagemaker_mpi_enabled": True}),
    "ps": ("train.ps_train", {"sagemaker_parameter_server_enabled": True}),
}
ENTRY_SCRIPT = "train_digits.py"
DEFAULT_HYPERPARAMETERS = {"epochs": 20, "batch_size": 32, "lr": 0.05, "warmup_epochs": 1.0,
                           "checkpoint_every": 200, "log_every": 20}


@dataclass(frozen=True)
class DigitsSplit:
    train: Table
    validation: Table


def load_digits_split(validation_fraction: float = 0.2, seed: int = 0) -> DigitsSplit:
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)  # pixel values are 0..16
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    cut = int(len(y) * (1 - validation_fraction))
    return DigitsSplit(Table(x[order[:cut]], y[order[:cut]]), Table(x[order[cut:]], y[order[cut:]]))


def build_npz_shards(table: Table, num_shards: int) -> list[bytes]:
    shards = []
    for part in np.array_split(np.arange(len(table)), num_shards):
        buffer = io.BytesIO()
        np.savez(buffer, x=table.x[part], y=table.y[part])
        shards.append(buffer.getvalue())
    return shards


def build_entry_script(backend: str) -> str:
    module = BACKENDS[backend][0]
    return (f'"""Digits job: the {backend} trainer of the train package, with the job\'s hyperparameters."""\n'
            "import sys\n\n"
            f"from {module} import main\n\n"
            'if __name__ == "__main__":\n'
            "    main(sys.argv[1:])\n")


def build_hyperparameters(backend: str, processes_per_host: int, overrides: dict | None = None) -> dict[str, str]:
    """hyperparameters.json as SDK >= 2.110 writes it: every value JSON-encoded."""
    values: dict = {**DEFAULT_HYPERPARAMETERS, **(overrides or {}), "sagemaker_program": ENTRY_SCRIPT,
                    **BACKENDS[backend][1]}
    if backend in ("horovod", "mpi4py"):
        values["sagemaker_mpi_num_of_processes_per_host"] = processes_per_host
    return {k: json.dumps(v) for k, v in sorted(values.items())}


def build_input_data_config() -> dict:
    channel = {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated",
               "RecordWrapperType": "None", "ContentType": "application/x-npz"}
    return {"train": dict(channel), "validation": dict(channel)}


def build_resource_config(hosts: list[str], current_host: str) -> dict:
    return {"current_host": current_host, "current_instance_type": "local",
            "current_group_name": "homogeneousCluster", "hosts": list(hosts),
            "instance_groups": [{"instance_group_name": "homogeneousCluster", "instance_type": "local",
                                 "hosts": list(hosts)}],
            "network_interface_name": "eth0"}


def build_job_files(backend: str = "ddp", processes_per_host: int = 1, split: DigitsSplit | None = None,
                    train_shards: int = 4, overrides: dict | None = None) -> dict[str, bytes]:
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    split = split or load_digits_split()
    files = {
        "input/config/hyperparameters.json":
            json.dumps(build_hyperparameters(backend, processes_per_host, overrides), indent=2).encode(),
        "input/config/inputdataconfig.json": json.dumps(build_input_data_config(), indent=2).encode(),
        f"code/{ENTRY_SCRIPT}": build_entry_script(backend).encode(),
    }
    for i, shard in enumerate(build_npz_shards(split.train, train_shards)):
        files[f"input/data/train/digits-{i:03d}.npz"] = shard
    files["input/data/validation/digits-000.npz"] = build_npz_shards(split.validation, 1)[0]
    return files


def write_job(root: str, files: dict[str, bytes]) -> None:
    for relative, data in files.items():
        path = os.path.join(root, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        partial = f"{path}.partial"
        with open(partial, "wb") as f:
            f.write(data)
        os.replace(partial, path)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m jobs.main_job", description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", required=True, help="the SageMaker root to write (like /opt/ml)")
    parser.add_argument("--backend", choices=sorted(BACKENDS), default="ddp")
    parser.add_argument("--hosts", default="algo-1", help="comma-separated host names (resourceconfig.json)")
    parser.add_argument("--current-host", default=None, help="default: the first host")
    parser.add_argument("--processes-per-host", type=int, default=1)
    args = parser.parse_args(argv)
    hosts = [h for h in args.hosts.split(",") if h]
    files = build_job_files(args.backend, args.processes_per_host)
    files["input/config/resourceconfig.json"] = json.dumps(
        build_resource_config(hosts, args.current_host or hosts[0])).encode()
    write_job(args.root, files)
    print(f"wrote a {args.backend} digits job under {args.root}")


if __name__ == "__main__":
    main()

"""The main job's SageMaker side, written as a user writes it: SDK v3 `ModelTrainer` local mode.

    .venv-sdk-v3/bin/python scripts/main_job_sdk_v3.py --image byoc-training:cpu-local \
        --code CODE_DIR --entry-point train_digits.py --channel train=DIR --channel validation=DIR \
        --instance-count 2 --distribution '{"torch_distributed": {"enabled": true}}' \
        --hyperparameters '{"epochs": 20}' --container-root DIR --result result.json

The same arguments as scripts/main_job_sdk_v2.py (the runner builds one argv for either);
the estimator's distribution= becomes v3's own: torch_distributed -> Torchrun(), mpi ->
MPI(process_count_per_node=…). Run by `python -m jobs.run_main_job --sdk v3` with the SDK v3
virtual environment's python (standard library + sagemaker only). v3 streams every host's
output while train() runs; result.json gets model_data (v3's local mode leaves model.tar.gz in
<container root>/compressed_artifacts), the wall seconds of train() and the exception if any.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def build_distributed(distribution: dict):
    from sagemaker.train.distributed import MPI, Torchrun

    if "torch_distributed" in distribution:
        return Torchrun()
    if "mpi" in distribution:
        return MPI(process_count_per_node=distribution["mpi"].get("processes_per_host"))
    if distribution:
        raise SystemExit(f"SDK v3 has no launcher for {sorted(distribution)}: use --sdk v2")
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", required=True)
    parser.add_argument("--code", required=True, help="source_dir")
    parser.add_argument("--entry-point", required=True)
    parser.add_argument("--channel", action="append", default=[], help="NAME=LOCAL_DIR")
    parser.add_argument("--instance-count", type=int, default=2)
    parser.add_argument("--distribution", type=json.loads, default={})
    parser.add_argument("--hyperparameters", type=json.loads, default={})
    parser.add_argument("--container-root", required=True)
    parser.add_argument("--result", required=True)
    args = parser.parse_args(argv)

    from sagemaker.train import ModelTrainer
    from sagemaker.train.configs import Compute, InputData, SourceCode
    from sagemaker.train.model_trainer import Mode

    distributed = build_distributed(args.distribution)
    trainer = ModelTrainer(
        training_mode=Mode.LOCAL_CONTAINER,
        training_image=args.image,
        source_code=SourceCode(source_dir=args.code, entry_script=args.entry_point),
        compute=Compute(instance_type="local_cpu", instance_count=args.instance_count),
        distributed=distributed,
        hyperparameters=args.hyperparameters,
        base_job_name="digits",
        local_container_root=args.container_root,
        role="arn:aws:iam::111111111111:role/not-used-in-local-mode",
    )
    channels = [InputData(channel_name=name, data_source=path)
                for name, path in (item.split("=", 1) for item in args.channel)]
    result = {"ok": False, "error": None, "model_data": None, "fit_seconds": None}
    start = time.monotonic()
    try:
        trainer.train(input_data_config=channels, wait=True, logs=True)
        result.update(ok=True, model_data=os.path.join(args.container_root, "compressed_artifacts", "model.tar.gz"))
    except Exception as exc:  # noqa: BLE001 - reported to the runner, which prints it last
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        result["fit_seconds"] = round(time.monotonic() - start, 2)
        with open(args.result, "w") as f:
            json.dump(result, f, indent=2)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""Run ONE SageMaker Python SDK v3 local-container job; run by tests/localmode/v3_harness.py
with the SDK v3 virtual environment's python (.venv-sdk-v3), never the tests' own.

    .venv-sdk-v3/bin/python tests/localmode/v3_driver.py SPEC.json RESULT.json

SPEC (written by v3_harness.build_v3_spec): training_image, container_root, source_dir,
entry_script or command (SourceCode's), instance_type, instance_count, distributed ({"kind": "torchrun"|"mpi",
"process_count_per_node": n} or null), hyperparameters, environment, base_job_name.

It builds `ModelTrainer(training_mode=Mode.LOCAL_CONTAINER, training_image=…,
source_code=SourceCode(…), compute=Compute(…), distributed=Torchrun()/MPI())` and calls
`train()`. RESULT: ok, error, error_type, train_seconds (train() alone), import_seconds.
Everything the SDK prints (its logging, every container's output) goes to stdout, which the
harness keeps.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import traceback


def build_distributed(spec: dict):
    from sagemaker.train.distributed import MPI, Torchrun

    dist = spec.get("distributed")
    if not dist:
        return None
    count = dist.get("process_count_per_node")
    if dist["kind"] == "torchrun":
        return Torchrun(process_count_per_node=count)
    if dist["kind"] == "mpi":
        return MPI(process_count_per_node=count, mpi_additional_options=dist.get("mpi_additional_options"))
    raise ValueError(f"distributed kind {dist['kind']!r}: expected torchrun or mpi")


def main(spec_path: str, result_path: str) -> int:
    with open(spec_path) as f:
        spec = json.load(f)
    result: dict = {"ok": False, "error": None, "error_type": None, "train_seconds": None}
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(name)s %(levelname)s %(message)s")
    started = time.monotonic()
    try:
        from sagemaker.train import ModelTrainer
        from sagemaker.train.configs import Compute, SourceCode
        from sagemaker.train.model_trainer import Mode

        result["import_seconds"] = round(time.monotonic() - started, 2)
        trainer = ModelTrainer(
            training_mode=Mode.LOCAL_CONTAINER,
            training_image=spec["training_image"],
            source_code=SourceCode(
                source_dir=spec["source_dir"],
                entry_script=None if spec.get("command") else spec["entry_script"],
                command=spec.get("command"),
                requirements=spec.get("requirements"),
            ),
            compute=Compute(instance_type=spec["instance_type"], instance_count=spec["instance_count"]),
            distributed=build_distributed(spec),
            hyperparameters=spec["hyperparameters"],
            environment=spec["environment"],
            base_job_name=spec["base_job_name"],
            local_container_root=spec["container_root"],
            role="arn:aws:iam::111111111111:role/unused-in-local-mode",
        )
        began = time.monotonic()
        try:
            trainer.train(wait=True, logs=True)
            result["ok"] = True
        finally:
            result["train_seconds"] = round(time.monotonic() - began, 2)
    except BaseException as exc:  # report whatever train() raised, as the user would see it
        result["error"] = str(exc)
        result["error_type"] = type(exc).__name__
        traceback.print_exc(file=sys.stdout)
    with open(result_path, "w") as f:
        json.dump(result, f)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))

"""The main job's SageMaker side, written as a user writes it: SDK v2 local mode.

    .venv-sdk-v2/bin/python scripts/main_job_sdk_v2.py --image byoc-training:cpu-local \
        --code CODE_DIR --entry-point train_digits.py --channel train=DIR --channel validation=DIR \
        --instance-count 2 --distribution '{"torch_distributed": {"enabled": true}}' \
        --hyperparameters '{"epochs": 20}' --container-root DIR --result result.json

Run by `python -m jobs.run_main_job` (scripts/run-main-job.sh) with the SDK v2 virtual
environment's python (the project is not installed there: standard library + sagemaker
only). The SDK streams every host's output while fit() runs; result.json gets model_data
(where model.tar.gz landed), the job name, the wall seconds of fit() and the exception if any.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


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

    from sagemaker.local import LocalSession
    from sagemaker.pytorch import PyTorch

    # Telemetry off: it would try to reach AWS; nothing of the job depends on it.
    session = LocalSession(sagemaker_config={"SchemaVersion": "1.0",
                                             "SageMaker": {"PythonSDK": {"Modules": {"TelemetryOptOut": True}}}})
    session.config = {"local": {"local_code": True, "container_root": args.container_root}}
    estimator = PyTorch(
        image_uri=args.image,
        entry_point=args.entry_point,
        source_dir=args.code,
        role="arn:aws:iam::111111111111:role/not-used-in-local-mode",
        instance_count=args.instance_count,
        instance_type="local",
        distribution=args.distribution or None,
        hyperparameters=args.hyperparameters,
        base_job_name="digits",
        sagemaker_session=session,
        disable_profiler=True,
        debugger_hook_config=False,
    )
    channels = dict(item.split("=", 1) for item in args.channel)
    result = {"ok": False, "error": None, "model_data": None, "job_name": None, "fit_seconds": None}
    start = time.monotonic()
    try:
        estimator.fit({name: f"file://{path}" for name, path in channels.items()}, wait=True, logs=True)
        result.update(ok=True, model_data=estimator.model_data, job_name=estimator.latest_training_job.name)
    except Exception as exc:  # noqa: BLE001 - reported to the runner, which prints it last
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        result["fit_seconds"] = round(time.monotonic() - start, 2)
        with open(args.result, "w") as f:
            json.dump(result, f, indent=2)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""Runs ONE SageMaker Python SDK v2 local-mode training job, as a user's notebook would.

    .venv-sdk-v2/bin/python tests/localmode/v2_driver.py SPEC.json RESULT.json

Executed with the SDK v2 virtual environment's python (never the project's .venv: the SDK
pins its own dependencies). SPEC.json is written by tests/localmode/harness.py; RESULT.json
gets what the SDK returned: success or the exception, the job name, `model_data` (where the
SDK put model.tar.gz) and the wall seconds of fit(). The SDK's own log (docker-compose output
of every host) goes to stdout/stderr, which the harness records.

Standard library + the SDK only: this file must not import the project.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import traceback


def build_estimator(spec: dict, session):
    common = dict(
        image_uri=spec["image_uri"],
        role="arn:aws:iam::111111111111:role/not-used-in-local-mode",
        instance_count=spec["instance_count"],
        instance_type=spec["instance_type"],
        entry_point=spec["entry_point"],
        source_dir=spec["source_dir"],
        hyperparameters=spec["hyperparameters"],
        environment=spec["environment"] or None,
        base_job_name=spec["base_job_name"],
        sagemaker_session=session,
        # Debugger and profiler rules are cloud features; local mode only warns about them.
        disable_profiler=True,
        debugger_hook_config=False,
    )
    if spec["output_path"]:
        common["output_path"] = spec["output_path"]
    if spec["estimator"] == "pytorch":
        from sagemaker.pytorch import PyTorch

        return PyTorch(distribution=spec["distribution"] or None, **common)
    if spec["estimator"] == "estimator":
        # The generic Estimator has no `distribution=`: the launcher keys go in as
        # hyperparameters, the way users of a plain BYOC image pass them.
        from sagemaker.estimator import Estimator

        return Estimator(**common)
    raise SystemExit(f"v2_driver: unknown estimator kind {spec['estimator']!r}")


def main(argv: list[str]) -> int:
    spec_path, result_path = argv
    with open(spec_path) as f:
        spec = json.load(f)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")

    from sagemaker.local import LocalSession

    session = LocalSession(
        # Telemetry would try to reach AWS from this machine; it has no bearing on the job.
        sagemaker_config={"SchemaVersion": "1.0", "SageMaker": {"PythonSDK": {"Modules": {"TelemetryOptOut": True}}}},
    )
    session.config = {"local": {"local_code": True, "container_root": spec["container_root"]}}

    result: dict = {"ok": False, "error": None, "error_type": None, "job_name": None, "model_data": None, "fit_seconds": None}
    estimator = None
    start = time.monotonic()
    try:
        estimator = build_estimator(spec, session)
        estimator.fit(spec["channels"] or None, wait=True, logs=True)
        result["ok"] = True
    except BaseException as exc:  # noqa: BLE001 - the test asserts on what the user would see
        result["error"] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        result["error_type"] = type(exc).__name__
        traceback.print_exc()
    finally:
        result["fit_seconds"] = round(time.monotonic() - start, 2)
        if estimator is not None:
            job = getattr(estimator, "latest_training_job", None)
            result["job_name"] = getattr(job, "name", None) if job is not None else None
            try:
                result["model_data"] = estimator.model_data
            except Exception as exc:  # noqa: BLE001 - no job ran: model_data has nothing to describe
                result["model_data_error"] = str(exc)
        with open(result_path, "w") as f:
            json.dump(result, f, indent=2)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The SageMaker training entrypoint: `python -m entrypoint train [--dry-run]`.

read /opt/ml (config) -> decide a launch plan (distribution, program, plan) -> run it (orchestrate.py, on the host loop).
"""

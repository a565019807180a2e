"""Neuron's compile cache, kept between jobs (pure).

torch-neuronx compiles each XLA graph with neuronx-cc and keeps the result in its persistent
cache, by default /var/tmp/neuron-compile-cache: inside the container, so every SageMaker job
compiles from scratch. When the job has a checkpoint folder (checkpointconfig.json, from the
estimator's checkpoint_s3_uri), SageMaker uploads that folder to S3 while the job runs and puts
it back at the start of the next job with the same checkpoint_s3_uri. The cache goes there:
NEURON_COMPILE_CACHE_URL=<checkpoint folder>/neuron-compile-cache.

Sources (AWS Neuron documentation, "Neuron Persistent Cache",
general/arch/neuron-features/neuron-caching.rst): the cache's location is
NEURON_COMPILE_CACHE_URL or `--cache_dir=` in NEURON_CC_FLAGS, and `--cache_dir` wins when both
are set; a compilation that failed or was interrupted (a stop, Ctrl-C) is cached as failed and
skipped afterwards unless NEURON_CC_FLAGS has `--retry_failed_compilation`. neuron_parallel_compile
(RUN_NEURON_PARALLEL_COMPILE=1) fills the same cache from the same two settings, so a
pre-compile job and the training job after it share it through the checkpoint's S3 prefix.

A job that names its own cache (either setting) keeps it. With our cache a job stopped in the
middle of a compilation (a Spot interruption, StopTrainingJob) would leave that graph marked
failed for every later job, so `--retry_failed_compilation` is added to NEURON_CC_FLAGS (after
whatever the job put there) unless it is there already.
"""

from __future__ import annotations

import os
import re
from typing import Mapping

from entrypoint.job.config import CheckpointConfig

CACHE_FOLDER = "neuron-compile-cache"
NEURON_DEFAULT_CACHE = "/var/tmp/neuron-compile-cache"
RETRY_FAILED = "--retry_failed_compilation"
_CACHE_DIR_FLAG = re.compile(r"(?:^|\s)--cache_dir[= ](\S+)")


def parse_cache_dir_flag(neuron_cc_flags: str) -> str | None:
    """The cache a job names with `--cache_dir=X` (or `--cache_dir X`) in NEURON_CC_FLAGS."""
    match = _CACHE_DIR_FLAG.search(neuron_cc_flags)
    return match.group(1) if match else None


def build_neuron_cache_env(environ: Mapping[str, str], neuron_cores: int, parallel_compile: bool,
                           checkpoint: CheckpointConfig | None) -> tuple[dict[str, str], list[str]]:
    """(variables for every process, notes for the plan). Nothing where Neuron is not in play."""
    if not neuron_cores and not parallel_compile:
        return {}, []
    then = (" neuron_parallel_compile (RUN_NEURON_PARALLEL_COMPILE=1) compiles this job's graphs into it; "
            "a job run after it without that setting trains with them.") if parallel_compile else ""
    flags = environ.get("NEURON_CC_FLAGS", "")
    own = parse_cache_dir_flag(flags)
    if own is not None:
        return {}, [f"Neuron compile cache: the job's own, --cache_dir={own} in NEURON_CC_FLAGS.{then}"]
    if "NEURON_COMPILE_CACHE_URL" in environ:
        return {}, [f"Neuron compile cache: the job's own, NEURON_COMPILE_CACHE_URL="
                    f"{environ['NEURON_COMPILE_CACHE_URL']}.{then}"]
    if checkpoint is None:
        return {}, [f"Neuron compile cache: Neuron's default {NEURON_DEFAULT_CACHE}, lost when the job ends; "
                    f"give the job a checkpoint folder (the estimator's checkpoint_s3_uri) to keep it between "
                    f"jobs.{then}"]
    cache = os.path.join(checkpoint.local_path, CACHE_FOLDER)
    env = {"NEURON_COMPILE_CACHE_URL": cache}
    retry = ""
    if RETRY_FAILED not in flags.split():
        env["NEURON_CC_FLAGS"] = f"{flags} {RETRY_FAILED}".strip()
        retry = f" ({RETRY_FAILED} added to NEURON_CC_FLAGS: a compilation a stop interrupted is tried again)"
    synced = (f"which SageMaker keeps in {checkpoint.s3_uri} for the next job with that checkpoint_s3_uri"
              if checkpoint.s3_uri else "which SageMaker keeps in the job's checkpoint_s3_uri for the next job")
    return env, [f"Neuron compile cache: {cache}, in the checkpoint folder, {synced}{retry}.{then}"]

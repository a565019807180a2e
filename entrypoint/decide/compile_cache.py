"""torch.compile's caches kept between jobs and restarts in place (pure).

Inductor keeps what it compiled under TORCHINDUCTOR_CACHE_DIR (default /tmp/torchinductor_<user>,
inside the container): the FX graph cache (fxgraph/), the AOTAutograd cache (aotautograd/), the
C++ and Triton kernels, and the autotune results (`<key>.best_config` beside the kernels); Triton's
own cache is TRITON_CACHE_DIR (Inductor's default: <inductor cache>/triton). The same rule as
Neuron's compile cache (neuron_env.py): kept where SageMaker keeps state, the checkpoint folder.

How (docs/compile-cache.md has the measurements behind it):
  - torch always works in a host-local folder (BYOC_COMPILE_CACHE_DIR, else
    /var/tmp/byoc-compile-cache), which a restart in place finds as it was left.
  - With a checkpoint folder, each host keeps ONE archive there,
    <checkpoint>/byoc-compile-cache/host-<index>.tar.gz: a cache is hundreds of small files that
    SageMaker would upload one request each, each time one changes. The archives are unpacked
    into the host-local folder before the ranks start and written at the end, on a stop, and
    every BYOC_COMPILE_CACHE_SAVE_EVERY_S (run/compile_cache.py). The index is the host's place
    in resourceconfig's host list: local mode's host names change from job to job, the order
    does not.
  - Inductor's precompiled header is turned off (TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS=0):
    torch builds it (150 MB, ~12 s of g++ here) under <tempdir>/torchinductor_<user>, outside
    the kept folder, in every new container, and it does so before it looks for the kernel it
    would serve, so a job whose every kernel is a cache hit still pays for it.
  - A variable the job sets itself (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR,
    TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS) is never overridden; with its own
    TORCHINDUCTOR_CACHE_DIR the job keeps its cache itself.
"""

from __future__ import annotations

import os
from typing import Mapping, NamedTuple

from entrypoint.job.config import CheckpointConfig

INDUCTOR_ENV = "TORCHINDUCTOR_CACHE_DIR"
TRITON_ENV = "TRITON_CACHE_DIR"
HEADER_ENV = "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS"
LOCAL_FOLDER = "/var/tmp/byoc-compile-cache"  # BYOC_COMPILE_CACHE_DIR replaces it
ARCHIVE_FOLDER = "byoc-compile-cache"  # in the checkpoint folder


class CompileCache(NamedTuple):
    """What run/compile_cache.py keeps: torch's folder on this host and, with a checkpoint
    folder, this host's archive there (and the folder the other hosts' archives are in)."""

    folder: str
    archive_folder: str | None
    archive: str | None
    max_bytes: int
    save_every_s: float  # 0: only at the end and on a stop


def decide_compile_cache(environ: Mapping[str, str], checkpoint: CheckpointConfig | None, host_index: int,
                         enabled: bool, max_mb: int, save_every_s: float,
                         local_folder: str | None = None) -> tuple[CompileCache | None, dict, list]:
    """(what to keep, variables for every process, notes for the plan)."""
    if not enabled:
        return None, {}, ["torch.compile cache: off (BYOC_COMPILE_CACHE=0): torch's default folder, lost when "
                          "the container ends"]
    if INDUCTOR_ENV in environ:
        return None, {}, [f"torch.compile cache: the job's own, {INDUCTOR_ENV}={environ[INDUCTOR_ENV]} (not "
                          f"archived by the launcher)"]
    folder = local_folder or LOCAL_FOLDER  # BYOC_COMPILE_CACHE_DIR, checked (settings.compile_cache_dir)
    env = {INDUCTOR_ENV: folder}
    triton = f"{TRITON_ENV}={environ[TRITON_ENV]} (the job's own)" if TRITON_ENV in environ else \
        f"{TRITON_ENV}={os.path.join(folder, 'triton')}"
    if TRITON_ENV not in environ:
        env[TRITON_ENV] = os.path.join(folder, "triton")
    if HEADER_ENV not in environ:
        env[HEADER_ENV] = "0"
    bound = f"at most {max_mb} MB, oldest entries evicted first (BYOC_COMPILE_CACHE_MAX_MB); " + \
        describe_header(environ)
    if checkpoint is None:
        cache = CompileCache(folder, None, None, max_mb << 20, 0.0)
        return cache, env, [f"torch.compile cache: {INDUCTOR_ENV}={folder}, {triton}; on this host only (restarts in "
                            f"place reuse it); give the job a checkpoint folder (checkpoint_s3_uri) to keep it "
                            f"between jobs; {bound}"]
    archive_folder = os.path.join(checkpoint.local_path, ARCHIVE_FOLDER)
    archive = os.path.join(archive_folder, f"host-{host_index}.tar.gz")
    cache = CompileCache(folder, archive_folder, archive, max_mb << 20, save_every_s)
    every = f", every {save_every_s:g} s (BYOC_COMPILE_CACHE_SAVE_EVERY_S)" if save_every_s else ""
    return cache, env, [f"torch.compile cache: {INDUCTOR_ENV}={folder}, {triton}; restored before the ranks start "
                        f"from {archive_folder}, kept as {archive} in the checkpoint folder (written at the end, on a "
                        f"stop{every}); {bound}"]


def describe_header(environ: Mapping[str, str]) -> str:
    if HEADER_ENV in environ:
        return f"{HEADER_ENV}={environ[HEADER_ENV]} (the job's own)"
    return (f"{HEADER_ENV}=0: no precompiled header, which torch would rebuild outside the kept folder in each "
            f"new container, hit or miss")


def decide_folder_env(plan_env: Mapping[str, str], wanted: str, folder: str | None) -> dict[str, str]:
    """The plan's environment once the cache folder `wanted` turned out unusable on this host
    (run/compile_cache.py): the variables the launcher pointed at it point at `folder` instead,
    or, with None, are left out (torch's own default). A job's own values are not touched."""
    env = dict(plan_env)
    ours = {INDUCTOR_ENV: wanted, TRITON_ENV: os.path.join(wanted, "triton")}
    for name, value in ours.items():
        if env.get(name) != value:
            continue
        if folder is None:
            del env[name]
        else:
            env[name] = folder if name == INDUCTOR_ENV else os.path.join(folder, "triton")
    return env

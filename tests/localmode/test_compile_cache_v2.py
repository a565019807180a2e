"""torch.compile in the image, under SDK v2 local mode: two jobs in a row, the second warm.

SDK v2 local mode refuses checkpoint_local_path / checkpoint_s3_uri ("Setting
checkpoint_local_path is not supported in local mode.", sagemaker/estimator.py), so no
local-mode job has a checkpoint folder. What a second job can find instead is a folder the
machine keeps: a file:// channel, mounted read-write at /opt/ml/input/data/<name>, named as
the launcher's host-local folder with BYOC_COMPILE_CACHE_DIR (docs/compile-cache.md). Warm is
judged by Inductor's own counters (fxgraph_cache_hit / _miss), never by wall time."""

from __future__ import annotations

import pytest

from localmode.harness import V2JobResult, run_v2_job
from localmode.test_sdk_v2 import assert_every_host_succeeded, report, script

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("byoc_image")]
CACHE_IN_CONTAINER = "/opt/ml/input/data/compilecache"


def compile_job(tmp_path, name: str, kept, environment: dict[str, str]) -> dict:
    result: V2JobResult = run_v2_job(tmp_path, source_files=script("compile_counters.py"), name=name,
                                     channels={"compilecache": kept}, environment=environment)
    report(f"torch.compile, {name}", result)
    assert_every_host_succeeded(result, 1)
    record = result.model_json("compile.json")
    assert record["loss_finite"], record
    return record


def test_second_job_finds_the_first_jobs_compiled_graphs_and_with_the_cache_off_a_third_is_cold(tmp_path):
    """Three jobs in a row on one kept folder: the first compiles, the second finds every graph
    the first compiled. The control, a third with BYOC_COMPILE_CACHE=0: torch's default folder,
    which dies with the container, so it compiles them all again, though the kept folder holds
    them, and leaves that folder as it was."""
    kept = tmp_path / "kept"
    kept.mkdir()
    env = {"BYOC_COMPILE_CACHE_DIR": CACHE_IN_CONTAINER}
    first = compile_job(tmp_path, "first", kept, env)
    second = compile_job(tmp_path, "second", kept, env)
    assert first["inductor_cache_dir"] == CACHE_IN_CONTAINER, first
    # The first compiles (Inductor's C++ backend, with the image's g++ and Python.h); the
    # second finds every graph the first compiled.
    assert first["hit"] == 0 and first["miss"] > 0, first
    assert second["hit"] == first["miss"] and second["miss"] == 0, (first, second)
    assert any((kept / "fxgraph").iterdir())
    before = sorted(str(p.relative_to(kept)) for p in kept.rglob("*"))
    off = compile_job(tmp_path, "off", kept, {**env, "BYOC_COMPILE_CACHE": "0"})
    assert off["inductor_cache_dir"] is None, off
    assert off["hit"] == 0 and off["miss"] == first["miss"], (first, off)
    assert sorted(str(p.relative_to(kept)) for p in kept.rglob("*")) == before

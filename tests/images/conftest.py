import os

import pytest

from tests.images.image_harness import BuildResult, ensure_cpu_image


@pytest.fixture(scope="session")
def cpu_image() -> BuildResult:
    """The CPU image of this tree, built with Docker once per session (Docker's layer cache
    makes an unchanged tree a rebuild of seconds)."""
    if os.geteuid() != 0:
        pytest.skip("the Docker engine here is started and used as root (scripts/docker-engine.sh)")
    result = ensure_cpu_image()
    print(f"\ncpu image {result.tag}: build step {result.seconds:.0f} s, {result.size_bytes / 1e9:.2f} GB")
    return result

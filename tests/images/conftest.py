import os

import pytest

from tests.images.image_harness import BuildResult, ImageStore, ensure_cpu_image, load_store


def _require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("building and running images here needs root (buildah, podman, ip netns)")


@pytest.fixture(scope="session")
def image_store() -> ImageStore:
    _require_root()
    return load_store()


@pytest.fixture(scope="session")
def cpu_image(image_store: ImageStore) -> BuildResult:
    """The CPU image of this tree, built once per session (or reused from the cache)."""
    result = ensure_cpu_image(image_store)
    print(f"\ncpu image {result.tag}: {'cached' if result.cached else f'built in {result.seconds:.0f} s'}, "
          f"{result.size_bytes / 1e9:.2f} GB")
    return result

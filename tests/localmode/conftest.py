"""Fixtures for the SDK v2 local-mode tests: the image of this tree, built once per session."""

from __future__ import annotations

import os
import shutil

import pytest

from localmode.harness import SDK_V2_PYTHON, build_image, probe_sdk_v2_python
from support.docker import decide_image_tag


@pytest.fixture(scope="session")
def byoc_image() -> str:
    """The CPU image of this tree (scripts/build-local-image.sh; tag from BYOC_IMAGE_TAG,
    default byoc-training:cpu-local). Docker's layer cache makes an unchanged tree seconds."""
    if probe_sdk_v2_python() is None:
        pytest.fail(f"{SDK_V2_PYTHON} is missing: scripts/bootstrap.sh installs the SDK v2 pin")
    if shutil.which("docker-compose") is None and os.geteuid() != 0:
        pytest.skip("no docker-compose and not root: scripts/docker-engine.sh cannot install the engine")
    return build_image(decide_image_tag(os.environ))

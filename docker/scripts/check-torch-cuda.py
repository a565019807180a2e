#!/usr/bin/env python3
"""The GPU image's torch against what its own metadata and the base image say, with no
hand-kept number: NCCL is the version torch's wheel requires (`nvidia-nccl-cu13==X` in its
Requires-Dist), and torch's CUDA is the base image's CUDA (major.minor).

Run by install-torch.sh in the GPU builder (CHECK_TORCH_CUDA=1); the pure parts are also
used by tests/images/test_resolution.py on metadata resolved from PyPI, so the test and the
build check the same rules. Runs on the images' Pythons (3.11+): standard library only.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Iterable

_PIN = re.compile(r"^\s*(?P<name>[A-Za-z0-9._-]+)(?:\[[^\]]*\])?\s*==\s*(?P<version>[^\s;,]+)\s*(?:;.*)?$")


def parse_pins(requires_dist: Iterable[str]) -> dict[str, str]:
    """{normalized name: version} of the `name==version` requirements (markers ignored:
    these are torch's Linux-only CUDA pins)."""
    pins = {}
    for line in requires_dist:
        match = _PIN.match(line)
        if match:
            pins[re.sub(r"[-_.]+", "-", match["name"]).lower()] = match["version"]
    return pins


def decide_nccl_pin(requires_dist: Iterable[str]) -> tuple[str, str]:
    """(distribution, version) of the NCCL torch's wheel requires, e.g.
    ("nvidia-nccl-cu13", "2.29.7"). Raises ValueError when there is none (a CPU wheel)."""
    found = [(name, version) for name, version in parse_pins(requires_dist).items()
             if re.fullmatch(r"nvidia-nccl-cu\d+", name)]
    if len(found) != 1:
        raise ValueError(f"torch's Requires-Dist pins {len(found)} NCCL distributions: {found}")
    return found[0]


def decide_cuda_pin(requires_dist: Iterable[str]) -> str:
    """The CUDA toolkit version torch's wheel requires (`cuda-toolkit[...]==13.0.3`)."""
    pins = parse_pins(requires_dist)
    if "cuda-toolkit" not in pins:
        raise ValueError("torch's Requires-Dist pins no cuda-toolkit")
    return pins["cuda-toolkit"]


def parse_base_image_cuda(base_image: str) -> str:
    """major.minor of an nvidia/cuda tag: "nvidia/cuda:13.0.2-runtime-ubuntu24.04" → "13.0"."""
    match = re.search(r"nvidia/cuda:(\d+)\.(\d+)(?:\.\d+)?-", base_image)
    if not match:
        raise ValueError(f"not an nvidia/cuda image tag: {base_image}")
    return f"{match[1]}.{match[2]}"


def decide_cuda_problem(torch_cuda: str | None, image_cuda: str) -> str | None:
    """Why torch's CUDA and the image's differ in major.minor, or None when they agree."""
    if not torch_cuda:
        return "torch is a CPU build (torch.version.cuda is None)"
    have = ".".join(torch_cuda.split(".")[:2])
    want = ".".join(image_cuda.split(".")[:2])
    if have != want:
        return f"torch is built for CUDA {torch_cuda}, the image has CUDA {image_cuda}"
    return None


def main() -> int:
    from importlib import metadata

    import torch

    requires = metadata.requires("torch") or []
    dist, wanted = decide_nccl_pin(requires)
    installed = metadata.version(dist)
    loaded = ".".join(str(part) for part in torch.cuda.nccl.version())
    problems = []
    if installed != wanted:
        problems.append(f"{dist} {installed} is installed, torch requires {wanted}")
    if loaded != wanted:
        problems.append(f"torch loads NCCL {loaded}, its metadata requires {wanted}")
    # nvidia/cuda images set CUDA_VERSION (e.g. 13.0.2).
    image_cuda = os.environ.get("CUDA_VERSION", "")
    problem = decide_cuda_problem(torch.version.cuda, image_cuda) if image_cuda else "CUDA_VERSION is not set"
    if problem:
        problems.append(problem)
    if problems:
        print("check-torch-cuda: " + "; ".join(problems), file=sys.stderr)
        return 1
    print(f"check-torch-cuda: torch {torch.__version__}, CUDA {torch.version.cuda} (image {image_cuda}), "
          f"NCCL {loaded} ({dist}, as torch requires)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

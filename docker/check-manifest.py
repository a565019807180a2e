#!/usr/bin/env python3
"""Checks what a registry stores for an image, the way SageMaker will read it: a single
Docker schema-2 manifest (no OCI manifest, no manifest list or OCI index, so no
attestation index either), with a Docker image config and Docker layers. Prints the
manifest's digest (sha256:...) on success; exits 1 naming what is wrong.

usage: check-manifest.py REGISTRY REPOSITORY REFERENCE   (REFERENCE: a tag or a digest)
The registry is spoken to over HTTP when it is on the loopback address (as docker does),
HTTPS otherwise; no credentials (for ECR, docker/ecr.sh asks ECR's API instead).
"""

from __future__ import annotations

import json
import sys
import urllib.request

DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYERS = ("application/vnd.docker.image.rootfs.diff.tar.gzip",)
# Ask for everything a registry might hold, so an index is seen as one and not converted.
ACCEPT = ", ".join([
    DOCKER_MANIFEST,
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
])


def decide_problems(media_type: str, manifest: dict) -> list[str]:
    """What SageMaker would refuse in this manifest (pure)."""
    if media_type != DOCKER_MANIFEST:
        return [f"the manifest is {media_type}, not a single-platform Docker schema-2 manifest ({DOCKER_MANIFEST})"]
    problems = []
    if manifest.get("schemaVersion") != 2:
        problems.append(f"schemaVersion is {manifest.get('schemaVersion')!r}, not 2")
    config_type = manifest.get("config", {}).get("mediaType")
    if config_type != DOCKER_CONFIG:
        problems.append(f"the config is {config_type}, not {DOCKER_CONFIG}")
    for layer in manifest.get("layers", []):
        if layer.get("mediaType") not in DOCKER_LAYERS:
            problems.append(f"a layer is {layer.get('mediaType')}, not a Docker layer")
            break
    return problems


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[-4], file=sys.stderr)
        return 2
    registry, repository, reference = argv
    scheme = "http" if registry.split(":")[0] in ("127.0.0.1", "localhost", "[::1]") else "https"
    request = urllib.request.Request(f"{scheme}://{registry}/v2/{repository}/manifests/{reference}",
                                     headers={"Accept": ACCEPT})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            media_type = response.headers.get("Content-Type", "").split(";")[0].strip()
            digest = response.headers.get("Docker-Content-Digest", "")
            manifest = json.loads(response.read())
    except OSError as exc:
        print(f"check-manifest: cannot read {registry}/{repository}:{reference}: {exc}", file=sys.stderr)
        return 1
    problems = decide_problems(media_type, manifest)
    if problems:
        print(f"check-manifest: {registry}/{repository}:{reference}: " + "; ".join(problems)
              + " (SageMaker needs a Docker v2 manifest)", file=sys.stderr)
        return 1
    print(digest)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

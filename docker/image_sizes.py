#!/usr/bin/env python3
"""An image's sizes, as a person deciding what to cut needs them:

  - uncompressed: what `docker images` shows (the layers unpacked on an instance's disk);
  - compressed: the total of the layers' blobs a registry stores and SageMaker pulls, read from
    the manifest after a push to a private registry on 127.0.0.1 (Debian's docker-registry; the
    engine compresses each layer as it would for ECR). --no-push leaves this out;
  - the layers, largest first, with the step that made each (`docker history`);
  - inside /opt/venv, the largest packages (`du` in the image): where torch's CUDA wheels go.

usage: image_sizes.py IMAGE [--no-push]
Prints a summary on stdout, ending with the line `image IMAGE: U GB uncompressed, C GB compressed`.
Standard library only; needs a Docker engine (DOCKER_HOST) and, for the push, docker-registry.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Iterator

MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"


def run(argv: list[str], **kwargs) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, **kwargs).stdout


def build_gb(size: int) -> str:
    return f"{size / 1e9:.2f} GB"


def parse_history(text: str) -> list[tuple[int, str]]:
    """`docker history --no-trunc --human=false --format '{{.Size}}\\t{{.CreatedBy}}'` → [(bytes,
    step)], largest first; empty layers (ENV, LABEL, …) left out."""
    layers = []
    for line in text.splitlines():
        size, _, step = line.partition("\t")
        if size.isdigit() and int(size) > 0:
            step = step.replace("/bin/bash -o pipefail -c ", "").replace("|", " ").strip()
            layers.append((int(size), " ".join(step.split())[:140]))
    return sorted(layers, reverse=True)


def sum_manifest_layers(manifest: dict) -> int:
    return sum(int(layer["size"]) for layer in manifest.get("layers", []))


def probe_venv_packages(image: str, top: int = 12) -> list[tuple[int, str]]:
    script = ("cd \"$(python3 -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')\" && "
              "du -sk nvidia/* * 2>/dev/null | sort -rn | head -n " + str(top))
    out = run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "bash", image, "-c", script], timeout=300)
    rows = []
    for line in out.splitlines():
        kib, _, name = line.partition("\t")
        if kib.isdigit():
            rows.append((int(kib) * 1024, name))
    return rows


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def run_private_registry(root: str) -> Iterator[str]:
    """A registry v2 server (Debian's docker-registry) on 127.0.0.1 storing under ROOT, for as
    long as the block runs: yields its address. Also the tests' registry (tests/images)."""
    if shutil.which("docker-registry") is None:
        raise RuntimeError("docker-registry is not installed (apt-get install docker-registry)")
    port = _free_port()
    config = os.path.join(root, "registry.yml")
    with open(config, "w", encoding="utf-8") as f:
        f.write(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {root}/storage\n  delete:\n"
                f"    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\nlog:\n  level: error\n")
    server = subprocess.Popen(["docker-registry", "serve", config], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"docker-registry did not start: {server.stderr.read().decode()[-2000:]}")
                time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=10)


def probe_pushed_size(image: str) -> int:
    """Push IMAGE to a private registry on 127.0.0.1, read its manifest, sum the layer blobs."""
    work = tempfile.mkdtemp(prefix="byoc-size-registry.")
    try:
        with run_private_registry(work) as address:
            remote = f"{address}/byoc-size/image:measure"
            try:
                run(["docker", "tag", image, remote])
                run(["docker", "push", remote], timeout=3600)
                request = urllib.request.Request(f"http://{address}/v2/byoc-size/image/manifests/measure",
                                                 headers={"Accept": MANIFEST_V2})
                with urllib.request.urlopen(request, timeout=60) as response:
                    return sum_manifest_layers(json.loads(response.read()))
            finally:
                subprocess.run(["docker", "rmi", remote], capture_output=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-") or any(a not in ("--no-push",) for a in argv[1:]):
        print(__doc__.split("\n\n")[-2], file=sys.stderr)
        return 2
    image, push = argv[0], "--no-push" not in argv
    uncompressed = int(run(["docker", "image", "inspect", "--format", "{{.Size}}", image]).strip())
    history = parse_history(run(["docker", "history", "--no-trunc", "--human=false", "--format",
                                 "{{.Size}}\t{{.CreatedBy}}", image]))
    print(f"layers of {image}, largest first:")
    for size, step in history[:10]:
        print(f"  {build_gb(size):>9}  {step}")
    print("the venv's largest packages (site-packages/nvidia/* one by one):")
    for size, name in probe_venv_packages(image):
        print(f"  {build_gb(size):>9}  {name}")
    compressed = probe_pushed_size(image) if push else None
    print(f"image {image}: {build_gb(uncompressed)} uncompressed"
          + (f", {build_gb(compressed)} compressed (the layers a registry stores)" if compressed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

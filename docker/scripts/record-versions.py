#!/usr/bin/env python3
"""Record the versions this image was built with, as installed (not as pinned), in one file:
/etc/byoc/build-versions.env, KEY=VALUE a line. The launcher reads it at start
(entrypoint/job/probe.py) and names the versions in the plan's NCCL-network line and the
pre-flight's EFA findings; a person reads it with `cat`.

usage: record-versions.py gpu|trn1 [OUT]   (run last in the `sagemaker` stage, with the venv's
python). Required keys missing fail the build. Standard library only; the parsers are pure and
tested on stand-in tool output (tests/images/test_gpu_pieces.py).
"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import subprocess
import sys

OUT = "/etc/byoc/build-versions.env"
KEYS = ("EFA_INSTALLER", "LIBFABRIC", "AWS_OFI_NCCL", "NCCL", "CUDA", "TORCH",
        "NEURON_RUNTIME", "NEURON_COLLECTIVES", "TORCH_NEURONX", "NEURONX_CC")
REQUIRED = {"gpu": ("EFA_INSTALLER", "LIBFABRIC", "NCCL", "CUDA", "TORCH"),
            "trn1": ("EFA_INSTALLER", "LIBFABRIC", "TORCH", "NEURON_RUNTIME", "TORCH_NEURONX", "NEURONX_CC")}
_VERSION = r"(\d+(?:\.\d+)+[0-9A-Za-z.+~-]*)"


def parse_efa_installer(text: str) -> str | None:
    """/opt/amazon/efa_installed_packages starts `# EFA installer version: 1.49.0`."""
    match = re.search(r"EFA installer version:\s*" + _VERSION, text)
    return match.group(1) if match else None


def parse_fi_info(text: str) -> str | None:
    """`fi_info --version`: `fi_info: 2.4.0amzn5.0` then `libfabric: 2.4.0amzn5.0`."""
    match = re.search(r"^libfabric:\s*(\S+)", text, re.MULTILINE)
    return match.group(1) if match else None


def parse_ofi_nccl(text: str) -> str | None:
    """aws-ofi-nccl's version from the installer's package list (`aws-ofi-nccl_1.20.0-1_amd64`,
    `libnccl-ofi-1.20.0`) or the plugin library's own banner (`aws-ofi-nccl 1.20.0`)."""
    match = re.search(r"(?:aws-ofi-nccl|libnccl-ofi)[ _=-]v?" + _VERSION, text)
    return match.group(1).split("-")[0] if match else None


def build_versions_text(found: dict[str, str | None]) -> str:
    return "".join(f"{key}={found[key]}\n" for key in KEYS if found.get(key))


def decide_missing(found: dict[str, str | None], flavor: str) -> list[str]:
    """The required keys not read. A GPU image built without EFA (EFA_INSTALLER=none) has no
    libfabric to read; the trn1 image always has EFA."""
    required = REQUIRED[flavor]
    if flavor == "gpu" and found.get("EFA_INSTALLER") == "none":
        required = tuple(key for key in required if key != "LIBFABRIC")
    return [key for key in required if not found.get(key)]


def decide_efa_installer(packages_text: str, declared: str | None) -> str | None:
    """The EFA installer's version as installed; "none" for an image built without EFA (the
    build argument EFA_INSTALLER_VERSION=none, which the Dockerfile hands this step)."""
    if declared == "none":
        return "none"
    return parse_efa_installer(packages_text)


def _read(path: str, binary: bool = False) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return ""
    return data.decode("latin-1") if binary else data.decode("utf-8", "replace")


def _run(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False).stdout
    except OSError:
        return ""


def _dist(*names: str) -> str | None:
    for name in names:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            continue
    return None


def probe_versions() -> dict[str, str | None]:
    nccl = next((d.version for d in md.distributions() if re.fullmatch(r"nvidia-nccl-cu\d+", d.metadata["Name"] or "")), None)
    packages = _read("/opt/amazon/efa_installed_packages")
    plugin = "/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so"
    dpkg = _run(["dpkg-query", "-W", "-f", "${Package}=${Version}\n", "aws-ofi-nccl", "libnccl-ofi",
                 "aws-neuronx-runtime-lib", "aws-neuronx-collectives"])
    neuron = dict(line.split("=", 1) for line in dpkg.splitlines() if "=" in line)
    return {
        "EFA_INSTALLER": decide_efa_installer(packages, os.environ.get("EFA_INSTALLER_VERSION")),
        "LIBFABRIC": parse_fi_info(_run(["/opt/amazon/efa/bin/fi_info", "--version"])),
        "AWS_OFI_NCCL": parse_ofi_nccl(packages) or parse_ofi_nccl(dpkg) or parse_ofi_nccl(_read(plugin, binary=True)),
        "NCCL": nccl,
        "CUDA": os.environ.get("CUDA_VERSION"),
        "TORCH": _dist("torch"),
        "NEURON_RUNTIME": neuron.get("aws-neuronx-runtime-lib", "").split("-")[0] or None,
        "NEURON_COLLECTIVES": neuron.get("aws-neuronx-collectives", "").split("-")[0] or None,
        "TORCH_NEURONX": _dist("torch-neuronx", "torch_neuronx"),
        "NEURONX_CC": _dist("neuronx-cc", "neuronx_cc"),
    }


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2) or argv[0] not in REQUIRED:
        print(f"usage: record-versions.py {'|'.join(REQUIRED)} [OUT]", file=sys.stderr)
        return 2
    out = argv[1] if len(argv) == 2 else OUT
    found = probe_versions()
    missing = decide_missing(found, argv[0])
    if missing:
        print(f"record-versions: could not read {', '.join(missing)} in this image", file=sys.stderr)
        return 1
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        f.write(build_versions_text(found))
    print(f"record-versions: {out}\n{build_versions_text(found)}", end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

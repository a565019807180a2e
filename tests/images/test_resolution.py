"""Each flavour's Python layer, resolved against the indexes it names, metadata only
(`pip install --dry-run --report`: no wheel is downloaded), and checked against
docker/versions.env and the rules the builds assert (docker/scripts/check-torch-cuda.py).

This is where "a pin the registry already knows" is caught before a build: e.g. torch
2.13.0's CUDA wheel requires nvidia-nccl-cu13==2.29.7, so an image that expects any other
NCCL cannot build. Where an index is not reachable from this machine the test says so in
its skip reason; the build asserts the same thing (`pip check` with nothing filtered,
check-torch-cuda.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.images.dockerfiles import SCRIPTS_DIR, load_versions

pytestmark = [pytest.mark.needs_package_index, pytest.mark.slow]

PYPI = "https://pypi.org/simple"
# Ubuntu 24.04 (the GPU and trn1 bases): Python 3.12, glibc 2.39.
UBUNTU_2404 = ("3.12", (2, 39))


def _load_check_torch_cuda():
    spec = importlib.util.spec_from_file_location("check_torch_cuda", SCRIPTS_DIR / "check-torch-cuda.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check = _load_check_torch_cuda()


# --- planning (pure) ------------------------------------------------------------------------


def build_platform_tags(glibc: tuple[int, int], arch: str = "x86_64") -> list[str]:
    """Every wheel platform tag a glibc of that version runs: pip's --platform takes each
    tag literally, it does not expand manylinux_2_39 into the older ones."""
    major, minor = glibc
    tags = [f"manylinux_{major}_{m}_{arch}" for m in range(minor, 4, -1)]
    return tags + [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}", f"linux_{arch}"]


def build_report_argv(requirements: list[str], report: Path, *, indexes: list[str],
                      target_python: tuple[str, tuple[int, int]] | None = None) -> list[str]:
    """pip's dry run for `requirements`; target_python=(version, glibc) resolves for another
    interpreter (binary wheels only, as pip requires for that)."""
    argv = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
            "--disable-pip-version-check", "--report", str(report), "--index-url", indexes[0]]
    for index in indexes[1:]:
        argv += ["--extra-index-url", index]
    if target_python:
        version, glibc = target_python
        # --target: pip 23 accepts platform options only with it; a dry run writes nothing there.
        argv += ["--only-binary=:all:", "--python-version", version, "--target", str(report.parent / "unused")]
        for tag in build_platform_tags(glibc):
            argv += ["--platform", tag]
    return argv + requirements


def build_clean_pip_env(environ: dict[str, str]) -> dict[str, str]:
    """This machine's pip settings minus whatever points pip at local wheels (find-links,
    extra file:// indexes, constraints): the answer must be the registries'. The CA bundle
    and timeout stay (HTTPS here goes through a proxy with its own CA)."""
    env = {k: v for k, v in environ.items() if not k.startswith("PIP_") or k in ("PIP_CERT", "PIP_DEFAULT_TIMEOUT")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


def parse_resolved(report: dict) -> dict[str, dict]:
    """{normalized name: metadata} of what pip would install."""
    return {re.sub(r"[-_.]+", "-", item["metadata"]["name"]).lower(): item["metadata"] for item in report["install"]}


def build_layer(pins: dict[str, str], flavor: str, *, with_torch: bool = True, sdists: bool = True) -> list[str]:
    """The flavour's Python layer as its install scripts ask for it (install-torch.sh,
    install-mpi4py.sh, install-sagemaker-training.sh), from versions.env."""
    F = flavor.upper()
    layer = [f"numpy=={pins[f'{F}_PYPI_NUMPY_VERSION']}",
             f"mpi4py=={pins['COMMON_PYPI_MPI4PY_VERSION']}",
             f"scikit-learn=={pins['COMMON_PYPI_SCIKIT_LEARN_VERSION']}",
             f"paramiko=={pins['COMMON_PYPI_PARAMIKO_VERSION']}"]
    if with_torch:
        layer.insert(0, f"torch=={pins[f'{F}_TORCH_VERSION']}")
    if sdists:  # sagemaker-training is published as an sdist only
        layer.append(f"sagemaker-training=={pins['COMMON_PYPI_SAGEMAKER_TRAINING_VERSION']}")
    return layer


# --- reading --------------------------------------------------------------------------------


def probe_index(url: str) -> str | None:
    """None when `url` answers, else why not (for the skip reason)."""
    try:
        context = None
        if os.environ.get("PIP_CERT"):
            import ssl
            context = ssl.create_default_context(cafile=os.environ["PIP_CERT"])
        with urllib.request.urlopen(url.rstrip("/") + "/", timeout=15, context=context):
            return None
    except (urllib.error.URLError, OSError) as exc:
        return f"{url} is not reachable from this machine ({exc})"


def load_report(requirements: list[str], tmp_path: Path, **kwargs) -> dict[str, dict]:
    report = tmp_path / "report.json"
    done = subprocess.run(build_report_argv(requirements, report, **kwargs), capture_output=True, text=True,
                          env=build_clean_pip_env(dict(os.environ)), timeout=600)
    assert done.returncode == 0, f"{requirements} does not resolve:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return parse_resolved(json.loads(report.read_text()))


# --- the pure parts -------------------------------------------------------------------------


def test_platform_tags_cover_every_older_manylinux():
    tags = build_platform_tags((2, 39))
    assert tags[0] == "manylinux_2_39_x86_64" and "manylinux_2_18_x86_64" in tags and "manylinux_2_5_x86_64" in tags
    assert tags[-4:] == ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]


def test_clean_pip_env_drops_local_wheel_sources():
    env = build_clean_pip_env({"PIP_FIND_LINKS": "/opt/wheels", "PIP_CONSTRAINT": "/c.txt", "PIP_CERT": "/ca.pem",
                               "PIP_EXTRA_INDEX_URL": "file:///opt/pypi/simple", "PATH": "/bin"})
    assert env == {"PIP_CERT": "/ca.pem", "PATH": "/bin", "PIP_CONFIG_FILE": os.devnull}


def test_torch_cuda_rules_on_written_metadata():
    requires = ['cuda-toolkit[cublas,cudart]==13.0.3; platform_system == "Linux"',
                'nvidia-nccl-cu13==2.29.7; platform_system == "Linux"', "filelock", "sympy>=1.13.3"]
    assert check.decide_nccl_pin(requires) == ("nvidia-nccl-cu13", "2.29.7")
    assert check.decide_cuda_pin(requires) == "13.0.3"
    assert check.parse_base_image_cuda("nvidia/cuda:13.0.2-runtime-ubuntu24.04") == "13.0"
    assert check.decide_cuda_problem("13.0", "13.0.2") is None
    assert "12.8" in check.decide_cuda_problem("12.8", "13.0.2")
    assert "CPU build" in check.decide_cuda_problem(None, "13.0.2")
    with pytest.raises(ValueError):
        check.decide_nccl_pin(["filelock"])  # a CPU wheel has no NCCL


# --- against the registries -----------------------------------------------------------------


def test_gpu_layer_resolves_for_ubuntu_2404_and_agrees_with_its_base_image(tmp_path):
    """torch from PyPI (GPU_TORCH_INDEX_URL is empty) for the GPU image's Python 3.12: its
    CUDA is the base image's, its NCCL is the one the build will find, every pin resolves."""
    pins = load_versions()
    assert pins["GPU_TORCH_INDEX_URL"] == "", "this test resolves GPU torch from PyPI; the index changed"
    if (why := probe_index(PYPI)):
        pytest.skip(why + "; the GPU build asserts the same (check-torch-cuda.py)")
    resolved = load_report(build_layer(pins, "gpu", sdists=False), tmp_path, indexes=[PYPI], target_python=UBUNTU_2404)
    for req in build_layer(pins, "gpu", sdists=False):
        name, _, version = req.partition("==")
        assert resolved[name]["version"] == version, req
    requires = resolved["torch"].get("requires_dist", [])
    nccl_dist, nccl = check.decide_nccl_pin(requires)
    assert resolved[nccl_dist]["version"] == nccl
    assert check.decide_cuda_problem(check.decide_cuda_pin(requires),
                                     check.parse_base_image_cuda(pins["GPU_BASE_IMAGE"])) is None
    assert check.parse_base_image_cuda(pins["GPU_BUILDER_IMAGE"]) == check.parse_base_image_cuda(pins["GPU_BASE_IMAGE"])
    # No hand-kept NCCL number left to disagree with torch's.
    assert not any("NCCL" in key for key in pins), [k for k in pins if "NCCL" in k]


def test_common_layer_and_sagemaker_training_resolve_for_the_cpu_images_python(tmp_path):
    """Everything but torch, sdists included, on this interpreter (the CPU image's Python
    minor version): sagemaker-training's own requirements accept the pinned numpy and the rest."""
    pins = load_versions()
    if (why := probe_index(PYPI)):
        pytest.skip(why + "; the CPU build's `pip check` asserts the same")
    layer = build_layer(pins, "cpu", with_torch=False)
    resolved = load_report(layer, tmp_path, indexes=[PYPI])
    for req in layer:
        name, _, version = req.partition("==")
        assert resolved[name]["version"] == version, req


def test_cpu_torch_resolves_from_its_index(tmp_path):
    pins = load_versions()
    index = pins["CPU_TORCH_INDEX_URL"]
    if (why := probe_index(index)):
        pytest.skip(why + "; scripts/build-local-image.sh builds with a local wheel instead, and the build "
                    "checks the torch version it installed (install-torch.sh)")
    resolved = load_report([f"torch=={pins['CPU_TORCH_VERSION']}"], tmp_path, indexes=[index, PYPI])
    assert resolved["torch"]["version"].split("+")[0] == pins["CPU_TORCH_VERSION"]
    with pytest.raises(ValueError):  # the CPU wheel brings no NCCL
        check.decide_nccl_pin(resolved["torch"].get("requires_dist", []))


def test_trn1_layer_resolves_from_neurons_index(tmp_path):
    pins = load_versions()
    index = pins["TRN1_NEURON_PIP_INDEX_URL"]
    if (why := probe_index(index)):
        pytest.skip(why + "; the trn1 build asserts the same: install-neuron-pip.sh checks torch and "
                    "torch-neuronx, install-our-packages.sh runs `pip check` with nothing filtered")
    layer = [f"torch=={pins['TRN1_TORCH_VERSION']}", f"torch-neuronx=={pins['TRN1_TORCH_NEURONX_VERSION']}",
             f"neuronx-cc=={pins['TRN1_NEURONX_CC_VERSION']}",
             f"neuronx-distributed=={pins['TRN1_NEURONX_DISTRIBUTED_VERSION']}"]
    resolved = load_report(layer, tmp_path, indexes=[PYPI, index, pins["TRN1_TORCH_INDEX_URL"]],
                           target_python=UBUNTU_2404)
    for req in layer:
        name, _, version = req.partition("==")
        assert resolved[name]["version"].split("+")[0] == version, req

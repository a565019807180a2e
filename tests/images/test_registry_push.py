"""docker/build-and-push.sh against a real registry (Debian's docker-registry on 127.0.0.1):
push the smoke-tested CPU image, pull it back by digest, run `train --dry-run` from the
pulled image, and check the stored manifest is what SageMaker accepts: one Docker schema-2
manifest, no manifest list or OCI index (so no attestation index)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.images.image_harness import REPO_ROOT, build_run_argv, run_docker

pytestmark = pytest.mark.slow

sys.path.insert(0, str(REPO_ROOT / "docker"))
check_manifest = __import__("check-manifest")  # docker/check-manifest.py: a script, not a package
import image_sizes  # noqa: E402  docker/image_sizes.py: its private registry


@pytest.fixture
def registry(tmp_path):
    """A registry v2 server on 127.0.0.1, its storage under tmp_path, stopped afterwards."""
    with image_sizes.run_private_registry(str(tmp_path)) as address:
        yield address


def _dry_run_tree(root: Path) -> Path:
    (root / "input/config").mkdir(parents=True)
    (root / "code").mkdir()
    (root / "code/train.py").write_text("print('hi')\n")
    (root / "input/config/resourceconfig.json").write_text(json.dumps({"current_host": "algo-1", "hosts": ["algo-1"]}))
    (root / "input/config/hyperparameters.json").write_text(json.dumps({"sagemaker_program": '"train.py"', "lr": "0.1"}))
    (root / "input/config/inputdataconfig.json").write_text("{}")
    return root


def test_push_pull_by_digest_and_run_the_pulled_image(cpu_image, registry, tmp_path):
    pushed = subprocess.run(
        ["bash", str(REPO_ROOT / "docker/build-and-push.sh"), "--flavor", "cpu", "--registry", registry,
         "--repository", "byoc-test/training", "--image", cpu_image.tag, "--tag-suffix", "smoke"],
        capture_output=True, text=True, timeout=900,
    )
    assert pushed.returncode == 0, pushed.stdout[-3000:] + pushed.stderr[-3000:]
    reference = pushed.stdout.split()[-1]
    name, _, digest = reference.partition("@")
    assert name == f"{registry}/byoc-test/training:cpu-smoke"
    assert digest.startswith("sha256:") and len(digest) == len("sha256:") + 64

    # What the registry holds, read as SageMaker would (an index would be reported as such).
    request = urllib.request.Request(f"http://{registry}/v2/byoc-test/training/manifests/{digest}",
                                     headers={"Accept": check_manifest.ACCEPT})
    with urllib.request.urlopen(request) as response:
        media_type = response.headers["Content-Type"]
        manifest = json.loads(response.read())
    assert media_type == "application/vnd.docker.distribution.manifest.v2+json"
    assert check_manifest.decide_problems(media_type, manifest) == []
    assert manifest["config"]["mediaType"] == "application/vnd.docker.container.image.v1+json"

    # Pulled back by digest (the local tag removed first, so the pull is real), then run.
    by_digest = f"{registry}/byoc-test/training@{digest}"
    subprocess.run(["docker", "rmi", name], capture_output=True, check=True)
    pulled = subprocess.run(["docker", "pull", by_digest], capture_output=True, text=True, timeout=600)
    assert pulled.returncode == 0, pulled.stderr
    root = _dry_run_tree(tmp_path / "ml")
    ran = run_docker(build_run_argv(by_digest, mounts=[(root, "/opt/ml")], hostname="algo-1",
                                    command=["train", "--dry-run"]))
    assert ran.returncode == 0, ran.stderr
    plan = json.loads(ran.stdout)
    assert plan["role"] == "single"
    assert plan["processes"][0]["argv"][-2:] == ["--lr", "0.1"]
    subprocess.run(["docker", "rmi", by_digest], capture_output=True)


@pytest.mark.parametrize("media_type,manifest,problem", [
    ("application/vnd.oci.image.index.v1+json", {"manifests": []}, "not a single-platform Docker schema-2 manifest"),
    ("application/vnd.docker.distribution.manifest.list.v2+json", {"manifests": []}, "not a single-platform"),
    ("application/vnd.oci.image.manifest.v1+json", {"schemaVersion": 2}, "not a single-platform"),
    ("application/vnd.docker.distribution.manifest.v2+json",
     {"schemaVersion": 2, "config": {"mediaType": "application/vnd.oci.image.config.v1+json"}, "layers": []},
     "the config is application/vnd.oci.image.config.v1+json"),
])
def test_manifest_check_refuses_what_sagemaker_refuses(media_type, manifest, problem):
    problems = check_manifest.decide_problems(media_type, manifest)
    assert problems and problem in problems[0]

"""docker/build-and-push.sh and buildspec.yml's commands, run for real against stand-in
`aws` and `docker` executables that record their argv (no AWS account, no Docker here).
Golden tests on what would be called, in order."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import yaml

from tests.images.dockerfiles import REPO_ROOT

FAKE = r"""#!/usr/bin/env bash
# Records its argv (one JSON list a line) and answers like the real CLI would.
# One write(2) on an O_APPEND file: the two ends of `aws … | docker login` run at once, and
# print() may split a record and its newline into two writes that interleave.
python3 -c 'import json, os, sys; os.write(1, (json.dumps(sys.argv[1:]) + "\n").encode())' "$(basename "$0")" "$@" >>"$CALLS"
case "$(basename "$0") $1 $2" in
    "aws sts get-caller-identity") echo 123456789012 ;;
    "aws ecr get-login-password") echo token ;;
    "aws ecr describe-repositories") exit "${REPO_EXISTS_RC:-0}" ;;
    "aws ecr describe-images") echo "${MEDIA_TYPE:-application/vnd.docker.distribution.manifest.v2+json}" ;;
    "docker login --username") cat >/dev/null ;;  # reads the password from stdin, as docker does
    "docker buildx build")  # an export (build.sh --wheelhouse) writes the stage's files
        for arg in "$@"; do
            case "$arg" in type=local,dest=*)
                entry="${arg#type=local,dest=}/wheels/horovod-0.28.1-0123456789abcdef"
                mkdir -p "$entry" && echo facts >"$entry/build-facts.txt" ;;
            esac
        done ;;
esac
"""


def _fake_bin(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("aws", "docker"):
        path = bin_dir / name
        path.write_text(FAKE)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "PATH": f"{_fake_bin(tmp_path)}:{os.environ['PATH']}",
            "CALLS": str(tmp_path / "calls.jsonl"), **extra}


def _calls(tmp_path: Path) -> list[list[str]]:
    return [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]


def _head() -> str:
    return subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()


def test_build_and_push_logs_in_creates_builds_pushes_and_checks(tmp_path):
    env = _env(tmp_path, REPO_EXISTS_RC="254")  # the repository does not exist yet
    result = subprocess.run(
        ["bash", str(REPO_ROOT / "docker/build-and-push.sh"), "--flavor", "both", "--region", "eu-west-1",
         "--tag-suffix", "abc"],
        capture_output=True, text=True, env=env,
    )
    assert result.returncode == 0, result.stderr
    registry = "123456789012.dkr.ecr.eu-west-1.amazonaws.com"
    uris = [f"{registry}/sagemaker-byoc-training:gpu-abc", f"{registry}/sagemaker-byoc-training:trn1-abc"]
    assert result.stdout.split()[-2:] == uris
    calls = _calls(tmp_path)
    summary = [c[:3] for c in calls]
    # The two ends of `aws ecr get-login-password | docker login` start in either order.
    login_pair = sorted(calls[1:3])
    assert login_pair == [
        ["aws", "ecr", "get-login-password", "--region", "eu-west-1"],
        ["docker", "login", "--username", "AWS", "--password-stdin", registry],
    ]
    assert summary[:1] + summary[3:] == [
        ["aws", "sts", "get-caller-identity"],
        ["aws", "ecr", "describe-repositories"],
        ["aws", "ecr", "create-repository"],
        ["docker", "buildx", "version"],  # build.sh: BuildKit when the CLI has buildx
        ["docker", "buildx", "build"],
        ["docker", "push", uris[0]],
        ["aws", "ecr", "describe-images"],
        ["docker", "image", "inspect"],  # the pushed digest
        ["docker", "buildx", "version"],
        ["docker", "buildx", "build"],
        ["docker", "push", uris[1]],
        ["aws", "ecr", "describe-images"],
        ["docker", "image", "inspect"],
    ]
    gpu_build = next(c for c in calls if c[:3] == ["docker", "buildx", "build"])
    assert gpu_build[gpu_build.index("--tag") + 1] == uris[0]
    assert "--provenance=false" in gpu_build and f"IMAGE_REVISION={_head()}" in gpu_build


def test_build_and_push_refuses_an_oci_manifest(tmp_path):
    env = _env(tmp_path, MEDIA_TYPE="application/vnd.oci.image.manifest.v1+json")
    result = subprocess.run(
        ["bash", str(REPO_ROOT / "docker/build-and-push.sh"), "--region", "eu-west-1", "--tag-suffix", "x"],
        capture_output=True, text=True, env=env,
    )
    assert result.returncode != 0 and "SageMaker needs a Docker v2 manifest" in result.stderr


def _buildspec_phase(name: str) -> str:
    return "\n".join(yaml.safe_load((REPO_ROOT / "buildspec.yml").read_text())["phases"][name]["commands"])


def _run_buildspec(tmp_path: Path, succeeding: str) -> subprocess.CompletedProcess:
    # One bash for all phases, as CodeBuild runs them; the variables CodeBuild provides.
    script = "\n".join(_buildspec_phase(p) for p in ("pre_build", "build", "post_build"))
    env = _env(tmp_path, FLAVOR="both", ECR_REPOSITORY="repo", AWS_DEFAULT_REGION="us-east-1",
               CODEBUILD_RESOLVED_SOURCE_VERSION="0123456789abcdef0123", CODEBUILD_BUILD_SUCCEEDING=succeeding)
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path / "src")


def _source_copy(tmp_path: Path) -> Path:
    """What CodeBuild checks out (only what the buildspec touches), writable for the artifact."""
    work = tmp_path / "work"
    (work / "src").mkdir(parents=True)
    for item in ("docker", "buildspec.yml", "pyproject.toml"):
        subprocess.run(["cp", "-r", str(REPO_ROOT / item), str(work / "src" / item)], check=True)
    return work


def test_buildspec_pushes_each_flavour_and_writes_image_detail(tmp_path):
    work = _source_copy(tmp_path)
    src = work / "src"
    result = _run_buildspec(work, "1")
    assert result.returncode == 0, result.stderr
    registry = "123456789012.dkr.ecr.us-east-1.amazonaws.com"
    uri = {f: f"{registry}/repo:{f}-0123456789ab" for f in ("gpu", "trn1")}
    assert json.loads((src / "imageDetail.json").read_text()) == {"ImageURI": uri["gpu"], "ImageURIs": uri}
    pushes = [c[2] for c in _calls(work) if c[:2] == ["docker", "push"]]
    assert pushes == [uri["gpu"], f"{registry}/repo:gpu-buildcache", uri["trn1"], f"{registry}/repo:trn1-buildcache"]
    builds = [c for c in _calls(work) if c[:3] == ["docker", "buildx", "build"]]
    assert [b[b.index("--cache-from") + 1] for b in builds] == [
        f"{registry}/repo:gpu-buildcache", f"{registry}/repo:gpu-buildcache", f"{registry}/repo:trn1-buildcache"]
    # After the GPU build, its Horovod wheel is exported into the folder CodeBuild caches.
    export = builds[1]
    assert export[export.index("--target") + 1] == "wheelhouse" and "--tag" not in export and "--load" not in export
    assert (src / "docker/wheelhouse/gpu/horovod-0.28.1-0123456789abcdef/build-facts.txt").is_file()
    cache_paths = yaml.safe_load((REPO_ROOT / "buildspec.yml").read_text())["cache"]["paths"]
    assert cache_paths == ["docker/wheelhouse/**/*"]


def test_buildspec_pushes_nothing_after_a_failed_build(tmp_path):
    work = _source_copy(tmp_path)
    result = _run_buildspec(work, "0")
    assert result.returncode == 0, result.stderr
    assert "nothing is pushed" in result.stdout
    assert not [c for c in _calls(work) if c[:2] == ["docker", "push"]]
    assert not (work / "src" / "imageDetail.json").exists()

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
    # The legacy builder (build.sh --builder legacy --wheelhouse): the stage is built with
    # --quiet (its image ID on stdout), a container made of it, /wheels copied out of that.
    "docker build "*)
        echo "${DOCKER_BUILDKIT-unset}" >>"$CALLS.buildkit"
        for arg in "$@"; do if [ "$arg" = --quiet ]; then echo sha256:5ta6e1d; fi; done ;;
    "docker create "*) echo c0nta1ner ;;
    "docker cp "*)
        [ "$2" = c0nta1ner:/wheels ] || { echo "no such container path: $2" >&2; exit 1; }
        entry="$3/wheels/horovod-0.28.1-0123456789abcdef"
        mkdir -p "$entry" && echo facts >"$entry/build-facts.txt" && echo wheel >"$entry/horovod-0.28.1-cp311-cp311-linux_x86_64.whl" ;;
    "docker rm "*) echo "$2" ;;
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


def _build_legacy_with_wheelhouse(env: dict[str, str], wheelhouse: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(REPO_ROOT / "docker/build.sh"), "--flavor", "cpu", "--tag", "byoc:test", "--builder", "legacy",
         "--cache-from", "byoc:previous", "--revision", "r1", "--version", "9.9", "--source", "src",
         "--wheelhouse", str(wheelhouse), "--", "--no-cache", "--network", "host"],
        capture_output=True, text=True, env=env,
    )  # fmt: skip


def test_legacy_builder_exports_the_wheelhouse_stage_through_a_container(tmp_path):
    """build.sh --builder legacy --wheelhouse: the image, then its `wheelhouse` stage (the same
    arguments less the tag, context and --no-cache: every step a cache hit), a container of
    that stage, /wheels copied out of it, the container removed; the wheel ends in DIR."""
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    (wheelhouse / ".gitkeep").write_text("")
    (wheelhouse / "horovod-0.28.1-an0lderbu1ld").mkdir()  # an earlier build's wheel: replaced
    result = _build_legacy_with_wheelhouse(_env(tmp_path), wheelhouse)
    assert result.returncode == 0, result.stderr

    dockerfile, context = str(REPO_ROOT / "docker/Dockerfile.cpu"), str(REPO_ROOT)
    calls = _calls(tmp_path)
    image_build, stage_build, create, copy, remove = calls
    assert image_build[:6] == ["docker", "build", "--file", dockerfile, "--tag", "byoc:test"]
    assert image_build[6:8] == ["--cache-from", "byoc:previous"]
    assert image_build[-4:] == ["--no-cache", "--network", "host", context]
    build_args = image_build[8:-4]
    assert build_args[0::2] == ["--build-arg"] * (len(build_args) // 2)
    assert {"IMAGE_REVISION=r1", "IMAGE_VERSION=9.9", "IMAGE_SOURCE=src"} <= set(build_args[1::2])
    assert stage_build == ["docker", "build", "--file", dockerfile, "--cache-from", "byoc:previous", *build_args,
                           "--network", "host", "--quiet", "--target", "wheelhouse", context]  # fmt: skip
    assert (tmp_path / "calls.jsonl.buildkit").read_text().split() == ["0", "0"]  # both: DOCKER_BUILDKIT=0
    assert create == ["docker", "create", "sha256:5ta6e1d", "/none"]
    assert copy[:3] == ["docker", "cp", "c0nta1ner:/wheels"] and copy[3].endswith("/") and len(copy) == 4
    assert remove == ["docker", "rm", "c0nta1ner"]
    assert not Path(copy[3]).exists()  # the export folder is removed on exit

    assert sorted(p.name for p in wheelhouse.iterdir()) == [".gitkeep", "horovod-0.28.1-0123456789abcdef"]
    kept = wheelhouse / "horovod-0.28.1-0123456789abcdef"
    assert sorted(p.name for p in kept.iterdir()) == ["build-facts.txt", "horovod-0.28.1-cp311-cp311-linux_x86_64.whl"]
    assert f"kept this build's Horovod wheel in {wheelhouse}: horovod-0.28.1-0123456789abcdef" in result.stderr


def test_legacy_builder_leaves_a_wheelhouse_that_already_holds_the_wheel_untouched(tmp_path):
    wheelhouse, env = tmp_path / "wheelhouse", _env(tmp_path)
    assert _build_legacy_with_wheelhouse(env, wheelhouse).returncode == 0
    kept = wheelhouse / "horovod-0.28.1-0123456789abcdef" / "build-facts.txt"
    before = kept.stat().st_mtime_ns
    again = _build_legacy_with_wheelhouse(env, wheelhouse)
    assert again.returncode == 0, again.stderr
    assert f"{wheelhouse} already holds this build's Horovod wheel" in again.stderr
    assert kept.stat().st_mtime_ns == before  # not rewritten: the next build's COPY stays a cache hit

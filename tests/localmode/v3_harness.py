"""Real SageMaker Python SDK v3 local-container jobs against the image built from this tree.

    result = run_v3_job(tmp_path, image, {"train.py": SCRIPT}, instance_count=2,
                        distributed={"kind": "mpi", "process_count_per_node": 2})
    assert result.ok, result.log_tail()
    result.model_json("mpi-rank-0.json")

Each job is one run of tests/localmode/v3_driver.py with the SDK v3 virtual environment's
python (.venv-sdk-v3, scripts/bootstrap.sh): `ModelTrainer(training_mode=Mode.LOCAL_CONTAINER,
training_image=<our image>, compute=Compute(instance_type="local_cpu", …))` and `train()`.

What v3 3.27.0 does with it (sagemaker/train/local/local_container.py): a docker-compose file
in the container root, one service per host (`algo-1`…`algo-N`, aliases on the fixed network
`sagemaker-local`), entrypoint `/bin/bash -c "… sm_train.sh"`; mounts: the root's `model/` at
/opt/ml/model on every host, per host `<root>/<host>/input` and `<root>/<host>/output`, the
channels `code` and `sm_drivers` under /opt/ml/input/data. `docker-compose up
--abort-on-container-exit`: the first container to exit stops the others, and compose's exit
code is that container's. Afterwards every host's model/ and output/ are copied into
`<root>/artifacts/` and tarred into `<root>/compressed_artifacts/{model,output}.tar.gz`, even
when the job failed. v3 never runs `docker-compose down`: every path here does.

Layers: decide_/build_ are pure; load_/probe_ read; write_/run_ act.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

from entrypoint.job.archive import extract_tar
from localmode.harness import COMPOSE_FILE
from support.docker import load_docker_env
from support.docker import run_build_image as build_local_image

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).resolve().with_name("v3_driver.py")
SDK_V3_PYTHON = REPO / ".venv-sdk-v3" / "bin" / "python"


# ---------------------------------------------------------------- decide (pure)


@dataclass(frozen=True)
class V3JobSpec:
    """What v3_driver.py reads (JSON): one ModelTrainer and its train()."""

    training_image: str
    container_root: str
    source_dir: str
    entry_script: str
    instance_type: str
    instance_count: int
    distributed: dict[str, Any] | None
    hyperparameters: dict[str, Any]
    environment: dict[str, str]
    base_job_name: str
    command: str | None = None  # SourceCode(command=…): v3 runs it instead of a driver
    requirements: str | None = None  # SourceCode(requirements=…): a file in source_dir


def build_v3_spec(
    *,
    image: str,
    container_root: Path,
    source_dir: Path,
    entry_script: str,
    instance_count: int,
    distributed: Mapping[str, Any] | None = None,
    hyperparameters: Mapping[str, Any] | None = None,
    environment: Mapping[str, str] | None = None,
    base_job_name: str = "byoc-v3",
    command: str | None = None,
    requirements: str | None = None,
) -> V3JobSpec:
    if distributed and distributed.get("kind") not in ("torchrun", "mpi"):
        raise ValueError(f"distributed kind {distributed.get('kind')!r}: expected 'torchrun' or 'mpi'")
    return V3JobSpec(
        training_image=image,
        container_root=str(container_root),
        source_dir=str(source_dir),
        entry_script=entry_script,
        # What v3's local mode passes through to resourceconfig.json; "local_gpu" would also
        # ask compose for every GPU.
        instance_type="local_cpu",
        instance_count=instance_count,
        distributed=dict(distributed) if distributed else None,
        hyperparameters=dict(hyperparameters or {}),
        environment={k: str(v) for k, v in (environment or {}).items()},
        base_job_name=base_job_name,
        command=command,
        requirements=requirements,
    )


def build_driver_argv(python: Path, spec_path: Path, result_path: Path) -> list[str]:
    return [str(python), str(DRIVER), str(spec_path), str(result_path)]


def build_compose_argv(container_root: Path, *args: str) -> list[str]:
    return ["docker-compose", "-f", str(container_root / COMPOSE_FILE), *args]


def parse_inspect_exits(text: str) -> dict[str, int]:
    """`docker inspect -f '{{index .Config.Labels "com.docker.compose.service"}} {{.State.ExitCode}}'`
    lines -> {service (the SageMaker host): exit code}."""
    exits = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            exits[parts[0]] = int(parts[1])
    return exits


# ---------------------------------------------------------------- the result


@dataclass(frozen=True)
class V3JobResult:
    ok: bool  # train() returned
    error: str | None  # what train() raised
    error_type: str | None
    log: str  # everything the driver printed: the SDK's logging and every container's output
    train_seconds: float | None  # train() alone
    wall_seconds: float  # the whole driver: importing the SDK, train(), reporting
    exit_codes: dict[str, int]  # host -> its container's exit code
    model_dir: Path | None  # compressed_artifacts/model.tar.gz, extracted
    output_dir: Path | None  # compressed_artifacts/output.tar.gz, extracted
    timed_out: bool = False
    spec: dict = field(default_factory=dict)
    # host -> what its container printed, from the container (docker logs): compose's merged
    # stream (log) can miss a container that ended as compose attached (seen on a loaded fresh
    # root: algo-2 exited 2 having refused the job, none of its lines in the log).
    container_logs: dict[str, str] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        """The job failed: train() raised, or a container exited non-zero and compose lost it.
        Debian 12's docker-compose 1.29 reads the first container to exit once, as it aborts
        (compose/cli/main.py compute_exit_code): where dockerd has not recorded that exit yet,
        `up` returns 0 and v3's train() returns (seen on a loaded fresh root: algo-1 exited 1,
        "Local training job completed"). The container's exit code is the job's truth."""
        return not self.ok or any(code != 0 for code in self.exit_codes.values())

    def model_json(self, relative: str) -> Any:
        if self.model_dir is None:
            raise AssertionError("the job produced no model.tar.gz")
        return json.loads((self.model_dir / relative).read_text())

    def model_jsons(self, prefix: str) -> list[Any]:
        if self.model_dir is None:
            return []
        return [json.loads(p.read_text()) for p in sorted(self.model_dir.glob(prefix + "*.json"))]

    def output_file(self, relative: str) -> Path:
        """A file of output.tar.gz: every host's /opt/ml/output copied into one folder, host by
        host (v3 removes each host's own folder after the job)."""
        if self.output_dir is None:
            raise AssertionError("the job produced no output.tar.gz")
        return self.output_dir / relative

    def log_tail(self, chars: int = 8000) -> str:
        return (
            f"error: {self.error_type}: {self.error}\ncontainers: {self.exit_codes}\n"
            f"train: {self.train_seconds} s\n--- log tail ---\n{self.log[-chars:]}"
        )


# ---------------------------------------------------------------- act


def decide_sdk_v3_python(environ: Mapping[str, str]) -> Path:
    """.venv-sdk-v3's python, or another interpreter with the same pin (BYOC_SDK_V3_PYTHON)."""
    return Path(environ.get("BYOC_SDK_V3_PYTHON") or SDK_V3_PYTHON)


def probe_sdk_v3_python() -> Path | None:
    python = decide_sdk_v3_python(os.environ)
    return python if python.is_file() else None


def run_build_image(tag: str) -> str:
    """scripts/build-local-image.sh for this tree (Docker's layer cache: seconds when unchanged)."""
    build_local_image(tag)
    return tag


def write_source(folder: Path, files: Mapping[str, str | bytes]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        if isinstance(content, bytes):
            (folder / name).write_bytes(content)
        else:
            (folder / name).write_text(content)
    return folder


def run_v3_job(
    tmp_path: Path,
    image: str,
    source_files: Mapping[str, str | bytes],
    entry_script: str = "train.py",
    instance_count: int = 1,
    distributed: Mapping[str, Any] | None = None,
    hyperparameters: Mapping[str, Any] | None = None,
    environment: Mapping[str, str] | None = None,
    timeout_s: float = 540,
    command: str | None = None,
    requirements: str | None = None,
) -> V3JobResult:
    source_dir = write_source(tmp_path / "src", source_files)
    # The compose project is named after this folder: unique per test, so no two jobs share
    # containers (they do share v3's fixed network, sagemaker-local).
    container_root = tmp_path / f"v3root{os.getpid()}{time.monotonic_ns() % 100000}"
    container_root.mkdir()
    spec = build_v3_spec(
        image=image, container_root=container_root, source_dir=source_dir, entry_script=entry_script,
        instance_count=instance_count, distributed=distributed, hyperparameters=hyperparameters,
        environment=environment, command=command, requirements=requirements,
    )
    spec_path, result_path, log_path = tmp_path / "spec.json", tmp_path / "result.json", tmp_path / "driver.log"
    spec_path.write_text(json.dumps(asdict(spec)))
    env = load_docker_env()
    started = time.monotonic()
    timed_out = False
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            build_driver_argv(decide_sdk_v3_python(os.environ), spec_path, result_path),
            stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=tmp_path,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.kill()
            proc.wait()
    wall = time.monotonic() - started
    try:
        exits = load_container_exits(container_root, env)
        container_logs = load_container_logs(container_root, env)
    finally:
        run_compose_down(container_root, env)
    result = json.loads(result_path.read_text()) if result_path.exists() else {}
    return V3JobResult(
        ok=bool(result.get("ok")),
        error=result.get("error") or ("the driver was killed after %.0f s" % timeout_s if timed_out else None),
        error_type=result.get("error_type"),
        log=log_path.read_text(errors="replace"),
        train_seconds=result.get("train_seconds"),
        wall_seconds=round(wall, 2),
        exit_codes=exits,
        model_dir=extract(container_root / "compressed_artifacts" / "model.tar.gz", tmp_path / "model"),
        output_dir=extract(container_root / "compressed_artifacts" / "output.tar.gz", tmp_path / "output"),
        timed_out=timed_out,
        spec=asdict(spec),
        container_logs=container_logs,
    )


def load_container_ids(container_root: Path, env: Mapping[str, str]) -> list[str]:
    if not (container_root / COMPOSE_FILE).exists():
        return []
    return subprocess.run(
        build_compose_argv(container_root, "ps", "-q"), capture_output=True, text=True, env=dict(env),
    ).stdout.split()


def load_container_logs(container_root: Path, env: Mapping[str, str]) -> dict[str, str]:
    """Each host's own output, as its container kept it (stdout and stderr, in order)."""
    logs = {}
    for container in load_container_ids(container_root, env):
        service = subprocess.run(["docker", "inspect", "-f", '{{index .Config.Labels "com.docker.compose.service"}}',
                                  container], capture_output=True, text=True, env=dict(env)).stdout.strip()
        done = subprocess.run(["docker", "logs", container], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, errors="replace", env=dict(env))
        logs[service] = done.stdout
    return logs


def load_container_exits(container_root: Path, env: Mapping[str, str]) -> dict[str, int]:
    ids = load_container_ids(container_root, env)
    if not ids:
        return {}
    done = subprocess.run(
        ["docker", "inspect", "-f", '{{index .Config.Labels "com.docker.compose.service"}} {{.State.ExitCode}}', *ids],
        capture_output=True, text=True, env=dict(env),
    )
    return parse_inspect_exits(done.stdout)


def run_compose_down(container_root: Path, env: Mapping[str, str]) -> None:
    """Remove the job's containers. The network may stay: another local-mode job may be using it."""
    if (container_root / COMPOSE_FILE).exists():
        subprocess.run(
            build_compose_argv(container_root, "down", "--timeout", "1"),
            capture_output=True, env=dict(env), timeout=120,
        )


def extract(tar_path: Path, into: Path) -> Path | None:
    if not tar_path.is_file():
        return None
    into.mkdir(parents=True, exist_ok=True)
    extract_tar(str(tar_path), str(into))  # the image's own safe extraction (any Python 3.11)
    return into



# ---------------------------------------------------------------- hosts without the SDK
# For the image-level tests: containers laid out as v3's local mode lays them out (the
# sm_drivers channel with an sm_train.sh that runs mpi_driver.py, a resourceconfig.json per
# host, a network with the host names as aliases), each PID 1 a `bash -c` as in v3, so
# /etc/byoc/bash-env.sh does what it does in a real v3 MPI job.

V3_MPI_TRAIN_SH = (
    "\n#!/bin/bash\n# the line /etc/byoc/bash-env.sh looks for, as v3's sm_train.sh has it:\n"
    "$SM_PYTHON_CMD /opt/ml/input/data/sm_drivers/distributed_drivers/mpi_driver.py\n"
)


def build_resource_config(host: str, hosts: list[str]) -> dict:
    """What v3 3.27.0's local mode writes (local_container._write_config_files)."""
    return {"current_host": host, "hosts": hosts, "network_interface_name": "ethwe", "current_instance_type": "local_cpu"}


def build_docker_run_argv(
    image: str, name: str, network: str, alias: str, mounts: list[tuple[str, str]], command: str,
    env: Mapping[str, str] | None = None,
) -> list[str]:
    argv = ["docker", "run", "-d", "--name", name, "--network", network, "--network-alias", alias]
    for source, target in mounts:
        argv += ["-v", f"{source}:{target}"]
    for key, value in (env or {}).items():
        argv += ["-e", f"{key}={value}"]
    return argv + ["--entrypoint", "/bin/bash", image, "-c", command]


@dataclass
class V3Hosts:
    """Running containers: host name -> container name; `stranger` is on the network, not in the job."""

    env: dict[str, str]
    network: str
    containers: dict[str, str]

    def exec(self, host: str, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["docker", "exec", self.containers[host], *argv],
            capture_output=True, text=True, env=self.env, timeout=timeout,
        )

    def logs(self, host: str) -> str:
        done = subprocess.run(["docker", "logs", self.containers[host]], capture_output=True, text=True, env=self.env)
        return done.stdout + done.stderr


def start_v3_hosts(
    tmp_path: Path, image: str, hosts: list[str], mpi_job: bool = True, stranger: bool = True,
    started: list[str] | None = None, container_env: Mapping[str, str] | None = None,
) -> V3Hosts:
    """Containers algo-1…N running `bash -c "exec /usr/sbin/sshd -D"` as v3's MPI driver
    does (after bash-env.sh ran), plus an optional `stranger` on the same network with no job.
    `started`: only these hosts of the job get a container (a host that never comes up);
    `container_env`: the containers' extra environment (as ModelTrainer's environment=)."""
    env = load_docker_env()
    tag = f"byoc-v3-{os.getpid()}-{time.monotonic_ns() % 1000000}"
    subprocess.run(["docker", "network", "create", tag], check=True, capture_output=True, env=env)
    hosts_obj = V3Hosts(env=env, network=tag, containers={})
    drivers = tmp_path / "sm_drivers"
    (drivers / "distributed_drivers").mkdir(parents=True)
    (drivers / "sm_train.sh").write_text(V3_MPI_TRAIN_SH if mpi_job else "\n#!/bin/bash\necho plain\n")
    (drivers / "distributed_drivers" / "mpi_driver.py").write_text("# stand-in: never run here\n")
    try:
        for host in (started or hosts) + (["stranger"] if stranger else []):
            config = tmp_path / host / "config"
            config.mkdir(parents=True)
            mounts = []
            if host != "stranger":
                (config / "resourceconfig.json").write_text(json.dumps(build_resource_config(host, hosts)))
                mounts = [(str(config), "/opt/ml/input/config"), (str(drivers), "/opt/ml/input/data/sm_drivers")]
            name = f"{tag}-{host}"
            subprocess.run(
                build_docker_run_argv(image, name, tag, host, mounts, "exec /usr/sbin/sshd -D", container_env),
                check=True, capture_output=True, env=env,
            )
            hosts_obj.containers[host] = name
    except BaseException:
        stop_v3_hosts(hosts_obj)
        raise
    return hosts_obj


def stop_v3_hosts(hosts: V3Hosts) -> None:
    names = list(hosts.containers.values())
    if names:
        subprocess.run(["docker", "rm", "-f", *names], capture_output=True, env=hosts.env)
    subprocess.run(["docker", "network", "rm", hosts.network], capture_output=True, env=hosts.env)

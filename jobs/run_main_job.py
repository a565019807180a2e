"""The README's main job: the default model (an MLP on scikit-learn's 8x8 digits, shipped
with scikit-learn) trained on 2 SageMaker hosts through the image's entrypoint.

    python -m jobs.run_main_job [--backend ddp|horovod|mpi4py|ps] [--hosts 2] [--processes-per-host 1]
                                [--sdk v2|v3] [--emulated]

By default the way users run it: the CPU image is built from this tree (or reused from
Docker's cache: scripts/build-local-image.sh) and the SageMaker Python SDK v2's PyTorch
estimator runs it in local mode (`image_uri=<image>, instance_type="local",
instance_count=2`, scripts/main_job_sdk_v2.py in .venv-sdk-v2), streaming every host's log;
--sdk v3: SDK v3's ModelTrainer (Torchrun() or MPI(), scripts/main_job_sdk_v3.py in .venv-sdk-v3).
--emulated instead runs `python -m entrypoint train` on emulated hosts (Linux namespaces,
localcluster; no Docker, root needed).

ddp (default) runs torchrun + DDP on every host; horovod and mpi4py run mpirun over SSH from
the leader; ps runs the torch.distributed.rpc parameter server. Ends with the validation
accuracy and the path of model.tar.gz (--emulated: of the saved model).

A development runner: .dockerignore keeps it out of the image.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from jobs.main_job import DEFAULT_HYPERPARAMETERS, ENTRY_SCRIPT, build_entry_script, build_npz_shards, load_digits_split

DISTRIBUTION = {"ddp": "torch_distributed", "horovod": "mpi", "mpi4py": "mpi", "ps": "parameter_server"}
# Under mpirun --tag-output in a local-mode container (a TTY), the next line's "[1,0]<stdout>:"
# tag can follow the path on the same line: the path stops before "[".
RESULT = re.compile(r"\[result\] validation_accuracy=(?P<acc>[0-9.]+) model=(?P<model>[^\s\[]+)")
REPO = Path(__file__).resolve().parents[1]
SDK_V2_PYTHON = REPO / ".venv-sdk-v2" / "bin" / "python"
SDK_V2_SCRIPT = REPO / "scripts" / "main_job_sdk_v2.py"
# --sdk v3: ModelTrainer (scripts/main_job_sdk_v3.py in .venv-sdk-v3), the same argv.
SDK_SCRIPTS = {"v2": SDK_V2_SCRIPT, "v3": REPO / "scripts" / "main_job_sdk_v3.py"}
DEFAULT_IMAGE_TAG = "byoc-training:cpu-local"
SDK_NETWORK = "sagemaker-local"
# Where the main job works when the default (<cwd>/.work/main-job) is a folder SDK local mode
# refuses (see decide_work_dir).
FALLBACK_WORK = "/var/tmp/byoc-main-job"
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def build_sdk_restricted_paths(home: str) -> tuple[str, ...]:
    """The folders SageMaker SDK local mode will not mount data from nor take a source_dir
    from ("Local Mode does not support mounting from restricted system paths"): v2's
    sagemaker.utils._SENSITIVE_SYSTEM_PATHS (2.257.7; v3 has the same list), checked against
    the installed SDK by tests/localmode/test_harness_units.py."""
    return (*(os.path.join(home, d) for d in (".aws", ".ssh", ".kube", ".docker", ".config", ".credentials")),
            "/etc", "/root", "/var/lib", "/opt/ml/metadata")


def decide_restricted(path: str, restricted: tuple[str, ...]) -> str | None:
    """The restricted folder `path` lies in (the SDK's own test: a string prefix), or None."""
    return next((r for r in restricted if path != "/" and path.startswith(r)), None)


def decide_work_dir(requested: str | None, cwd: str, home: str) -> str:
    """The main job's folder (code, channels, the SDK's container root). The default,
    <cwd>/.work/main-job, moves to FALLBACK_WORK when the SDK would refuse it, which is every
    checkout under /root; a --work the SDK would refuse is an error that says why."""
    restricted = build_sdk_restricted_paths(home)
    if requested:
        work = os.path.realpath(os.path.abspath(requested))
        if (where := decide_restricted(work, restricted)):
            raise SystemExit(f"--work {requested}: SageMaker SDK local mode refuses code and data under {where} "
                             f"(its restricted system paths); choose a folder outside {', '.join(restricted)}")
        return work
    default = os.path.realpath(os.path.join(cwd, ".work", "main-job"))
    return FALLBACK_WORK if decide_restricted(default, restricted) else default


def write_inputs(work: str, backend: str, train_shards: int = 4) -> tuple[str, dict[str, str]]:
    """The code folder and the channel folders, as an estimator's source_dir and S3 inputs."""
    split = load_digits_split()
    code = os.path.join(work, "code")
    channels = {"train": os.path.join(work, "data", "train"), "validation": os.path.join(work, "data", "validation")}
    for folder in (code, *channels.values()):
        os.makedirs(folder, exist_ok=True)
    with open(os.path.join(code, ENTRY_SCRIPT), "w") as f:
        f.write(build_entry_script(backend))
    for i, shard in enumerate(build_npz_shards(split.train, train_shards)):
        with open(os.path.join(channels["train"], f"digits-{i:03d}.npz"), "wb") as f:
            f.write(shard)
    with open(os.path.join(channels["validation"], "digits-000.npz"), "wb") as f:
        f.write(build_npz_shards(split.validation, 1)[0])
    return code, channels


# ---------------------------------------------------------------- decide (pure)


def decide_sdk_distribution(backend: str, processes_per_host: int) -> dict:
    """The estimator's distribution= for a backend (what a user writes)."""
    kind = DISTRIBUTION[backend]
    if kind == "mpi":
        return {"mpi": {"enabled": True, "processes_per_host": processes_per_host}}
    return {kind: {"enabled": True}}


def decide_model_member(container_path: str) -> str:
    """/opt/ml/model/model.pt (the path the script printed) -> its name inside model.tar.gz."""
    return os.path.relpath(container_path, "/opt/ml/model")


def parse_exports(text: str) -> dict[str, str]:
    """`scripts/docker-engine.sh start` prints `export NAME=value` lines."""
    return dict(re.findall(r"^export ([A-Z_][A-Z0-9_]*)=(\S+)$", text, re.M))


def build_sdk_argv(python: str, image: str, code: str, channels: dict[str, str], hosts: int, backend: str,
                   processes_per_host: int, container_root: str, result_path: str, sdk: str = "v2") -> list[str]:
    argv = [python, str(SDK_SCRIPTS[sdk]), "--image", image, "--code", code, "--entry-point", ENTRY_SCRIPT,
            "--instance-count", str(hosts),
            "--distribution", json.dumps(decide_sdk_distribution(backend, processes_per_host)),
            "--hyperparameters", json.dumps(DEFAULT_HYPERPARAMETERS),
            "--container-root", container_root, "--result", result_path]
    for name, path in channels.items():
        argv += ["--channel", f"{name}={path}"]
    return argv


# ---------------------------------------------------------------- act


def run_build_image(tag: str) -> str:
    """scripts/build-local-image.sh: its progress goes to our stderr; it prints the tag."""
    done = subprocess.run(["bash", str(REPO / "scripts" / "build-local-image.sh"), "--tag", tag],
                          cwd=REPO, stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"main job: building the image failed (exit {done.returncode}); see above")
    return done.stdout.strip().splitlines()[-1]


def start_docker_env() -> dict[str, str]:
    done = subprocess.run(["bash", str(REPO / "scripts" / "docker-engine.sh"), "start"],
                          stdout=subprocess.PIPE, text=True, check=True)
    return {**os.environ, **parse_exports(done.stdout)}


def run_streaming(argv: list[str], env: dict[str, str], log_path: str) -> tuple[int, str]:
    """Run argv, echoing its output live (the SDK streams every host's log) and keeping it."""
    kept = []
    colour = sys.stdout.isatty()
    with open(log_path, "w") as log, subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                     text=True, errors="replace", bufsize=1) as proc:
        for line in proc.stdout:
            line = line.replace("\r", "")  # containers run with a TTY: CRLF lines
            plain = ANSI_ESCAPE.sub("", line)  # docker-compose colours each host's prefix
            sys.stdout.write(line if colour else plain)
            sys.stdout.flush()
            log.write(plain)
            kept.append(plain)
    return proc.returncode, "".join(kept)


def run_compose_down(container_root: str, env: dict[str, str]) -> None:
    """Local mode leaves the stopped containers (`up --abort-on-container-exit`) and its
    network behind; remove them (the network only when no other job uses it)."""
    for compose in Path(container_root).glob("*/docker-compose.yaml"):
        subprocess.run(["docker-compose", "-f", str(compose), "down", "--remove-orphans", "--timeout", "5"],
                       env=env, capture_output=True, check=False)
    users = subprocess.run(["docker", "network", "inspect", "--format", "{{len .Containers}}", SDK_NETWORK],
                           env=env, capture_output=True, text=True, check=False)
    if users.returncode == 0 and users.stdout.strip() == "0":
        subprocess.run(["docker", "network", "rm", SDK_NETWORK], env=env, capture_output=True, check=False)


def main_sdk(args) -> int:
    """SDK v2's PyTorch estimator (the default) or SDK v3's ModelTrainer (--sdk v3) in local mode."""
    sdk = args.sdk
    python = os.environ.get(f"BYOC_SDK_{sdk.upper()}_PYTHON") or str(REPO / f".venv-sdk-{sdk}" / "bin" / "python")
    if not os.path.isfile(python):
        print(f"main job: {python} is missing; scripts/bootstrap.sh installs the SageMaker SDK {sdk} there",
              file=sys.stderr)
        return 2
    if sdk == "v3" and DISTRIBUTION[args.backend] == "parameter_server":
        print("main job: SDK v3 has no parameter-server launcher (Torchrun() and MPI() only): use --sdk v2",
              file=sys.stderr)
        return 2
    if args.image_built:
        # scripts/run-main-job.sh has just built it. A second build would not be a cache hit on a
        # new machine: the first build kept its Horovod wheel in docker/wheelhouse/cpu, which
        # the Dockerfile copies, so every layer from there would be made again (~2 min).
        print(f"main job: the CPU image {args.image_tag} (built just now)", flush=True)
        image = args.image_tag
    else:
        print(f"main job: building (or reusing) the CPU image {args.image_tag}", flush=True)
        image = run_build_image(args.image_tag)
    code, channels = write_inputs(args.work, args.backend)
    container_root = os.path.join(args.work, "sagemaker-local")
    os.makedirs(container_root)
    result_path = os.path.join(args.work, "sdk-result.json")
    env = start_docker_env()
    # The SDK wants a region and credentials even in local mode; fixed placeholders keep it
    # from looking for real ones (they reach the containers as AWS_* variables, unused).
    env.update({"AWS_DEFAULT_REGION": "us-west-2", "AWS_ACCESS_KEY_ID": "AKIALOCALMODEJOB",
                "AWS_SECRET_ACCESS_KEY": "local-mode-placeholder", "PYTHONUNBUFFERED": "1"})
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "VIRTUAL_ENV", "PYTHONPATH"):
        env.pop(name, None)
    call = (f"SDK v2 PyTorch(image_uri={image!r}, instance_type='local', instance_count={args.hosts}).fit()"
            if sdk == "v2" else
            f"SDK v3 ModelTrainer(training_image={image!r}, Compute(instance_type='local_cpu', "
            f"instance_count={args.hosts})).train()")
    print(f"main job: {args.backend} on {args.hosts} SageMaker local-mode hosts: {call}", flush=True)
    log_path = os.path.join(args.work, f"sdk-{sdk}.log")
    try:
        code_rc, log = run_streaming(build_sdk_argv(python, image, code, channels, args.hosts, args.backend,
                                                    args.processes_per_host, container_root, result_path, sdk),
                                     env, log_path)
    finally:
        run_compose_down(container_root, env)
    result = json.load(open(result_path)) if os.path.isfile(result_path) else {"ok": False, "error": f"exit {code_rc}"}
    found = RESULT.search(log)
    if not result["ok"] or found is None:
        print(f"main job FAILED: {result.get('error') or 'no [result] line in the log'} (log: {log_path})")
        return 1
    model_tar = result["model_data"].removeprefix("file://")
    member = decide_model_member(found["model"])
    with tarfile.open(model_tar) as tar:
        if member not in tar.getnames():
            print(f"main job FAILED: {model_tar} has no {member} ({tar.getnames()})")
            return 1
    print(f"{'fit' if sdk == 'v2' else 'train'}() took {result['fit_seconds']:.1f} s")
    print(f"validation accuracy: {float(found['acc']):.4f}")
    print(f"model.tar.gz: {model_tar} (holds {member}; torch.load reads it)")
    return 0


def main_emulated(args) -> int:
    from localcluster import EmulatedCluster
    from localcluster.optml import Channel, JobSpec

    code, channels = write_inputs(args.work, args.backend)
    mpi = DISTRIBUTION[args.backend] == "mpi"
    spec = JobSpec(
        job_name=f"digits-{args.backend}",
        program=ENTRY_SCRIPT,
        code_dir=code,
        channels=tuple(Channel(name, path, "application/x-npz") for name, path in channels.items()),
        distribution=DISTRIBUTION[args.backend],
        processes_per_host=args.processes_per_host if mpi else None,
        hyperparameters=dict(DEFAULT_HYPERPARAMETERS),
    )
    hosts = [f"algo-{i}" for i in range(1, args.hosts + 1)]
    print(f"main job: {args.backend} on {len(hosts)} emulated hosts through `python -m entrypoint train`", flush=True)
    with EmulatedCluster(hosts, spec, echo=sys.stdout, workdir=os.path.join(args.work, "cluster")) as cluster:
        result = cluster.run_all([sys.executable, "-m", "entrypoint", "train"], timeout=1800)
        model_dir = cluster.model_dir
    found = None
    for r in result.results.values():
        match = RESULT.search(r.output)
        found = found or match
    for host, r in result.results.items():
        print(f"  {host}: exit {r.returncode} ({r.seconds:.1f} s)")
    if not result.ok or found is None:
        print("main job FAILED: see each host's output/failure under", os.path.join(args.work, "cluster"))
        return 1
    model = os.path.join(model_dir, os.path.relpath(found["model"], "/opt/ml/model"))
    print(f"validation accuracy: {float(found['acc']):.4f}")
    print(f"saved model: {model}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.run_main_job", description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=sorted(DISTRIBUTION), default="ddp")
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--processes-per-host", type=int, default=1)
    parser.add_argument("--sdk", choices=("v2", "v3"), default="v2",
                        help="the SageMaker Python SDK that runs the job: v2's PyTorch estimator (default) or "
                             "v3's ModelTrainer")
    parser.add_argument("--work", help="the job's folder (default <cwd>/.work/main-job, or "
                        f"{FALLBACK_WORK} where SDK local mode refuses that: e.g. under /root)")
    parser.add_argument("--image-built", action="store_true",
                        help="use --image-tag as it is: the caller (scripts/run-main-job.sh) has just built it")
    parser.add_argument("--emulated", action="store_true",
                        help="emulated hosts (Linux namespaces, no Docker; root) instead of SDK v2 local mode")
    parser.add_argument("--image-tag", default=os.environ.get("BYOC_IMAGE_TAG") or DEFAULT_IMAGE_TAG,
                        help="the CPU image to build or reuse (default: $BYOC_IMAGE_TAG, else %(default)s)")
    args = parser.parse_args(argv)
    if args.emulated:
        args.work = os.path.abspath(args.work or os.path.join(os.getcwd(), ".work", "main-job"))
    else:
        args.work = decide_work_dir(args.work, os.getcwd(), os.path.expanduser("~"))
    print(f"main job: working in {args.work}", flush=True)
    shutil.rmtree(args.work, ignore_errors=True)
    return main_emulated(args) if args.emulated else main_sdk(args)


if __name__ == "__main__":
    sys.exit(main())

"""SageMaker local mode, our image against the toolkit's way: fit() wall time per job, and
each image's build time and size, measured in the same run on the same machine.

    .venv/bin/python benchmarks/localmode.py [--repeats 3] [--cold] [--only ours|baseline] [--floor]

- ours: the CPU image (scripts/build-local-image.sh → docker/build.sh, docker/Dockerfile.cpu);
- baseline: benchmarks/baseline/Dockerfile, built the way the PyTorch DLC builds its SageMaker
  stage (same base image, Debian's Python and Open MPI, torch, mpi4py, sagemaker-training +
  sagemaker-pytorch-training, a baked SSH key pair, no ENTRYPOINT: SageMaker runs `train`);
- floor (--floor, 1-host job only): benchmarks/floor/Dockerfile, a `train` that writes one
  file and exits, so its fit() time is the SDK's and docker-compose's share of every job.

Each job is a real SDK v2 `PyTorch(image_uri=…, instance_type="local")` fit() through the test
harness (tests/localmode/harness.py), with the SDK's default settings and ours (no grace
period or timeout overrides). Cases: 1 host; 2 hosts torch_distributed; 2 hosts mpi
(1 process per host); 2 hosts where rank 1 (on the second host) raises, with mpi and with
torch_distributed. The time is fit()'s wall time (container start to artifacts packed);
the median of --repeats runs, cases and images interleaved so drift hits both alike.
--cold builds both images without Docker's layer cache (minutes each); otherwise the build
times are those of a cached rebuild. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from localmode.harness import run_v2_job  # noqa: E402  (the tests' harness, on purpose: one way to run a job)

BASELINE_DIR = REPO / "benchmarks" / "baseline"
BASELINE_TAG = "byoc-baseline:toolkit"
FLOOR_DIR = REPO / "benchmarks" / "floor"
FLOOR_TAG = "byoc-floor:sdk"
OURS_TAG = "byoc-training:cpu-local"
SAGEMAKER_PYTORCH_TRAINING_VERSION = "3.0.0"  # the newest on PyPI (2026-11); needs sagemaker-training 5.x

ONE_HOST = """\
import json, os
with open(os.path.join(os.environ["SM_MODEL_DIR"], "done.json"), "w") as f:
    json.dump({"host": os.environ["SM_CURRENT_HOST"]}, f)
"""

TORCH_ALLREDUCE = """\
import json, os, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
if os.environ.get("FAIL_RANK") == str(rank):
    raise RuntimeError(f"rank {rank} fails on purpose")
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
if rank == 0:
    with open(os.path.join(os.environ["SM_MODEL_DIR"], "sum.json"), "w") as f:
        json.dump({"sum": t.item(), "world": dist.get_world_size()}, f)
dist.destroy_process_group()
"""

MPI_ALLREDUCE = """\
import json, os
from mpi4py import MPI
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
if os.environ.get("FAIL_RANK") == str(rank):
    raise RuntimeError(f"rank {rank} fails on purpose")
total = comm.allreduce(rank + 1)
if rank == 0:
    with open(os.path.join(os.environ["SM_MODEL_DIR"], "sum.json"), "w") as f:
        json.dump({"sum": total, "world": comm.Get_size()}, f)
"""

TORCHRUN = {"torch_distributed": {"enabled": True}}
MPI = {"mpi": {"enabled": True, "processes_per_host": 1}}


@dataclass(frozen=True)
class Case:
    name: str
    script: str
    hosts: int
    distribution: dict
    environment: dict
    should_fail: bool = False


CASES = (
    Case("1 host", ONE_HOST, 1, {}, {}),
    Case("2 hosts torch_distributed", TORCH_ALLREDUCE, 2, TORCHRUN, {}),
    Case("2 hosts mpi", MPI_ALLREDUCE, 2, MPI, {}),
    Case("2 hosts mpi, rank on host 2 raises", MPI_ALLREDUCE, 2, MPI, {"FAIL_RANK": "1"}, True),
    Case("2 hosts torch_distributed, rank on host 2 raises", TORCH_ALLREDUCE, 2, TORCHRUN, {"FAIL_RANK": "1"}, True),
)


def load_versions() -> dict[str, str]:
    pins = {}
    for line in (REPO / "docker" / "versions.env").read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            pins[key] = value
    return pins


def build_baseline_argv(pins: dict[str, str], cold: bool) -> list[str]:
    args = {
        "BASE_IMAGE": pins["CPU_BASE_IMAGE"],
        "APT_RUNTIME_PACKAGES": pins["CPU_APT_RUNTIME_PACKAGES"],
        "APT_BUILD_PACKAGES": pins["CPU_APT_BUILD_PACKAGES"],
        "TORCH_VERSION": pins["CPU_TORCH_VERSION"],
        "PYPI_NUMPY_VERSION": pins["CPU_PYPI_NUMPY_VERSION"],
        "PYPI_MPI4PY_VERSION": pins["COMMON_PYPI_MPI4PY_VERSION"],
        "PYPI_SAGEMAKER_TRAINING_VERSION": pins["COMMON_PYPI_SAGEMAKER_TRAINING_VERSION"],
        "PYPI_SAGEMAKER_PYTORCH_TRAINING_VERSION": SAGEMAKER_PYTORCH_TRAINING_VERSION,
    }
    argv = ["env", "DOCKER_BUILDKIT=0", "docker", "build", "--network", "host", "--tag", BASELINE_TAG]
    if cold:
        argv.append("--no-cache")
    for key, value in args.items():
        argv += ["--build-arg", f"{key}={value}"]
    return argv + [str(BASELINE_DIR)]


def run_timed(argv: list[str], what: str) -> float:
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{what} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return time.monotonic() - started


def build_ours(cold: bool) -> float:
    argv = ["bash", str(REPO / "scripts" / "build-local-image.sh"), "--tag", OURS_TAG]
    return run_timed(argv + (["--", "--no-cache"] if cold else []), "building our image")


def build_baseline(cold: bool) -> float:
    # The same machine additions as ours (CA bundle, local torch wheel), in its own context.
    run_timed(["bash", str(REPO / "scripts" / "build-local-image.sh"), "--tag", OURS_TAG], "preparing build-local")
    local = BASELINE_DIR / "build-local"
    shutil.rmtree(local, ignore_errors=True)
    shutil.copytree(REPO / "docker" / "build-local", local)
    try:
        return run_timed(build_baseline_argv(load_versions(), cold), "building the baseline image")
    finally:
        shutil.rmtree(local, ignore_errors=True)


def build_floor(cold: bool) -> float:
    argv = ["env", "DOCKER_BUILDKIT=0", "docker", "build", "--tag", FLOOR_TAG,
            "--build-arg", f"BASE_IMAGE={load_versions()['CPU_BASE_IMAGE']}"]
    return run_timed(argv + (["--no-cache"] if cold else []) + [str(FLOOR_DIR)], "building the floor image")


BUILDERS = {"ours": build_ours, "baseline": build_baseline, "floor": build_floor}


def decide_runs(case: Case, label: str) -> bool:
    """The floor image only writes a file and exits: it stands in for a 1-host job only."""
    return label != "floor" or (case.hosts == 1 and not case.should_fail)


def probe_size(tag: str) -> int:
    out = subprocess.run(["docker", "image", "inspect", "--format", "{{.Size}}", tag],
                         capture_output=True, text=True, check=True).stdout
    return int(out)


def run_case(case: Case, image: str, work: Path, n: int) -> tuple[float, bool, str]:
    # One folder per case, image and repeat: the SDK's logs stay readable afterwards (--keep).
    result = run_v2_job(work, source_files={"train.py": case.script}, instance_count=case.hosts,
                        distribution=case.distribution, environment=case.environment, image=image,
                        timeout_s=900, name=f"{image.replace(':', '-').replace('/', '-')}-c{CASES.index(case)}-{n}")
    correct = (not result.ok) if case.should_fail else result.ok
    seconds = result.fit_seconds if result.fit_seconds is not None else result.wall_seconds
    return seconds, correct, (result.error or "")[:300]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cold", action="store_true", help="build both images without Docker's layer cache")
    parser.add_argument("--only", choices=("ours", "baseline"))
    parser.add_argument("--floor", action="store_true",
                        help="also time the 1-host job on benchmarks/floor (SDK and docker-compose only)")
    parser.add_argument("--cases", help="comma-separated case numbers (0-based) to run; default all")
    parser.add_argument("--keep", action="store_true", help="keep the jobs' folders (SDK logs) and print where")
    args = parser.parse_args(argv)

    images = {"ours": OURS_TAG, "baseline": BASELINE_TAG}
    if args.only:
        images = {args.only: images[args.only]}
    if args.floor:
        images["floor"] = FLOOR_TAG
    builds = {}
    for label in images:
        builds[label] = BUILDERS[label](args.cold)
        print(f"built {label}: {builds[label]:.0f} s, {probe_size(images[label]) / 1e9:.2f} GB", flush=True)

    cases = [CASES[int(i)] for i in args.cases.split(",")] if args.cases else list(CASES)
    times: dict[tuple[str, str], list[float]] = {}
    problems = []
    tmp = tempfile.mkdtemp(prefix="byoc-localmode-bench-")
    try:
        for repeat in range(args.repeats):
            for case in cases:
                for label, image in images.items():
                    if not decide_runs(case, label):
                        continue
                    seconds, correct, error = run_case(case, image, Path(tmp) / f"r{repeat}", repeat)
                    times.setdefault((case.name, label), []).append(seconds)
                    flag = "" if correct else f"  UNEXPECTED ({'failed' if not case.should_fail else 'succeeded'}: {error})"
                    if not correct:
                        problems.append(f"{label} / {case.name}: {error}")
                    print(f"[{repeat + 1}/{args.repeats}] {case.name:50s} {label:8s} {seconds:7.2f} s{flag}", flush=True)
    finally:
        if args.keep:
            print(f"jobs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    labels = list(images)
    print("\n| job | " + " | ".join(f"{label} fit() s (median)" for label in labels) + " |")
    print("|---|" + "---|" * len(labels))
    for case in cases:
        cells = [f"{statistics.median(times[(case.name, label)]):.1f}" if (case.name, label) in times else "—"
                 for label in labels]
        print(f"| {case.name} | " + " | ".join(cells) + " |")
    build_kind = "cold build s" if args.cold else "cached rebuild s"
    print(f"| image: {build_kind} | " + " | ".join(f"{builds[label]:.0f}" for label in labels) + " |")
    print("| image: size GB | " + " | ".join(f"{probe_size(images[label]) / 1e9:.2f}" for label in labels) + " |")
    if problems:
        print("\nUnexpected outcomes:\n" + "\n".join(problems))
    return 0


if __name__ == "__main__":
    sys.exit(main())

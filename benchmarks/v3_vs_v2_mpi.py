"""SDK v3 `ModelTrainer(distributed=MPI())` against SDK v2 `PyTorch(distribution={"mpi": …})` on
this image, in SageMaker local mode: the same 2-host, 1-process-per-host mpi4py allreduce,
run in the same session on the same machine, jobs interleaved (v2, v3, v2, v3, …).

    .venv/bin/python benchmarks/v3_vs_v2_mpi.py [--repeats 3] [--image TAG] [--drivers byoc|sdk]

The time is the SDK's call alone: v2's fit(), v3's train() (containers started, the job, the
artifacts packed), through the tests' harnesses (tests/localmode/harness.py, v3_harness.py).
--drivers sdk sets BYOC_SDK_V3_DRIVERS=sdk on the v3 jobs: v3's own MPI driver, as before the
launcher took v3 jobs. Prints the median and every run of each, and v3's median / v2's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from localmode.harness import run_v2_job  # noqa: E402  (the tests' harnesses: one way to run a job)
from localmode.v3_harness import run_build_image, run_v3_job  # noqa: E402
from support.docker import decide_image_tag  # noqa: E402

ALLREDUCE = """\
import json
from mpi4py import MPI
comm = MPI.COMM_WORLD
total = comm.allreduce(comm.Get_rank() + 1, op=MPI.SUM)
assert total == comm.Get_size() * (comm.Get_size() + 1) // 2, total
json.dump({"size": comm.Get_size()}, open(f"/opt/ml/model/rank-{comm.Get_rank()}.json", "w"))
"""


def run_pair(work: Path, image: str, drivers: str) -> tuple[float, float]:
    v2 = run_v2_job(work / "v2", source_files={"train.py": ALLREDUCE}, instance_count=2,
                    distribution={"mpi": {"enabled": True, "processes_per_host": 1}}, image=image)
    if not v2.ok:
        raise SystemExit(f"v2 job failed: {v2.error}\n{v2.log[-3000:]}")
    (work / "v3").mkdir()
    environment = {"BYOC_SDK_V3_DRIVERS": "sdk"} if drivers == "sdk" else {}
    v3 = run_v3_job(work / "v3", image, {"train.py": ALLREDUCE}, instance_count=2,
                    distributed={"kind": "mpi", "process_count_per_node": 1}, environment=environment)
    if not v3.ok:
        raise SystemExit(f"v3 job failed: {v3.error}\n{v3.log_tail()}")
    return v2.fit_seconds, v3.train_seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--image", help="an image built from this tree (default: build it, $BYOC_IMAGE_TAG)")
    parser.add_argument("--drivers", choices=("byoc", "sdk"), default="byoc")
    args = parser.parse_args(argv)
    image = args.image or run_build_image(decide_image_tag(os.environ))
    v2s, v3s = [], []
    with tempfile.TemporaryDirectory(prefix="v3-vs-v2-", dir=os.environ.get("BYOC_BENCH_DIR", "/var/tmp")) as tmp:
        for i in range(args.repeats):
            v2, v3 = run_pair(Path(tmp) / str(i), image, args.drivers)
            v2s.append(v2)
            v3s.append(v3)
            print(f"run {i + 1}: v2 fit() {v2:.1f} s, v3 train() {v3:.1f} s", flush=True)
    m2, m3 = statistics.median(v2s), statistics.median(v3s)
    print(f"\n| 2 hosts MPI allreduce, {args.repeats} runs | median s | runs |\n|---|---|---|")
    print(f"| SDK v2 fit() | {m2:.1f} | {', '.join(f'{t:.1f}' for t in v2s)} |")
    print(f"| SDK v3 train() ({args.drivers} drivers) | {m3:.1f} | {', '.join(f'{t:.1f}' for t in v3s)} |")
    print(f"\nv3 / v2: {m3 / m2:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

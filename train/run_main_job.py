"""The README's main job: the default model (an MLP on scikit-learn's 8x8 digits, shipped
with scikit-learn) trained on 2 emulated SageMaker hosts through the image's entrypoint.

    python -m train.run_main_job [--backend ddp|horovod|mpi4py|ps] [--hosts 2] [--processes-per-host 1]

ddp (default) runs torchrun + DDP on every host; horovod and mpi4py run mpirun over SSH from
the leader; ps runs the torch.distributed.rpc parameter server. Each host is a set of Linux
namespaces (localcluster; root needed). Ends with the validation accuracy and the path of the
saved model.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys

from localcluster import EmulatedCluster
from localcluster.optml import Channel, JobSpec
from train.main_job import DEFAULT_HYPERPARAMETERS, ENTRY_SCRIPT, build_entry_script, build_npz_shards, load_digits_split

DISTRIBUTION = {"ddp": "torch_distributed", "horovod": "mpi", "mpi4py": "mpi", "ps": "parameter_server"}
RESULT = re.compile(r"\[result\] validation_accuracy=(?P<acc>[0-9.]+) model=(?P<model>\S+)")


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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.run_main_job", description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=sorted(DISTRIBUTION), default="ddp")
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--processes-per-host", type=int, default=1)
    parser.add_argument("--work", default=os.path.join(os.getcwd(), ".work", "main-job"))
    args = parser.parse_args(argv)
    shutil.rmtree(args.work, ignore_errors=True)
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


if __name__ == "__main__":
    sys.exit(main())

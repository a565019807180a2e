"""What one gradient allreduce of the default model costs on this machine, gloo (what DDP
uses on CPU) vs Open MPI through mpi4py (what the mpi4py trainer uses): the floor under
DDP's 2-rank scaling efficiency (docs/training.md, "Where DDP's time goes").

    .venv/bin/python benchmarks/allreduce_latency.py [--iterations 2000]

Two ranks on one machine, each bound to its own core with one torch thread, as the
trainers run (the gloo ranks through train/'s own CPU set-up: every thread bound, gloo's I/O
thread at SCHED_IDLE, as train/ddp_train.py does). The gradient is the default model's (MLP 64-256-256-10: 85,002 float32
values, 340 KB), reduced as one buffer (DDP's default 25 MB bucket holds it whole) and as
4 and 16 pieces (what smaller buckets would do). Reported: the median time of one
allreduce of the whole gradient, per rank. Also the step without any communication
(forward, backward, SGD at 512 records a rank), one process alone and two at once, each on
its own core: what running two ranks side by side costs before any gradient moves.
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time

PARAMETERS = 64 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10  # the default MLP's
PIECES = (1, 4, 16)


def bind_to_own_core(rank: int) -> None:
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[rank % len(cores)]})


def time_calls(reduce_pieces, pieces: list, iterations: int, barrier) -> float:
    for _ in range(50):  # warm-up
        reduce_pieces(pieces)
    barrier()
    samples = []
    for _ in range(iterations):
        start = time.perf_counter()
        reduce_pieces(pieces)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def rank_gloo(iterations: int) -> dict:
    """As train/ddp_train.py sets a CPU rank up: every thread bound to the rank's own core
    before the process group starts (train.devices.setup_cpu, so gloo's threads are bound too),
    and gloo's I/O thread at SCHED_IDLE (yield_gloo_io_thread)."""
    import torch
    import torch.distributed as dist

    from train.ddp_train import yield_gloo_io_thread
    from train.devices import setup_cpu
    from train.ranks import parse_rank_info

    plan = setup_cpu(os.environ, parse_rank_info(os.environ), "auto")
    if plan.cores is None:  # a single core, or the binding declined: as before
        torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if plan.cores is None:
        bind_to_own_core(rank)
    yielded = yield_gloo_io_thread() if plan.cores is not None and len(plan.cores) == 1 else 0
    grad = torch.ones(PARAMETERS)
    out = {}
    for n in PIECES:
        pieces = list(torch.chunk(grad, n))
        out[n] = time_calls(lambda ps: [dist.all_reduce(p) for p in ps], pieces, iterations, dist.barrier)
    dist.destroy_process_group()
    return {"rank": rank, "median_s": out, "cores": sorted(plan.cores or ()), "io_threads_yielded": yielded}


def rank_mpi(iterations: int) -> dict:
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    bind_to_own_core(comm.Get_rank())
    grad = np.ones(PARAMETERS, dtype=np.float32)
    out = {}
    for n in PIECES:
        pieces = np.array_split(grad, n)
        out[n] = time_calls(lambda ps: [comm.Allreduce(MPI.IN_PLACE, p, op=MPI.SUM) for p in ps],
                            pieces, iterations, comm.Barrier)  # fmt: skip
    return {"rank": comm.Get_rank(), "median_s": out}


def rank_compute(iterations: int, rank: int) -> float:
    """Median seconds of one training step of the default model, no communication."""
    import torch
    from torch import nn

    torch.set_num_threads(1)
    bind_to_own_core(rank)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(512, 64), torch.randint(0, 10, (512,))

    def step(_):
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    return time_calls(step, [None], iterations, lambda: None)


def launch_compute(processes: int, iterations: int) -> float:
    me = [sys.executable, os.path.abspath(__file__), "--iterations", str(iterations)]
    procs = [subprocess.Popen([*me, "--compute-rank", str(r)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"}) for r in range(processes)]  # fmt: skip
    return max(float(p.communicate()[0].split()[-1]) for p in procs)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(backend: str, iterations: int) -> list[dict]:
    me = [sys.executable, os.path.abspath(__file__), "--rank-of", backend, "--iterations", str(iterations)]
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # train/ for the gloo ranks
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(filter(None, (repo, os.environ.get("PYTHONPATH"))))}
    if backend == "gloo":
        argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                "--master_addr", "127.0.0.1", "--master_port", str(free_port()), *me[1:]]  # fmt: skip
    else:
        argv = [shutil.which("mpirun") or "mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                "-np", "2", "-mca", "btl", "^openib,ofi", *me]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{backend} run failed:\n{done.stderr[-3000:]}")
    # Each rank prints one RESULT record; two ranks' prints can land on one line.
    decoder, out, at = json.JSONDecoder(), [], done.stdout.find("RESULT ")
    while at >= 0:
        record, end = decoder.raw_decode(done.stdout, at + len("RESULT "))
        out.append(record)
        at = done.stdout.find("RESULT ", end)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--rank-of", choices=("gloo", "mpi"), help=argparse.SUPPRESS)
    parser.add_argument("--compute-rank", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.compute_rank is not None:
        print(f"STEP {rank_compute(args.iterations, args.compute_rank)}", flush=True)
        return 0
    if args.rank_of:
        result = (rank_gloo if args.rank_of == "gloo" else rank_mpi)(args.iterations)
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    print(f"command: {' '.join(sys.argv)}")
    print(f"machine: {os.cpu_count()} CPUs, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"gradient: {PARAMETERS} float32 values ({PARAMETERS * 4 / 1000:.0f} KB), 2 ranks, "
          f"median of {args.iterations} allreduces of the whole gradient, in 1 / 4 / 16 pieces")
    for backend in ("gloo", "mpi"):
        ranks = launch(backend, args.iterations)
        worst = {n: max(r["median_s"][str(n)] for r in ranks) for n in PIECES}
        label = "gloo (DDP on CPU)" if backend == "gloo" else "Open MPI via mpi4py"
        setup = ""
        if backend == "gloo":
            setup = "   (ranks' cores " + ", ".join(str(r.get("cores")) for r in ranks) + \
                    f"; gloo I/O threads at SCHED_IDLE: {sum(r.get('io_threads_yielded', 0) for r in ranks)})"
        print(f"{label:<22} " + "   ".join(f"{n:>2} piece(s) {worst[n] * 1000:6.3f} ms" for n in PIECES) + setup, flush=True)
    steps = max(200, args.iterations // 4)
    alone, side_by_side = launch_compute(1, steps), launch_compute(2, steps)
    print(f"step without communication (batch 512, median of {steps}): one process alone {alone * 1000:.3f} ms, "
          f"two at once {side_by_side * 1000:.3f} ms (slowest of the two)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

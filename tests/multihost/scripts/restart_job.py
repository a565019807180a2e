"""A torch.distributed (gloo) loop that checkpoints and resumes, for the restart tests: every
step all-reduces (rank + 1 + step) and adds it to a running total; rank 0 saves (step, total)
every --every steps, and a started attempt resumes from it. --kill picks the rank that SIGKILLs
itself once, at --kill-at ("worker": the last rank, on the last host; "leader": rank 0), as the
OOM killer or a crashed library would end it; --kill-again (the same rank, at the next
attempt's start, before its first step) is a crash during the restart itself. --slow-end: on
the attempt that fails, rank 0 ignores SIGTERM and stays (a rank stuck in its teardown), so the
failed attempt ends only with the entrypoint's SIGKILL. Each rank writes result-<rank>.json.

The collectives: torch.distributed (gloo) under torchrun, mpi4py under mpirun, none for one
process. For benchmarks/crash_cost.py, the victim writes the time it dies into killed-once
and rank 0 the time of a resumed attempt's first step into resumed-first-step."""
import time

BEGAN = time.time()  # before the imports: the benchmark splits a restart's start-up by these

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402

import torch  # noqa: E402

IMPORTED = time.time()

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--every", type=int, default=10)
parser.add_argument("--kill", choices=("none", "worker", "leader"), default="none")
parser.add_argument("--kill-at", type=int, default=25)
parser.add_argument("--kill-again", type=int, default=0)
parser.add_argument("--slow-end", type=int, default=0)
parser.add_argument("--step-s", type=float, default=0.05)
args = parser.parse_args()

model = os.environ["SM_MODEL_DIR"]
attempt = int(os.environ.get("BYOC_ATTEMPT", "0"))
checkpoint = os.path.join(model, "checkpoint.json")
if "OMPI_COMM_WORLD_SIZE" in os.environ:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()

    def all_reduce(t):
        t[0] = comm.allreduce(t.item())

    def broadcast(values):
        values[:] = comm.bcast(values, root=0)

    def barrier():
        comm.Barrier()
elif "WORLD_SIZE" in os.environ:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    all_reduce, broadcast, barrier = dist.all_reduce, lambda values: dist.broadcast_object_list(values, src=0), dist.barrier
else:
    rank, size = 0, 1
    all_reduce, broadcast, barrier = (lambda t: None), (lambda values: None), (lambda: None)
victim = size - 1 if args.kill == "worker" else 0


def once(name: str) -> bool:
    """True the first time any rank of any attempt asks for `name` (the model folder is shared)."""
    try:
        os.close(os.open(os.path.join(model, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


state = [0, 0.0]
if rank == 0 and os.path.exists(checkpoint):
    with open(checkpoint) as f:
        saved = json.load(f)
    state = [saved["step"], saved["total"]]
broadcast(state)
start, total = state
print(f"[restart_job] rank {rank} attempt {attempt} of world {size} resumes at step {start} (began {BEGAN:.3f}, "
      f"imported {IMPORTED:.3f}, joined {time.time():.3f})", flush=True)
if args.kill_again and args.kill != "none" and rank == victim and attempt == 2 and once("killed-again"):
    os.kill(os.getpid(), signal.SIGKILL)
if args.slow_end and rank == 0 and attempt == 1:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
for step in range(start, args.steps):
    if args.kill != "none" and rank == victim and step == args.kill_at and once("killed-once"):
        with open(os.path.join(model, "killed-once"), "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    t = torch.tensor([float(rank + 1 + step)])
    try:
        all_reduce(t)
    except Exception:
        if args.slow_end and rank == 0 and attempt == 1:
            time.sleep(600)  # stuck: only SIGKILL ends it
        raise
    total += t.item()
    if rank == 0:
        print(f"[restart_job] step {step + 1} total {total:g}", flush=True)
        if start and step == start:
            with open(os.path.join(model, "resumed-first-step"), "w") as f:
                f.write(repr(time.time()))
    if (step + 1) % args.every == 0 and rank == 0:
        with open(checkpoint + ".partial", "w") as f:
            json.dump({"step": step + 1, "total": total}, f)
        os.replace(checkpoint + ".partial", checkpoint)
    time.sleep(args.step_s)
barrier()
with open(os.path.join(model, f"result-{rank}.json"), "w") as f:
    json.dump({"rank": rank, "size": size, "host": socket.gethostname(), "attempt": attempt, "resumed_at": start,
               "total": total}, f)

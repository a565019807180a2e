"""The deep health check's ranks (BYOC_HEALTH_CHECK=deep): all-reduces across this host's GPUs
and across every host, timed, before the training starts. The one module of rank/ that imports
torch: it runs only when the check was asked for, never in the training's ranks.

    python allreduce_check.py --backend nccl|gloo --mib M --warmup W --iterations I
                              --timeout-s T --result FILE

One process per GPU (per CPU rank with gloo), each with torch.distributed's env:// rendezvous
variables: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ranks
numbered host by host. Measures, as nccl-tests' all_reduce_perf does (float32 sum, warm-up
iterations, then the mean time of the timed ones): an all-reduce within each host's group of
ranks, then, with more than one host, one across every rank. The time is the slowest rank's.
Every host's own figure is gathered to every rank, so every host judges every host alike.

Local rank 0 writes the timings (JSON) to FILE; the bandwidths and the verdict are the
entrypoint's (entrypoint/decide/health.py). Nothing is printed on success. The whole check ends
within T seconds: the rendezvous and every collective have that timeout, and a watchdog
(faulthandler) prints every thread's stack and exits 1 after it, whatever hangs.

Run by path, like record_errors.py: the standard library and torch only.
"""

import argparse
import datetime
import faulthandler
import json
import os
import sys
import time


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("nccl", "gloo"), required=True)
    parser.add_argument("--mib", type=int, required=True, help="the all-reduce's size, MiB of float32")
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--iterations", type=int, required=True)
    parser.add_argument("--timeout-s", type=float, required=True)
    parser.add_argument("--result", required=True, help="where local rank 0 writes the timings (JSON)")
    return parser.parse_args(argv)


def sync(torch, device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_all_reduce(torch, dist, group, ranks, elements, device, args):
    """{"ranks", "seconds" (the slowest rank's mean per all-reduce), "correct"} of one group."""
    tensor = torch.ones(elements, dtype=torch.float32, device=device)
    dist.all_reduce(tensor, group=group)  # also the first, untimed one
    correct = bool(tensor[0].item() == ranks and tensor[-1].item() == ranks)
    tensor.zero_()  # sums of zeros: the timed values stay finite however many iterations
    for _ in range(args.warmup):
        dist.all_reduce(tensor, group=group)
    sync(torch, device)
    dist.all_reduce(torch.zeros(1, device=device), group=group)  # every rank starts the clock together
    sync(torch, device)
    started = time.perf_counter()
    for _ in range(args.iterations):
        dist.all_reduce(tensor, group=group)
    sync(torch, device)
    figures = torch.tensor([(time.perf_counter() - started) / args.iterations, 0.0 if correct else 1.0],
                           dtype=torch.float64, device=device)
    dist.all_reduce(figures, op=dist.ReduceOp.MAX, group=group)  # the slowest rank; any wrong sum
    return {"ranks": ranks, "seconds": figures[0].item(), "correct": figures[1].item() == 0.0}


def gather_hosts(torch, dist, figure, hosts, device):
    """Every host's own figure, in host order, on every rank (rank 0 of each host's group)."""
    mine = torch.tensor([figure["seconds"], 1.0 if figure["correct"] else 0.0], dtype=torch.float64, device=device)
    every = [torch.zeros(2, dtype=torch.float64, device=device) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    per_host = len(every) // hosts
    return [{"ranks": figure["ranks"], "seconds": every[h * per_host][0].item(), "correct": every[h * per_host][1].item() == 1.0}
            for h in range(hosts)]


def measure(torch, dist, args, device):
    world = dist.get_world_size()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    hosts = world // local
    elements = args.mib * 1024 * 1024 // 4
    host_group = None
    if hosts > 1:
        host_group, _ = dist.new_subgroups(group_size=local)
    result = {"backend": args.backend, "bytes": elements * 4, "hosts": hosts, "ranks_per_host": local,
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "host": None, "job": None}
    if local > 1 or hosts == 1:  # one rank alone (scripts/gpu_smoke.py on one GPU): timed, never judged
        mine = time_all_reduce(torch, dist, host_group, local, elements, device, args)
        result["host"] = gather_hosts(torch, dist, mine, hosts, device)
    if hosts > 1:
        result["job"] = time_all_reduce(torch, dist, None, world, elements, device, args)
    return result


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    faulthandler.dump_traceback_later(args.timeout_s, exit=True)
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cpu")
    if args.backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=args.timeout_s),
                            **({"device_id": device} if args.backend == "nccl" else {}))
    try:
        result = measure(torch, dist, args, device)
    finally:
        dist.destroy_process_group()
    if local_rank == 0:
        partial = args.result + ".partial"
        with open(partial, "w", encoding="utf-8") as f:
            json.dump(result, f)
        os.replace(partial, args.result)
    faulthandler.cancel_dump_traceback_later()
    return 0


if __name__ == "__main__":
    sys.exit(main())

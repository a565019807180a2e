"""What a user's script does that a forked rank once got wrong (issue 62), on every host: it
sets the spawn start method under __main__ and runs a child that way, logs only through a
MemoryHandler to a file (flushed by logging's exit handler), and draws unseeded random numbers
from torch, numpy and Python. Each rank writes what it drew, per attempt; on attempt 1 the last
rank fails after that (--fail-first-attempt), so the job restarts and draws again."""
import argparse
import json
import logging
import logging.handlers
import multiprocessing
import os
import random
import sys

import numpy
import torch
import torch.distributed as dist


def child(path):
    with open(path, "w") as f:
        f.write(multiprocessing.current_process().name)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-first-attempt", type=int, default=0)
    args = parser.parse_args()
    multiprocessing.set_start_method("spawn")
    model = os.environ["SM_MODEL_DIR"]
    rank, attempt = int(os.environ["RANK"]), os.environ.get("BYOC_ATTEMPT", "1")
    log = logging.getLogger("train")
    log.setLevel(logging.INFO)
    log.addHandler(logging.handlers.MemoryHandler(100, target=logging.FileHandler(
        os.path.join(model, f"log-{rank}-{attempt}.txt"))))
    dist.init_process_group("gloo")
    spawned = os.path.join(model, f"child-{rank}-{attempt}.txt")
    p = multiprocessing.Process(target=child, args=(spawned,))
    p.start()
    p.join()
    drew = {"rank": rank, "attempt": attempt, "torch_seed": torch.initial_seed(), "torch": torch.rand(1).item(),
            "numpy": float(numpy.random.rand()), "random": random.random(),
            "start_method": multiprocessing.get_start_method(), "process": multiprocessing.current_process().name}
    with open(os.path.join(model, f"drew-{rank}-{attempt}.json"), "w") as f:
        json.dump(drew, f)
    for i in range(5):
        log.info("line %d", i)
    dist.barrier()
    if args.fail_first_attempt and attempt == "1" and rank == dist.get_world_size() - 1:
        sys.exit(3)
    dist.destroy_process_group()

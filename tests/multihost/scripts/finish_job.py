"""A rank that only shapes the job's end (tests/multihost/test_faults.py, the finishing tests):
--fifo leaves a FIFO named like a rank's figures file in its host's report folder (reading it
blocked the entrypoint for good), --linger-on HOST keeps that host's rank --linger-s seconds
longer (its host finishes last). No collectives: mpirun and torchrun alike."""
import argparse
import os
import time

parser = argparse.ArgumentParser()
parser.add_argument("--fifo", type=int, default=0)
parser.add_argument("--linger-on", default="")
parser.add_argument("--linger-s", type=float, default=0.0)
args = parser.parse_args()
rank = os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("RANK", "0")
if args.fifo:
    os.mkfifo(os.path.join(os.environ["BYOC_REPORT_DIR"], f"rank-9{rank}.json"))
with open(os.path.join(os.environ["SM_MODEL_DIR"], f"done-{rank}"), "w") as f:
    f.write(os.environ["SM_CURRENT_HOST"])
if os.environ["SM_CURRENT_HOST"] == args.linger_on:
    time.sleep(args.linger_s)

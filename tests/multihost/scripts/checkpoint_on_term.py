"""A rank that checkpoints on SIGTERM (as scripts on training plans are told to) and would
otherwise run for a minute."""
import os
import signal
import sys
import time


def on_term(_signum, _frame):
    rank = os.environ.get("RANK") or os.environ.get("OMPI_COMM_WORLD_RANK", "0")
    name = f"checkpointed-{os.environ['SM_CURRENT_HOST']}-{rank}"
    with open(os.path.join(os.environ["SM_MODEL_DIR"], name), "w") as f:
        f.write(str(time.time()))
    sys.exit(0)


signal.signal(signal.SIGTERM, on_term)
print("training", flush=True)
time.sleep(60)
print("finished", flush=True)

"""1 host: records how the hyperparameters arrived (argv, SM_HP_*), reads the train channel,
saves a model into SM_MODEL_DIR and other output into SM_OUTPUT_DATA_DIR."""
import argparse
import json
import os
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int)
parser.add_argument("--lr", type=float)
parser.add_argument("--run-name")
parser.add_argument("--layers", type=json.loads)
parser.add_argument("--optimizer", type=json.loads)
parser.add_argument("--shuffle", type=json.loads)
args = parser.parse_args()

train_dir = os.environ["SM_CHANNEL_TRAIN"]
numbers = [int(n) for name in sorted(os.listdir(train_dir)) for n in open(os.path.join(train_dir, name)).read().split()]
model = {
    "argv": sys.argv[1:],
    "parsed": vars(args),
    "sm_hp": {k: v for k, v in os.environ.items() if k.startswith("SM_HP_")},
    "channel_dir": train_dir,
    "channel_sum": sum(numbers),
    "weights": [args.lr * n for n in numbers],
}
with open(os.path.join(os.environ["SM_MODEL_DIR"], "model.json"), "w") as f:
    json.dump(model, f)
os.makedirs(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "eval"), exist_ok=True)
with open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "eval", "metrics.json"), "w") as f:
    json.dump({"epochs_run": args.epochs, "records": len(numbers)}, f)
print(f"[test-script] trained on {len(numbers)} records, sum {sum(numbers)}", flush=True)

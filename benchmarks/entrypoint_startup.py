"""Wall time of `python -m entrypoint train` vs the sagemaker-training toolkit's `train`
on the same /opt/ml tree with a trivial script, alternating runs; prints both medians and the
ratio. Goal: ours <= 0.6x the toolkit's.

    .venv/bin/python benchmarks/entrypoint_startup.py [--runs 15]

The toolkit waits for every host name to resolve (up to 15 minutes); SM_STUDIO_LOCAL_MODE=true
skips that wait, so it is set for the toolkit here (an advantage to the toolkit).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def write_tree(root: Path) -> None:
    for sub in ("input/config", "input/data/train", "code", "model", "output"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "input/config/resourceconfig.json").write_text(json.dumps({"current_host": "algo-1", "hosts": ["algo-1"]}))
    hps = {"sagemaker_program": "train.py", "epochs": 3, "lr": 0.1, "layers": [8, 8]}
    (root / "input/config/hyperparameters.json").write_text(json.dumps({k: json.dumps(v) for k, v in hps.items()}))
    (root / "input/config/inputdataconfig.json").write_text(json.dumps({"train": {"TrainingInputMode": "File"}}))
    (root / "code/train.py").write_text("import sys\nprint('trivial script', sys.argv[1:])\n")


def timed(argv, env) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "ml"
        write_tree(root)
        base = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "SAGEMAKER_"))}
        base["SAGEMAKER_BASE_DIR"] = str(root)
        ours_env = {**base, "PYTHONPATH": str(REPO)}
        theirs_env = {**base, "SM_STUDIO_LOCAL_MODE": "true"}
        ours_cmd = [sys.executable, "-m", "entrypoint", "train"]
        theirs_cmd = [str(BIN / "train")]
        timed(ours_cmd, ours_env), timed(theirs_cmd, theirs_env)  # warm the page cache
        ours, theirs = [], []
        for _ in range(args.runs):
            ours.append(timed(ours_cmd, ours_env))
            theirs.append(timed(theirs_cmd, theirs_env))
    o, t = statistics.median(ours), statistics.median(theirs)
    print(f"runs: {args.runs} each, alternating")
    print(f"ours    (python -m entrypoint train): median {o * 1000:.0f} ms")
    print(f"toolkit (train, sagemaker-training):  median {t * 1000:.0f} ms")
    print(f"ratio ours/toolkit: {o / t:.2f} (goal <= 0.60)")


if __name__ == "__main__":
    main()

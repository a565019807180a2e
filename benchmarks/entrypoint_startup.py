"""Wall time of `python -m entrypoint train` vs the sagemaker-training toolkit's `train`
on the same /opt/ml tree with a trivial script, alternating runs; prints both medians and the
ratio. Goal: ours <= 0.25x the toolkit's.

    .venv/bin/python benchmarks/entrypoint_startup.py [--runs 15] [--compiled]

Ours runs from this checkout. Where PYTHONDONTWRITEBYTECODE is set (the images set it, and so
may your shell) there is no __pycache__ here, so every run compiles our modules from source
(~30 ms); the toolkit's were byte-compiled by pip. --compiled runs ours from a byte-compiled
copy instead, as in the image (pip install byte-compiles entrypoint/ all the same).

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
GOAL = 0.25  # ours / toolkit


def write_tree(root: Path) -> None:
    for sub in ("input/config", "input/data/train", "code", "model", "output"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "input/config/resourceconfig.json").write_text(json.dumps({"current_host": "algo-1", "hosts": ["algo-1"]}))
    hps = {"sagemaker_program": "train.py", "epochs": 3, "lr": 0.1, "layers": [8, 8]}
    (root / "input/config/hyperparameters.json").write_text(json.dumps({k: json.dumps(v) for k, v in hps.items()}))
    (root / "input/config/inputdataconfig.json").write_text(json.dumps({"train": {"TrainingInputMode": "File"}}))
    (root / "code/train.py").write_text("import sys\nprint('trivial script', sys.argv[1:])\n")


def timed(argv, env, cwd) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--compiled", action="store_true", help="run ours from a byte-compiled copy, as in the image")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "ml"
        write_tree(root)
        base = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "SAGEMAKER_"))}
        base["SAGEMAKER_BASE_DIR"] = str(root)
        src = REPO
        if args.compiled:
            import compileall
            import shutil

            src = Path(tmp) / "src"
            shutil.copytree(REPO / "entrypoint", src / "entrypoint", ignore=shutil.ignore_patterns("__pycache__"))
            compileall.compile_dir(str(src / "entrypoint"), quiet=1)
        ours_env = {**base, "PYTHONPATH": str(src)}
        theirs_env = {**base, "SM_STUDIO_LOCAL_MODE": "true"}
        ours_cmd = [sys.executable, "-m", "entrypoint", "train"]
        theirs_cmd = [str(BIN / "train")]
        # Not from this checkout's root: `python -m` puts the working directory first on sys.path.
        cwd = str(root)
        timed(ours_cmd, ours_env, cwd), timed(theirs_cmd, theirs_env, cwd)  # warm the page cache
        ours, theirs = [], []
        for _ in range(args.runs):
            ours.append(timed(ours_cmd, ours_env, cwd))
            theirs.append(timed(theirs_cmd, theirs_env, cwd))
    o, t = statistics.median(ours), statistics.median(theirs)
    print(f"runs: {args.runs} each, alternating; ours {'byte-compiled' if args.compiled else 'from this checkout'}; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"ours    (python -m entrypoint train): median {o * 1000:.0f} ms")
    print(f"toolkit (train, sagemaker-training):  median {t * 1000:.0f} ms")
    print(f"ratio ours/toolkit: {o / t:.2f} (goal <= {GOAL:.2f}: {'met' if o / t <= GOAL else 'NOT met'})")


if __name__ == "__main__":
    main()

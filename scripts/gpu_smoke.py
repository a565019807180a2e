#!/usr/bin/env python3
"""GPU smoke test of the GPU image's Python layer, runnable with or without Docker.

    python scripts/gpu_smoke.py [--json]                       # in the GPU image, or in a venv
    docker run --gpus all --entrypoint python3 <gpu image> /opt/ml/code/gpu_smoke.py

Where it runs matters less than what it checks, on a machine with an NVIDIA GPU:
1. the stack is the one docker/versions.env pins (torch) and the one torch's own metadata
   asks for (NCCL: nvidia-nccl-cu13's version; CUDA against GPU_BASE_IMAGE's), using the
   same rules as the image build (docker/scripts/check-torch-cuda.py);
2. a 1-GPU DDP training step (backend nccl) and an NCCL all-reduce, in a child process with
   NCCL_DEBUG=INFO, whose log gives the NCCL version actually loaded and the network (net
   plugin) NCCL chose;
3. when Horovod is importable: built with NCCL ops, and a Horovod all-reduce on the GPU;
4. with --deep: the entrypoint's deep health check (BYOC_HEALTH_CHECK=deep; the same code:
   entrypoint/decide/health.py, entrypoint/run/health_check.py, entrypoint/rank/allreduce_check.py),
   an nccl all-reduce across every GPU here, its bus bandwidth judged against the expected figure
   of --instance-type (default: $SM_CURRENT_INSTANCE_TYPE). On one GPU it times the nccl path
   (nothing crosses a link: not judged). Needs only this repository's tree and torch with CUDA:
       python3 scripts/gpu_smoke.py --deep --instance-type ml.p5.48xlarge --json

A venv with the same pins, on a machine with network access:
    python3 -m venv /tmp/gpu && /tmp/gpu/bin/pip install "torch==<GPU_TORCH_VERSION>" "numpy==<GPU_PYPI_NUMPY_VERSION>"
(Horovod with NCCL ops: HOROVOD_GPU_OPERATIONS=NCCL bash scripts/build-horovod-wheel.sh).

Exit status: 0 all checks passed; 1 a check failed (each failure printed); 2 no GPU here
(nothing was tested, and it says so). Prints a summary; --json prints it as JSON.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NO_GPU = 2

# Runs in a child process so NCCL's log (stderr) can be read; one rank, world size 1.
CHILD = r"""
import json, os, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
torch.cuda.set_device(0)
dist.init_process_group("nccl")
model = DDP(torch.nn.Linear(32, 4).cuda(), device_ids=[0])
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(64, 32, device="cuda"), torch.randn(64, 4, device="cuda")
before = torch.nn.functional.mse_loss(model(x), y)
before.backward(); opt.step(); opt.zero_grad()
after = torch.nn.functional.mse_loss(model(x), y)
t = torch.full((1024,), 2.0, device="cuda")
dist.all_reduce(t)
torch.cuda.synchronize()
out = {"ddp_loss_before": before.item(), "ddp_loss_after": after.item(), "allreduce": t[0].item(),
       "gpu": torch.cuda.get_device_name(0), "nccl": ".".join(map(str, torch.cuda.nccl.version()))}
dist.destroy_process_group()
try:
    import horovod.torch as hvd
except ImportError:
    out["horovod"] = None
else:
    hvd.init()
    h = hvd.allreduce(torch.ones(8, device="cuda"), op=hvd.Sum)
    out["horovod"] = {"nccl_built": bool(hvd.nccl_built()), "allreduce": h[0].item(), "size": hvd.size()}
print("GPU-SMOKE " + json.dumps(out), flush=True)
"""


def load_check_torch_cuda():
    spec = importlib.util.spec_from_file_location("check_torch_cuda", REPO / "docker" / "scripts" / "check-torch-cuda.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_versions(path: Path = REPO / "docker" / "versions.env") -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            pins[key] = value
    return pins


# --- reading NCCL's log (pure) ----------------------------------------------------------


def parse_nccl_log(text: str) -> dict[str, str | None]:
    """The NCCL version NCCL itself printed and the network it chose ("Socket", "IB",
    "AWS Libfabric", ...), and the net plugin it loaded or failed to, from NCCL_DEBUG=INFO."""
    version = re.search(r"NCCL version (\d+\.\d+\.\d+)", text)
    network = re.search(r"Using network (.+?)\s*$", text, re.MULTILINE)
    plugin = re.search(r"NET/Plugin: (.+?)\s*$", text, re.MULTILINE)
    return {"nccl_version": version.group(1) if version else None,
            "network": network.group(1) if network else None,
            "net_plugin": plugin.group(1) if plugin else None}


def decide_problems(result: dict, expected: dict) -> list[str]:
    """Every way the child's result falls short of what the image promises."""
    problems = []
    if result.get("allreduce") != 2.0:
        problems.append(f"NCCL all-reduce of 2.0 over 1 rank gave {result.get('allreduce')}")
    if not result.get("ddp_loss_after", float("inf")) < result.get("ddp_loss_before", float("-inf")):
        problems.append(f"the DDP step did not lower the loss ({result.get('ddp_loss_before')} -> {result.get('ddp_loss_after')})")
    if expected.get("nccl") and result.get("nccl") != expected["nccl"]:
        problems.append(f"torch loaded NCCL {result.get('nccl')}, its metadata requires {expected['nccl']}")
    logged = result.get("log", {}).get("nccl_version")
    if expected.get("nccl") and logged and logged != expected["nccl"]:
        problems.append(f"NCCL's own log says {logged}, torch's metadata requires {expected['nccl']}")
    horovod = result.get("horovod")
    if horovod is not None:
        if not horovod.get("nccl_built"):
            problems.append("Horovod is not built with NCCL ops (HOROVOD_GPU_OPERATIONS=NCCL)")
        if horovod.get("allreduce") != horovod.get("size"):
            problems.append(f"Horovod all-reduce of ones gave {horovod.get('allreduce')} over {horovod.get('size')} rank(s)")
    return problems


# --- acting ---------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_child(timeout_s: float) -> tuple[dict | None, str]:
    env = {**os.environ, "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port()), "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=timeout_s)
    log = done.stdout + done.stderr
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("GPU-SMOKE ")), None)
    if done.returncode != 0 or line is None:
        return None, log
    return json.loads(line.split(" ", 1)[1]), log


def run_deep_check(gpus: int, args) -> tuple[dict, list[str]]:
    """The entrypoint's deep health check on this host's GPUs, as BYOC_HEALTH_CHECK=deep runs it:
    its figures (nccl-tests' bus bandwidth) and verdict, and the problems found."""
    import tempfile

    sys.path.insert(0, str(REPO))
    from entrypoint.decide import health
    from entrypoint.settings import DEFAULTS
    from entrypoint.run.health_check import run_check
    from entrypoint.run.stop import Stop
    from entrypoint.run.supervise import RunHooks

    settings = DEFAULTS._replace(health_check="deep", health_check_port=_free_port(), health_check_mib=args.mib,
                                 health_check_timeout_s=args.timeout)
    with tempfile.TemporaryDirectory() as folder:
        check = health.build_health_check(settings, sys.executable, args.instance_type, ("this-host",), "this-host",
                                          "127.0.0.1", gpus, True, folder)
        run, timings = run_check(check, dict(os.environ), Stop(), RunHooks(settings))
    if run.exit_code != 0 or timings is None:
        return {"exit_code": run.exit_code}, [f"the deep health check's {gpus} nccl rank(s) ended with exit code "
                                              f"{run.exit_code} and no figures (their output is above)"]
    figures = health.build_figures(check, timings)
    failure = health.build_health_failure(check, figures, "this-host")
    deep = {"gpus": gpus, "device": timings.get("device"), "mib": check.mib, "instance_type": check.instance_type,
            "expected_host_gbps": check.expected_host_gbps, "timings": timings,
            "figures": [health.describe_figure(f, check.min_fraction) for f in figures]}
    return deep, [failure.strip()] if failure else []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds for the GPU child process")
    parser.add_argument("--deep", action="store_true", help="also the deep health check's all-reduce across every GPU")
    parser.add_argument("--instance-type", default=os.environ.get("SM_CURRENT_INSTANCE_TYPE", ""),
                        help="whose expected bus bandwidth --deep judges against (entrypoint/decide/health.py)")
    parser.add_argument("--mib", type=int, default=1024, help="--deep's all-reduce size (BYOC_HEALTH_CHECK_MIB)")
    args = parser.parse_args(argv)

    import torch  # here, not at the top: --help works without torch

    if not torch.cuda.is_available():
        print(f"gpu-smoke: no NVIDIA GPU visible to torch {torch.__version__} (torch.cuda.is_available() is False,"
              f" torch.version.cuda is {torch.version.cuda}): nothing was tested", file=sys.stderr)
        return NO_GPU

    from importlib import metadata

    check = load_check_torch_cuda()
    pins = load_versions()
    problems = []
    torch_version = torch.__version__.split("+")[0]
    if torch_version != pins["GPU_TORCH_VERSION"]:
        problems.append(f"torch {torch.__version__}, versions.env pins {pins['GPU_TORCH_VERSION']}")
    expected = {}
    try:
        dist_name, expected["nccl"] = check.decide_nccl_pin(metadata.requires("torch") or [])
    except ValueError as exc:
        problems.append(str(exc))
    cuda_problem = check.decide_cuda_problem(torch.version.cuda, check.parse_base_image_cuda(pins["GPU_BASE_IMAGE"]))
    if cuda_problem:
        problems.append(cuda_problem)

    result, log = run_child(args.timeout)
    if result is None:
        problems.append("the DDP/NCCL child process failed:\n" + log[-4000:])
        result = {}
    else:
        result["log"] = parse_nccl_log(log)
        problems += decide_problems(result, expected)
    if args.deep:
        result["deep_health_check"], deep_problems = run_deep_check(torch.cuda.device_count(), args)
        problems += deep_problems
    summary = {"torch": torch.__version__, "cuda": torch.version.cuda, "expected_nccl": expected.get("nccl"),
               **result, "problems": problems}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        for key, value in summary.items():
            if key != "problems":
                print(f"{key:16s} {value}")
        for problem in problems:
            print(f"FAILED: {problem}")
        print("gpu-smoke: " + ("OK" if not problems else f"{len(problems)} problem(s)"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

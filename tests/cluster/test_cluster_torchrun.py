"""torchrun with c10d rendezvous and a gloo allreduce across emulated hosts (slow: imports torch)."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from localcluster import EmulatedCluster
from support.public import copy_package_for_everyone

PYTHON = sys.executable
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ALLREDUCE = textwrap.dedent(
    """
    import json, os, socket, sys
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    record = {"rank": dist.get_rank(), "world": dist.get_world_size(), "host": socket.gethostname(), "sum": t.item()}
    print(json.dumps(record), flush=True)
    if len(sys.argv) > 1:
        with open(os.path.join(sys.argv[1], f"rank-{dist.get_rank()}.json"), "w") as f:
            json.dump(record, f)
    dist.destroy_process_group()
    """
)


def torchrun(python, script, *args):
    return [
        python, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
        "--rdzv_backend", "c10d", "--rdzv_endpoint", "algo-1:29500", "--rdzv_id", "localcluster-test",
        script, *args,
    ]  # fmt: skip


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="emulated hosts need root (namespaces, veths, mounts)")
def test_torchrun_gloo_allreduce_across_two_hosts(tmp_path):
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    with EmulatedCluster(["algo-1", "algo-2"]) as cluster:
        result = cluster.run_all(torchrun(PYTHON, str(script), "/opt/ml/model"), timeout=120)
        assert result.ok, {h: r.output for h, r in result.results.items()}
        ranks = sorted(
            (json.load(open(os.path.join(cluster.model_dir, name))) for name in os.listdir(cluster.model_dir)),
            key=lambda r: r["rank"],
        )
    assert ranks == [
        {"rank": 0, "world": 2, "host": "algo-1", "sum": 3.0},
        {"rank": 1, "world": 2, "host": "algo-2", "sum": 3.0},
    ]


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("setpriv"), reason="needs setpriv to run as an unprivileged user")
def test_torchrun_without_root_through_a_user_namespace():
    """An unprivileged user runs the CLI: it re-executes itself in a user namespace and the job
    still runs across two hosts. The system python runs it, because this venv's interpreter
    may sit under /root, where an unprivileged user cannot reach it."""
    system_python = "/usr/bin/python3"
    site_packages = next(p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix))
    probe = subprocess.run([system_python, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True)
    if probe.returncode != 0 or probe.stdout.strip() != str(sys.version_info[:2]):
        pytest.skip(f"{system_python} is not Python {sys.version_info[0]}.{sys.version_info[1]} like this venv")
    reach = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", system_python, "-c",
                            "import os, sys; sys.exit(0 if os.access(sys.argv[1], os.R_OK | os.X_OK) else 1)",
                            site_packages], capture_output=True, text=True, cwd="/")
    if reach.returncode != 0:
        pytest.skip(f"this venv's site-packages ({site_packages}) is out of an unprivileged user's reach (a checkout "
                    "under /root, mode 0700): torch cannot be imported as uid 65534. The check without torch, "
                    "test_cluster_cli.py::test_without_root_and_without_user_namespaces_the_message_says_what_is_needed, "
                    "still runs; this one runs from a checkout outside /root (CI's)")
    public = copy_package_for_everyone("localcluster")
    try:
        script = os.path.join(public, "allreduce.py")
        with open(script, "w") as f:
            f.write(ALLREDUCE)
        os.chmod(script, 0o644)
        pythonpath = f"{public}:{site_packages}"
        done = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--",
             system_python, "-m", "localcluster", "run", "--hosts", "2", "--env", f"PYTHONPATH={pythonpath}",
             "--", *torchrun(system_python, script)],
            capture_output=True, text=True, timeout=180, cwd="/",
            env={"PATH": os.environ["PATH"], "PYTHONPATH": pythonpath},
        )  # fmt: skip
    finally:
        shutil.rmtree(public)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert out.startswith("localcluster: not root: running inside a user namespace")
    records = [json.loads(line.split("] ", 1)[1]) for line in out.splitlines() if "] {\"rank\"" in line]
    assert [(r["rank"], r["host"], r["sum"]) for r in sorted(records, key=lambda r: r["rank"])] == [
        (0, "algo-1", 3.0),
        (1, "algo-2", 3.0),
    ]

"""Real SageMaker Python SDK v3 jobs (sagemaker==3.27.0, the sdk-v3 extra, in .venv-sdk-v3):
`ModelTrainer(training_mode=Mode.LOCAL_CONTAINER, training_image=<this tree's image>,
compute=Compute(instance_type="local_cpu", instance_count=N))` with Torchrun(), MPI() and
no distributed config, and command=. v3 bypasses our ENTRYPOINT with `bash -c …/sm_train.sh`; the
image's bash-env.sh hands that to our launcher, which runs the job (or, for what it does not
understand and with BYOC_SDK_V3_DRIVERS=sdk, gives it back to v3's drivers). Each rank writes
what it got into /opt/ml/model, which v3 collects from every host into
compressed_artifacts/model.tar.gz, and every host's output/ (failure, report) into
output.tar.gz. Each job costs ~10-25 s: cases share a job where one job shows them.

Run: BYOC_IMAGE_TAG=byoc-training:<tag> .venv/bin/python -m pytest tests/localmode/test_v3_jobs.py -s
(-s prints each job's train() time.)"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from localmode.v3_harness import V3JobResult, probe_sdk_v3_python, run_build_image, run_v3_job
from support.docker import decide_image_tag

pytestmark = pytest.mark.slow

MPI_SCRIPT = r'''
import argparse, json, os, socket
from mpi4py import MPI

parser = argparse.ArgumentParser()
parser.add_argument("--fail_rank", type=int, default=-1)
parser.add_argument("--tag", default="")
args, _ = parser.parse_known_args()

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
host = json.load(open("/opt/ml/input/config/resourceconfig.json"))["current_host"]
if rank == args.fail_rank:
    raise RuntimeError(f"boom-v3-mpi from rank {rank} on {host}")

def read(path):
    try:
        return open(path).read()
    except OSError:
        return None

total = comm.allreduce(rank + 1, op=MPI.SUM)
record = {
    "rank": rank, "size": size, "host": host, "allreduce": total, "hosts": comm.allgather(host),
    "address": socket.gethostbyname(host), "tag": args.tag, "option": os.environ.get("BYOC_V3_OPTION"),
    "mca": os.environ.get("OMPI_MCA_btl_base_verbose"),
    "authorized_keys": read("/root/.ssh/authorized_keys"),
    "host_key": read("/dev/shm/byoc-sshd/ssh_host_ed25519_key.pub"),
}
with open(f"/opt/ml/model/mpi-rank-{rank}.json", "w") as f:
    json.dump(record, f)
'''

TORCH_SCRIPT = r'''
import argparse, json, os, sys
import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--fail_rank", type=int, default=-1)
args, _ = parser.parse_known_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):  # optimizer steps: the job report's rank figures
    opt.zero_grad(); model(torch.ones(2, 4)).sum().backward(); opt.step()
host = json.load(open("/opt/ml/input/config/resourceconfig.json"))["current_host"]
if rank == args.fail_rank:
    raise RuntimeError(f"boom-v3-torchrun from rank {rank} on {host}")
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
with open(f"/opt/ml/model/torchrun-rank-{rank}.json", "w") as f:
    json.dump({"rank": rank, "world": world, "host": host, "allreduce": t.item(),
               "master": os.environ.get("MASTER_ADDR"), "argv": sys.argv[1:]}, f)
dist.destroy_process_group()
'''

PLAIN_SCRIPT = r'''
import json, os, sys
if os.environ.get("SM_HP_FAIL"):
    raise ValueError("boom-v3-plain")
import byoc_req_probe  # from the wheel SourceCode(requirements=…) names
with open("/opt/ml/model/plain.json", "w") as f:
    json.dump({"argv": sys.argv[1:], "host": os.environ.get("SM_CURRENT_HOST"),
               "hps": json.loads(os.environ.get("SM_HPS", "{}")), "cwd": os.getcwd(),
               "master": os.environ.get("SM_MASTER_ADDR"), "entry": os.environ.get("SM_ENTRY_SCRIPT"),
               "req": byoc_req_probe.VALUE, "path": os.environ.get("PATH"),
               "run": os.environ.get("BYOC_SDK_V3_RUN")}, f)
print("plain script done")
'''

HANG_SCRIPT = r'''
import time
print("about to wait", flush=True)
def wait_for_a_peer_that_never_comes():
    time.sleep(3600)
wait_for_a_peer_that_never_comes()
'''


def build_wheel(name: str, value: str) -> bytes:
    """A pure-Python wheel with one module (no network, no build backend: pip installs it from
    the file a requirements line names)."""
    import io
    import zipfile

    dist = f"{name}-1.0.dist-info"
    files = {f"{name}.py": f"VALUE = {value!r}\n", f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{dist}/RECORD"] = "".join(f"{n},,\n" for n in [*files, f"{dist}/RECORD"])
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for n, text in files.items():
            z.writestr(n, text)
    return buffer.getvalue()


WHEEL = "byoc_req_probe-1.0-py3-none-any.whl"


@pytest.fixture(scope="module")
def image() -> str:
    if probe_sdk_v3_python() is None:
        pytest.fail(".venv-sdk-v3 is missing: scripts/bootstrap.sh installs the SDK v3 pin (pyproject's sdk-v3 extra)")
    if shutil.which("docker") is None and os.geteuid() != 0:
        pytest.skip("no docker CLI and not root: scripts/docker-engine.sh cannot install the engine")
    return run_build_image(decide_image_tag(os.environ))


def _report(name: str, result: V3JobResult) -> None:
    print(f"\n{name}: train() {result.train_seconds} s, driver {result.wall_seconds} s, containers {result.exit_codes}")


def _failure(result: V3JobResult) -> str:
    """output/failure as output.tar.gz holds it (the last host's: each leads with the job's root cause)."""
    path = result.output_file("failure")
    assert path.exists(), result.log_tail()
    return path.read_text()


def test_one_host_plain_script_with_requirements_runs_through_our_launcher(image, tmp_path):
    result = run_v3_job(tmp_path, image, {"train.py": PLAIN_SCRIPT, "requirements.txt": f"./{WHEEL}\n",
                                          WHEEL: build_wheel("byoc_req_probe", "installed")},
                        hyperparameters={"epochs": 3, "name": "a b"}, requirements="requirements.txt")
    _report("1 host, no distributed, requirements", result)
    assert result.ok, result.log_tail()
    got = result.model_json("plain.json")
    # what v3's basic script driver gives the script: its arguments, SM_*, the code channel as cwd
    assert got["argv"] == ["--epochs", "3", "--name", "a b"] and got["hps"] == {"epochs": 3, "name": "a b"}
    assert (got["host"], got["master"], got["entry"]) == ("algo-1", "algo-1", "train.py")
    assert got["cwd"] == "/opt/ml/input/data/code" and got["req"] == "installed"
    # our launcher ran it: no v3 driver, no shim on PATH
    assert got["run"] == "launched" and "sdk-v3" not in got["path"]
    assert "SDK v3 ModelTrainer job (no distributed, train.py): launched by this image" in result.log
    assert "Running Basic Script driver" not in result.log and "byoc sdk-v3" not in result.log
    assert result.output_file("data/report/report.json").exists()


def test_one_host_plain_script_that_raises_names_the_exception(image, tmp_path):
    result = run_v3_job(tmp_path, image, {"train.py": PLAIN_SCRIPT}, hyperparameters={"fail": 1})
    assert result.failed and not result.timed_out, result.log_tail()
    assert _failure(result).startswith("ValueError: boom-v3-plain"), result.log_tail()


def test_two_hosts_torchrun_allreduce_and_the_report_covers_both_hosts(image, tmp_path):
    result = run_v3_job(tmp_path, image, {"train.py": TORCH_SCRIPT}, instance_count=2,
                        distributed={"kind": "torchrun", "process_count_per_node": 1}, hyperparameters={"x": 1})
    _report("2 hosts, Torchrun()", result)
    assert result.ok, result.log_tail()
    ranks = result.model_jsons("torchrun-rank-")
    assert [(r["rank"], r["world"], r["host"]) for r in ranks] == [(0, 2, "algo-1"), (1, 2, "algo-2")]
    assert {r["allreduce"] for r in ranks} == {3.0} and {tuple(r["argv"]) for r in ranks} == {("--x", "1")}
    assert "[entrypoint] algo-1: running torchrun on 2 host(s)" in result.log
    report = json.loads(result.output_file("data/report/report.json").read_text())
    assert {h: v["status"] for h, v in report["hosts"].items()} == {"algo-1": "reported", "algo-2": "reported"}
    assert sorted((r["rank"], r["host"]) for r in report["ranks"]) == [(0, "algo-1"), (1, "algo-2")]


def test_two_hosts_mpi_allreduce_through_our_mpirun(image, tmp_path):
    result = run_v3_job(tmp_path, image, {"train.py": MPI_SCRIPT}, instance_count=2,
                        distributed={"kind": "mpi", "process_count_per_node": 2,
                                     "mpi_additional_options": ["-x", "BYOC_V3_OPTION=seen"]},
                        hyperparameters={"tag": "v3"})
    _report("2 hosts x 2, MPI()", result)
    assert result.ok, result.log_tail()
    ranks = result.model_jsons("mpi-rank-")
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3], result.log_tail()
    assert {r["size"] for r in ranks} == {4} and {r["allreduce"] for r in ranks} == {1 + 2 + 3 + 4}
    assert sorted(r["host"] for r in ranks) == ["algo-1", "algo-1", "algo-2", "algo-2"]
    assert {r["tag"] for r in ranks} == {"v3"}
    # our mpirun, with v3's options after ours; v3's driver and its shims never ran
    assert {r["option"] for r in ranks} == {"seen"} and "byoc sdk-v3 mpirun" not in result.log
    assert "Running MPI Driver" not in result.log


def test_an_mpi_job_carrying_np_runs_through_our_launcher_and_a_disagreeing_np_is_refused(image, tmp_path):
    """v3 3.27's own MPI driver passes one host's process count, so v3 users add the job's
    total as mpi_additional_options=["-np", N]. N = hosts x processes per host (here 2 x 1):
    our launcher runs the job (its note, its mpirun line, its report), with v3's other options
    reaching mpirun as sagemaker_mpi_custom_mpi_options do. Any other N is refused on every
    host, naming both numbers: never v3's own drivers."""
    options = ["-np", "2", "-x", "BYOC_V3_OPTION=seen", "--mca", "btl_base_verbose", "0"]
    result = run_v3_job(tmp_path / "agrees", image, {"train.py": MPI_SCRIPT}, instance_count=2,
                        distributed={"kind": "mpi", "mpi_additional_options": options}, hyperparameters={"tag": "np"})
    _report("2 hosts, MPI() with -np 2", result)
    assert result.ok, result.log_tail()
    assert "SDK v3 ModelTrainer job (MPI(), train.py): launched by this image" in result.log
    assert "[entrypoint] algo-1: running mpirun on 2 host(s)" in result.log
    assert "SDK v3's own drivers run this job" not in result.log and "Running MPI Driver" not in result.log
    ranks = result.model_jsons("mpi-rank-")
    assert [(r["rank"], r["size"], r["host"]) for r in ranks] == [(0, 2, "algo-1"), (1, 2, "algo-2")], result.log_tail()
    assert {(r["option"], r["mca"], r["tag"]) for r in ranks} == {("seen", "0", "np")}
    report = json.loads(result.output_file("data/report/report.json").read_text())
    assert {h: v["status"] for h, v in report["hosts"].items()} == {"algo-1": "reported", "algo-2": "reported"}

    refused = run_v3_job(tmp_path / "disagrees", image, {"train.py": MPI_SCRIPT}, instance_count=2,
                         distributed={"kind": "mpi", "mpi_additional_options": ["-np", "3"]})
    _report("2 hosts, MPI() with -np 3", refused)
    assert refused.failed and not refused.timed_out, refused.log_tail()
    # Every host that reads the definition refuses it (exit code 2). Compose stops the others
    # once the first has exited (--abort-on-container-exit): a host still starting then ends 143,
    # having run nothing (a loaded fresh root saw algo-1 stopped before its first line; another,
    # stopped while it read the definition: the read, walked away from, still said its refusal
    # after the stop, and the outcome is the stop's).
    codes = refused.exit_codes
    assert sorted(codes) == ["algo-1", "algo-2"] and 2 in codes.values(), refused.log_tail()
    for host, code in codes.items():
        said = refused.container_logs.get(host, "").splitlines()  # the container's own: compose's may miss it
        refusal = [i for i, line in enumerate(said) if "The training job definition is invalid: SDK v3's MPI" in line]
        stop = [i for i, line in enumerate(said) if "received SIGTERM during start-up" in line]
        if code == 2:
            assert refusal and not stop, (host, said[-20:])
        else:
            assert code == 143 and stop and all(i > stop[0] for i in refusal), (host, code, said[-20:])
            assert any("Stopped by SIGTERM during start-up, before the training processes started" in line
                       for line in said), (host, said[-20:])
        assert not any("running mpirun" in line or "launched by this image" in line for line in said), said
    failure = _failure(refused)
    assert failure.startswith("The training job definition is invalid: SDK v3's MPI.mpi_additional_options sets "
                              "-np 3, but this job runs 2 processes: 2 host(s) x 1 per host"), failure
    assert "or make it 2." in failure, failure
    assert "SDK v3's own drivers run this job" not in refused.log and "Running MPI Driver" not in refused.log
    assert refused.model_jsons("mpi-rank-") == []



@pytest.mark.parametrize(
    "kind, script, program",
    [("mpi", MPI_SCRIPT, "boom-v3-mpi"), ("torchrun", TORCH_SCRIPT, "boom-v3-torchrun")],
)
def test_a_rank_that_raises_is_named_with_its_exception_in_the_failure(image, tmp_path, kind, script, program):
    """The last rank (on algo-2) raises before the collective its peers are blocked in."""
    per_host = 2 if kind == "mpi" else 1
    failing = 2 * per_host - 1
    result = run_v3_job(tmp_path, image, {"train.py": script}, instance_count=2,
                        distributed={"kind": kind, "process_count_per_node": per_host},
                        hyperparameters={"fail_rank": failing}, timeout_s=240)
    _report(f"2 hosts, {kind}, rank raises", result)
    assert result.failed and not result.timed_out, result.log_tail()
    head = _failure(result)[:1024]
    assert head.startswith(f"RuntimeError: {program} from rank {failing} on algo-2"), head
    assert f"First failure: rank {failing} on host algo-2" in head, head


def test_a_command_runs_under_our_launcher_and_its_failure_is_the_jobs(image, tmp_path):
    ok = run_v3_job(tmp_path / "ok", image, {"train.py": PLAIN_SCRIPT, WHEEL: build_wheel("byoc_req_probe", "x")},
                    command=f"pip install -q ./{WHEEL} && python train.py --from command",
                    hyperparameters={"ignored": 1})
    assert ok.ok, ok.log_tail()
    assert ok.model_json("plain.json")["argv"] == ["--from", "command"]  # v3 passes no hyperparameters here
    assert "SDK v3 ModelTrainer job (command=): launched by this image" in ok.log
    bad = run_v3_job(tmp_path / "bad", image, {"train.py": PLAIN_SCRIPT}, command="python train.py",
                     hyperparameters={"fail": 1})
    assert bad.failed, bad.log_tail()
    assert "ValueError: boom-v3-plain" in _failure(bad), bad.log_tail()


def test_a_silent_script_is_caught_as_a_hang_naming_where_it_waits(image, tmp_path):
    result = run_v3_job(tmp_path, image, {"train.py": HANG_SCRIPT}, environment={"BYOC_HANG_TIMEOUT_S": "5"},
                        timeout_s=240)
    _report("1 host, hang", result)
    assert result.failed and not result.timed_out, result.log_tail()
    assert result.exit_codes == {"algo-1": 124}, result.log_tail()
    head = _failure(result).splitlines()[0]
    assert head.startswith("Hang: no output from any process on algo-1 for 5 s (BYOC_HANG_TIMEOUT_S)"), head
    assert "in wait_for_a_peer_that_never_comes (" in head, head


def test_byoc_sdk_v3_drivers_sdk_gives_an_mpi_job_back_to_v3s_drivers(image, tmp_path):
    """The fallback: v3's own MPI driver, with the image's corrections (the mpirun shim, the
    per-job SSH trust) that only its drivers need."""
    result = run_v3_job(tmp_path, image, {"train.py": MPI_SCRIPT}, instance_count=2,
                        distributed={"kind": "mpi", "process_count_per_node": 2}, hyperparameters={"tag": "v3"},
                        environment={"BYOC_SDK_V3_DRIVERS": "sdk"})
    _report("2 hosts x 2, MPI(), v3's own drivers", result)
    assert result.ok, result.log_tail()
    assert result.log.count("SDK v3's own drivers run this job: BYOC_SDK_V3_DRIVERS=sdk") == 2  # a line per host
    assert "Running MPI Driver" in result.log
    ranks = result.model_jsons("mpi-rank-")
    # hosts x processes per host: v3 alone would start 2 ranks, both on algo-1
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3], result.log_tail()
    assert {r["size"] for r in ranks} == {4} and {r["allreduce"] for r in ranks} == {1 + 2 + 3 + 4}
    assert "byoc sdk-v3 mpirun: -np 2 -> 4" in result.log
    assert "byoc sdk-v3 mpirun: btl_tcp_if_include ethwe -> eth0" in result.log

    # The trust: the leader authorized algo-2's own host key from algo-2's address, and only
    # that; algo-2 authorized the leader's, from the leader's address.
    by_host = {r["host"]: r for r in ranks}
    leader, worker = by_host["algo-1"], by_host["algo-2"]
    assert leader["host_key"] != worker["host_key"]

    def line(peer):
        return f'from="{peer["address"]}",restrict {" ".join(peer["host_key"].split()[:2])} byoc-sdk-v3:{peer["host"]}'

    assert leader["authorized_keys"].splitlines() == [line(worker)]
    assert worker["authorized_keys"].splitlines() == [line(leader)]


def test_a_definition_we_do_not_map_runs_on_v3s_drivers_with_one_line_why(image, tmp_path):
    result = run_v3_job(tmp_path, image, {"train.py": TORCH_SCRIPT}, instance_count=1,
                        distributed={"kind": "mpi", "process_count_per_node": 1,
                                     "mpi_additional_options": ["--hostfile", "/dev/null"]})
    lines = [line for line in result.log.splitlines() if "SDK v3's own drivers run this job" in line]
    assert len(lines) == 1 and "--hostfile" in lines[0], result.log_tail()
    assert "Running MPI Driver" in result.log


def test_command_train_hands_the_job_to_our_launcher(image, tmp_path):
    """`SourceCode(command="train")`: v3's sm_train.sh runs `train` (the image's
    /usr/local/byoc/bin/train, i.e. our entrypoint) instead of its drivers; our launcher reads
    the launcher keys from hyperparameters.json, copies the code from v3's `code` channel and
    runs torchrun on both hosts (the ethwe interface falling back to eth0)."""
    result = run_v3_job(
        tmp_path, image, {"train.py": TORCH_SCRIPT}, instance_count=2, command="train",
        hyperparameters={"sagemaker_program": "train.py", "sagemaker_submit_directory": "/opt/ml/input/data/code",
                         "sagemaker_torch_distributed_enabled": True, "epochs": 2},
    )
    _report("2 hosts, command=train (our launcher, torchrun)", result)
    assert result.ok, result.log_tail()
    assert "[entrypoint] algo-1: running torchrun on 2 host(s)" in result.log
    assert 'network interface "ethwe" does not exist here; using eth0' in result.log
    ranks = result.model_jsons("torchrun-rank-")
    assert [(r["rank"], r["world"], r["host"], r["allreduce"]) for r in ranks] == [(0, 2, "algo-1", 3.0), (1, 2, "algo-2", 3.0)]
    # the user's hyperparameters reach the script as arguments, from hyperparameters.json
    assert {tuple(r["argv"]) for r in ranks} == {("--epochs", "2")}


RESTART_JOB = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "multihost", "scripts",
                           "restart_job.py")


def test_two_hosts_torchrun_whose_worker_rank_is_killed_once_restarts_on_both_and_succeeds(image, tmp_path):
    """The SDK v2 case (test_sdk_v2.py) through ModelTrainer and Torchrun(): attempt 2 on both
    hosts, resumed from the step-20 checkpoint, the total of a run that never failed; the job
    report counts the attempts."""
    with open(RESTART_JOB) as f:
        source = f.read()
    result = run_v3_job(tmp_path, image, {"train.py": source}, instance_count=2,
                        distributed={"kind": "torchrun", "process_count_per_node": 1},
                        hyperparameters={"kill": "worker", "steps": 60, "every": 10},
                        environment={"BYOC_MAX_RESTARTS": "1"})
    _report("2 hosts, Torchrun(), a rank killed once", result)
    assert result.ok, result.log_tail()
    ranks = result.model_jsons("result-")
    assert [(r["rank"], r["size"], r["attempt"], r["resumed_at"]) for r in ranks] == [(0, 2, 2, 20), (1, 2, 2, 20)]
    assert {r["total"] for r in ranks} == {60 * 3 + 2 * 60 * 59 / 2}
    report = json.loads(result.output_file("data/report/report.json").read_text())
    assert report["job"]["attempts"] == 2 and report["restarts"][0]["attempt"] == 1, report["job"]


SILENT_DDP = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "multihost", "scripts",
                          "silent_ddp.py")


def test_two_hosts_torchrun_a_script_that_writes_nothing_ends(image, tmp_path):
    """Forked ranks (the default) hung after such a script's last line (issue 62)."""
    with open(SILENT_DDP) as f:
        result = run_v3_job(tmp_path, image, {"train.py": f.read()}, instance_count=2,
                            distributed={"kind": "torchrun", "process_count_per_node": 1})
    _report("2 hosts, Torchrun(), a silent script", result)
    assert result.ok, result.log_tail()
    ranks = result.model_jsons("rank-")
    assert [(r["rank"], r["world"], r["steps"]) for r in ranks] == [(0, 2, 50), (1, 2, 50)]

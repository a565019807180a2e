"""The image's side of SDK v3 (no SDK here): /etc/byoc/bash-env.sh, the per-job SSH trust
exchange and the `mpirun` shim, in containers of the image laid out as v3's local mode lays
them out (tests/localmode/v3_harness.start_v3_hosts). The same, driven by the real SDK:
test_v3_jobs.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import time

import pytest

from localmode.v3_harness import run_build_image, start_v3_hosts, stop_v3_hosts
from support.docker import decide_image_tag

pytestmark = pytest.mark.slow

MPI4PY_PROBE = (
    "import json, sys; from mpi4py import MPI; c = MPI.COMM_WORLD; "
    "host = json.load(open('/opt/ml/input/config/resourceconfig.json'))['current_host']; "
    # One write per record: with PYTHONUNBUFFERED, print() writes its pieces separately and
    # mpirun can interleave two ranks' pieces on one line ("RANK RANK {...}").
    "sys.stdout.write('RANK ' + json.dumps({'rank': c.Get_rank(), 'size': c.Get_size(), "
    "'sum': c.allreduce(c.Get_rank() + 1), 'host': host}) + chr(10))"
)
RANK_RECORD = re.compile(r"RANK (\{[^{}]*\})")


def _v3_mpirun_argv(mpirun: str, per_host: int, interface: str) -> list[str]:
    """What v3 3.27.0's mpi_driver.py runs for 2 hosts (mpi_utils.get_mpirun_command)."""
    return [
        mpirun, "--host", f"algo-1:{per_host},algo-2:{per_host}", "-np", str(per_host), "--allow-run-as-root",
        "-mca", "btl_tcp_if_include", interface, "-mca", "oob_tcp_if_include", interface,
        "-mca", "plm_rsh_no_tree_spawn", "1", "-mca", "pml", "ob1", "-mca", "btl", "^openib",
        "-mca", "orte_abort_on_non_zero_status", "1", "-mca", "btl_vader_single_copy_mechanism", "none",
        "-x", f"NCCL_SOCKET_IFNAME={interface}", "-x", "LD_LIBRARY_PATH", "-x", "PATH",
        # v3 passes its driver's sys.executable; Open MPI would resolve a bare `python3` past
        # the venv's symlink to /usr/bin/python3, which has no mpi4py.
        "/opt/venv/bin/python3", "-m", "mpi4py", "-c", MPI4PY_PROBE,
    ]


def _ranks(stdout: str) -> list[dict]:
    """Every rank's record, wherever it lands in mpirun's merged output."""
    return sorted((json.loads(m) for m in RANK_RECORD.findall(stdout)), key=lambda r: r["rank"])


@pytest.fixture(scope="module")
def image() -> str:
    if shutil.which("docker") is None and os.geteuid() != 0:
        pytest.skip("no docker CLI and not root: scripts/docker-engine.sh cannot install the engine")
    return run_build_image(decide_image_tag(os.environ))


@pytest.fixture(scope="module")
def job(image, tmp_path_factory):
    """3 hosts of a v3 MPI job and a stranger on their network, trust exchanged."""
    hosts = start_v3_hosts(tmp_path_factory.mktemp("v3hosts"), image, ["algo-1", "algo-2", "algo-3"])
    try:
        deadline = time.monotonic() + 60
        want = {"algo-1": 2, "algo-2": 1, "algo-3": 1}
        while True:
            counts = {h: hosts.exec(h, "sh", "-c", "cat /root/.ssh/authorized_keys 2>/dev/null").stdout.count("byoc-sdk-v3:")
                      for h in want}
            if counts == want:
                break
            assert time.monotonic() < deadline, f"trust never exchanged: {counts}\n" + "\n".join(hosts.logs(h) for h in want)
            time.sleep(0.5)
        yield hosts
    finally:
        stop_v3_hosts(hosts)


def _public_key(hosts, host: str) -> str:
    return " ".join(hosts.exec(host, "cat", "/dev/shm/byoc-sshd/ssh_host_ed25519_key.pub").stdout.split()[:2])


def _address(hosts, host: str) -> str:
    return hosts.exec("stranger", "getent", "hosts", host).stdout.split()[0]


def test_each_host_authorizes_exactly_the_peers_it_needs_by_key_and_address(job):
    keys = {h: _public_key(job, h) for h in ("algo-1", "algo-2", "algo-3")}
    assert len(set(keys.values())) == 3, "every container has its own key"
    # In the order the workers' sshd answered: the set is what matters.
    leader = sorted(job.exec("algo-1", "cat", "/root/.ssh/authorized_keys").stdout.splitlines())
    assert leader == [
        f'from="{_address(job, h)}",restrict {keys[h]} byoc-sdk-v3:{h}' for h in ("algo-2", "algo-3")
    ]
    for worker in ("algo-2", "algo-3"):
        assert job.exec(worker, "cat", "/root/.ssh/authorized_keys").stdout.splitlines() == [
            f'from="{_address(job, "algo-1")}",restrict {keys["algo-1"]} byoc-sdk-v3:algo-1'
        ]
    # root's client key is the container's host key: what the peers learnt by ssh-keyscan
    assert job.exec("algo-2", "readlink", "/root/.ssh/id_ed25519").stdout.strip() == "/dev/shm/byoc-sshd/ssh_host_ed25519_key"


def test_v3s_own_connections_work_both_ways(job):
    """paramiko from the leader as v3's mpi_utils._can_connect does it; `ssh` from a worker to
    the leader as its _write_file_to_host does; `ssh` from the leader to a worker (mpirun)."""
    can_connect = (
        "import paramiko, sys\n"
        "with paramiko.SSHClient() as c:\n"
        "    c.load_system_host_keys(); c.set_missing_host_key_policy(paramiko.AutoAddPolicy())\n"
        "    c.connect(sys.argv[1], port=22); print('connected')\n"
    )
    for worker in ("algo-2", "algo-3"):
        done = job.exec("algo-1", "python3", "-c", can_connect, worker)
        assert done.stdout.strip() == "connected", done.stderr
        assert job.exec(worker, "ssh", "algo-1", "touch", f"/tmp/ready.{worker}").returncode == 0
        assert job.exec("algo-1", "ssh", worker, "cat", "/opt/ml/input/config/resourceconfig.json").returncode == 0
    assert job.exec("algo-1", "ls", "/tmp/ready.algo-2", "/tmp/ready.algo-3").returncode == 0


def test_nothing_else_gets_in(job):
    # workers do not log in to each other (v3's mpirun has plm_rsh_no_tree_spawn 1)
    assert job.exec("algo-2", "ssh", "algo-3", "true").returncode == 255
    # a container of the same image on the job's network: its own key is nobody's
    assert job.exec("stranger", "ssh", "-i", "/dev/shm/byoc-sshd/ssh_host_ed25519_key", "algo-1", "true").returncode == 255
    # the worker's private key, stolen: refused from any address but the worker's
    stolen = job.exec("algo-2", "cat", "/dev/shm/byoc-sshd/ssh_host_ed25519_key").stdout
    assert job.exec("stranger", "sh", "-c", 'umask 077; printf %s "$0" > /tmp/stolen', stolen).returncode == 0
    done = job.exec("stranger", "ssh", "-i", "/tmp/stolen", "algo-1", "true")
    assert done.returncode == 255 and "Permission denied" in done.stderr
    # and no password way in
    done = job.exec("stranger", "ssh", "-o", "PreferredAuthentications=password", "-o", "BatchMode=no",
                    "-o", "NumberOfPasswordPrompts=0", "algo-1", "true")
    assert done.returncode == 255


def test_the_helper_runs_once_per_container_and_says_what_it_authorized(job):
    for _ in range(3):
        assert job.exec("algo-2", "bash", "-c", "bash -c :").returncode == 0
    log = job.logs("algo-2")
    assert log.count("byoc sdk-v3 ssh:") == 1, log
    assert "algo-1 may log in as root from" in log
    # not a v3 MPI job: no helper, PATH as built
    assert job.logs("stranger") == ""
    assert job.exec("stranger", "bash", "-c", "command -v mpirun").stdout.strip() == "/usr/bin/mpirun"


def test_a_peer_that_never_comes_is_named_in_the_log(image, tmp_path):
    hosts = start_v3_hosts(tmp_path, image, ["algo-1", "algo-2"], started=["algo-1"], stranger=False,
                           container_env={"BYOC_PEER_WAIT_TIMEOUT_S": "3"})
    try:
        deadline = time.monotonic() + 60
        while "did not serve SSH" not in hosts.logs("algo-1"):
            assert time.monotonic() < deadline, hosts.logs("algo-1")
            time.sleep(0.5)
        assert "byoc sdk-v3 ssh: algo-2 did not serve SSH within 3 s (BYOC_PEER_WAIT_TIMEOUT_S)" in hosts.logs("algo-1")
        assert hosts.exec("algo-1", "cat", "/root/.ssh/authorized_keys").returncode != 0  # nobody authorized
    finally:
        stop_v3_hosts(hosts)


def test_v3s_mpirun_bugs_bite_and_the_shim_corrects_them(job):
    """Through the image's real mpirun: v3's "ethwe" kills the job before any rank starts, and
    its `-np <per host>` leaves algo-2 without a rank; v3's own argv through the shim (what a
    v3 MPI job's PATH finds first) runs every rank on both hosts."""
    real = job.exec("algo-1", "sh", "-c", "command -v mpirun").stdout.strip()  # dash: no BASH_ENV
    assert real == "/usr/bin/mpirun"
    assert job.exec("algo-1", "bash", "-c", "command -v mpirun").stdout.strip() == "/usr/local/byoc/sdk-v3/bin/mpirun"

    ethwe = job.exec("algo-1", *_v3_mpirun_argv(real, 2, "ethwe"))
    assert ethwe.returncode != 0 and _ranks(ethwe.stdout) == [], ethwe.stdout + ethwe.stderr

    short = job.exec("algo-1", *_v3_mpirun_argv(real, 2, "eth0"))
    assert short.returncode == 0, short.stderr
    assert [(r["size"], r["host"]) for r in _ranks(short.stdout)] == [(2, "algo-1"), (2, "algo-1")]

    fixed = job.exec("algo-1", "bash", "-c", '"$@"', "bash", *_v3_mpirun_argv("mpirun", 2, "ethwe"))
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    ranks = _ranks(fixed.stdout)
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert {r["size"] for r in ranks} == {4} and {r["sum"] for r in ranks} == {1 + 2 + 3 + 4}
    assert sorted(r["host"] for r in ranks) == ["algo-1", "algo-1", "algo-2", "algo-2"]
    assert "byoc sdk-v3 mpirun: -np 2 -> 4" in fixed.stderr
    assert "oob_tcp_if_include ethwe -> eth0" in fixed.stderr


@pytest.mark.parametrize("user", ["root", "65534:65534"])
def test_bash_env_is_quiet_and_never_fails(image, user, tmp_path):
    """Under `bash -eu`, as root (keys made) and as nobody (nothing to do), in a plain
    container and in a v3 MPI job's: the caller sees only its own output and status."""
    hosts = start_v3_hosts(tmp_path, image, ["algo-1", "algo-2"], stranger=True)
    try:
        for host in ("algo-1", "stranger"):
            for argv in (["bash", "-euc", "echo ok; exit 3"],
                         ["env", "-i", "BASH_ENV=/etc/byoc/bash-env.sh", "/bin/bash", "-euc", "echo ok; exit 3"]):
                done = hosts.exec(host, "setpriv", "--reuid", user.split(":")[0], "--regid", user.split(":")[-1],
                                  "--clear-groups", *argv) if user != "root" else hosts.exec(host, *argv)
                assert (done.returncode, done.stdout, done.stderr) == (3, "ok\n", ""), (host, argv)
            leaked = hosts.exec(host, "bash", "-c", "compgen -v _byoc_ || true").stdout
            assert leaked == ""
    finally:
        stop_v3_hosts(hosts)


# Every command bash-env.sh may run outside bash itself; each spy logs its name, then runs the real one.
BASH_ENV_COMMANDS = ("mkdir", "grep", "ssh-keygen", "python3", "id", "cat", "sed")
SPY = "#!/bin/sh\necho \"${0##*/}\" >>/tmp/spy/log\nPATH=${PATH#/tmp/spy:} exec \"${0##*/}\" \"$@\"\n"


def test_bash_env_forks_nothing_once_the_job_is_decided(image, tmp_path):
    """Every bash of the job reads it, so after the first bash of a container (which decides
    and inherits) it must run builtins only: a fork and exec per bash was measured at ~7 ms under
    load. Spies on PATH catch any command it runs; the control (decisions not inherited) shows
    they do catch. Quoted timings: benchmarks/bash_env.py."""
    hosts = start_v3_hosts(tmp_path, image, ["algo-1", "algo-2"], stranger=False)
    try:
        make_spies = "mkdir -p /tmp/spy && for c in " + " ".join(BASH_ENV_COMMANDS) + \
            "; do printf '%s' \"$SPY\" >/tmp/spy/$c; chmod +x /tmp/spy/$c; done"
        assert hosts.exec("algo-1", "env", f"SPY={SPY}", "sh", "-c", make_spies).returncode == 0
        spied = 'export PATH=/tmp/spy:$PATH; : >/tmp/spy/log; bash -c :; bash -c :; echo "$(</tmp/spy/log)"'
        inherited = hosts.exec("algo-1", "bash", "-c", spied)
        fresh = hosts.exec("algo-1", "bash", "-c", spied.replace("bash -c :", "env -u BYOC_SDK_V3_MPI "
                                                                  "-u BYOC_SDK_V3_TORCHRUN bash -c :"))
        assert (inherited.returncode, inherited.stdout.split()) == (0, []), inherited
        assert fresh.stdout.split().count("grep") == 4, fresh
    finally:
        stop_v3_hosts(hosts)

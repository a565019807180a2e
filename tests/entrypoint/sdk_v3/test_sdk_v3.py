"""SageMaker SDK v3 support: the SSH trust exchange for its MPI driver and the `mpirun` shim
that corrects its process count and interface (entrypoint/sdk_v3/peer_trust.py, sdk_v3/mpirun.py).
The images and real v3 jobs: tests/localmode/test_v3_*.py."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from entrypoint.sdk_v3 import mpirun as shim
from entrypoint.sdk_v3 import peer_trust as v3ssh
from entrypoint.job.config import parse_resource_config
from support.ports import free_port

REPO = Path(__file__).resolve().parents[3]

# The argv SDK v3 3.27.0's mpi_utils.get_mpirun_command builds for 2 hosts, 2 processes each,
# in local mode (resourceconfig.json says "ethwe"), up to the program.
V3_ARGV_2x2 = [
    "--host", "algo-1:2,algo-2:2", "-np", "2", "--allow-run-as-root", "--tag-output",
    "-mca", "btl_tcp_if_include", "ethwe", "-mca", "oob_tcp_if_include", "ethwe",
    "-mca", "plm_rsh_no_tree_spawn", "1", "-mca", "pml", "ob1", "-mca", "btl", "^openib",
    "-mca", "orte_abort_on_non_zero_status", "1", "-mca", "btl_vader_single_copy_mechanism", "none",
    "-mca", "plm_rsh_num_concurrent", "2", "-x", "NCCL_SOCKET_IFNAME=ethwe",
    "-x", "LD_LIBRARY_PATH", "-x", "PATH", "/opt/venv/bin/python3", "-m", "mpi4py", "train.py",
]


def _resource(current: str, hosts: list[str]):
    return parse_resource_config({"current_host": current, "hosts": hosts})


# --- who trusts whom ---------------------------------------------------------------------------


def test_leader_trusts_every_worker_and_a_worker_only_the_leader():
    hosts = ["algo-1", "algo-10", "algo-2"]  # SageMaker's order; the leader is the first
    assert v3ssh.decide_trusted_peers(_resource("algo-1", hosts)) == ("algo-10", "algo-2")
    assert v3ssh.decide_trusted_peers(_resource("algo-2", hosts)) == ("algo-1",)
    assert v3ssh.decide_trusted_peers(_resource("algo-10", hosts)) == ("algo-1",)
    assert v3ssh.decide_trusted_peers(_resource("algo-1", ["algo-1"])) == ()


def test_authorized_keys_bind_each_key_to_its_host_addresses_and_keep_other_lines():
    existing = "ssh-ed25519 AAAAmine admin@laptop\nfrom=\"10.0.0.9\",restrict ssh-ed25519 AAAAold byoc-sdk-v3:algo-2\n"
    text = v3ssh.build_authorized_keys(
        existing, {"algo-2": ("ssh-ed25519 AAAAtwo", ["172.18.0.3"]), "algo-3": ("ssh-ed25519 AAAAthree", ["172.18.0.4"])}
    )
    assert text.splitlines() == [
        "ssh-ed25519 AAAAmine admin@laptop",
        'from="172.18.0.3",restrict ssh-ed25519 AAAAtwo byoc-sdk-v3:algo-2',
        'from="172.18.0.4",restrict ssh-ed25519 AAAAthree byoc-sdk-v3:algo-3',
    ]


@pytest.mark.parametrize("raw, want", [(None, 300.0), ("", 300.0), ("12", 12.0), ("soon", 300.0), ("-1", 300.0)])
def test_peer_wait_timeout_never_fails_the_background_helper(raw, want):
    assert v3ssh.parse_peer_wait_timeout({} if raw is None else {"BYOC_PEER_WAIT_TIMEOUT_S": raw}) == want


# --- the mpirun shim -----------------------------------------------------------------------------


def test_v3_argv_gets_every_hosts_processes_and_an_interface_that_exists():
    fixed, notes = shim.decide_mpirun_argv(V3_ARGV_2x2, ("eth0", "lo"))
    assert fixed[:4] == ["--host", "algo-1:2,algo-2:2", "-np", "4"]
    assert fixed[fixed.index("btl_tcp_if_include") + 1] == "eth0"
    assert fixed[fixed.index("oob_tcp_if_include") + 1] == "eth0"
    assert "NCCL_SOCKET_IFNAME=eth0" in fixed and "NCCL_SOCKET_IFNAME=ethwe" not in fixed
    # Nothing else moved.
    assert len(fixed) == len(V3_ARGV_2x2)
    assert [a for a, b in zip(fixed, V3_ARGV_2x2) if a != b] == ["4", "eth0", "eth0", "NCCL_SOCKET_IFNAME=eth0"]
    assert len(notes) == 4 and notes[0].startswith("-np 2 -> 4")


def test_v3_argv_with_one_process_per_host():
    argv = ["--host", "algo-1,algo-2,algo-3", "-np", "1", "python3", "x.py"]
    assert shim.decide_mpirun_argv(argv, ("eth0",))[0][:4] == ["--host", "algo-1,algo-2,algo-3", "-np", "3"]


@pytest.mark.parametrize(
    "argv",
    [
        # our own launcher: -np is already hosts x processes
        ["--host", "algo-1:2,algo-2:2", "-np", "4", "-mca", "btl_tcp_if_include", "eth0", "python3", "x.py"],
        # one host: v3's count is right
        ["--host", "algo-1:2", "-np", "2", "python3", "x.py"],
        # a deliberate smaller count that is not v3's shape
        ["--host", "algo-1:4,algo-2:4", "-np", "3", "python3", "x.py"],
        # uneven slots: not what v3 writes
        ["--host", "algo-1:2,algo-2:1", "-np", "2", "python3", "x.py"],
        # interface lists, exclusions and CIDRs are the user's
        ["-np", "2", "-mca", "btl_tcp_if_include", "ethwe,eth0", "-mca", "oob_tcp_if_include", "10.0.0.0/8",
         "-mca", "btl_tcp_if_exclude", "^lo", "python3", "x.py"],
    ],
)
def test_anything_but_v3s_shape_passes_through(argv):
    assert shim.decide_mpirun_argv(argv, ("eth0", "lo")) == (argv, [])


def test_an_interface_that_exists_is_kept_and_the_fallback_is_the_launchers():
    argv = ["-mca", "btl_tcp_if_include", "ethwe", "python3"]
    assert shim.decide_mpirun_argv(argv, ("ethwe", "lo"))[0] == argv
    # no eth0: the first non-loopback interface, as entrypoint.decide.topology.choose_interface decides
    assert shim.decide_mpirun_argv(argv, ("ens5", "lo"))[0] == ["-mca", "btl_tcp_if_include", "ens5", "python3"]


def test_the_real_mpirun_is_the_first_on_path_that_is_not_the_shim(tmp_path):
    for folder in ("shim", "a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "mpirun").write_text("#!/bin/sh\n")
        (tmp_path / folder / "mpirun").chmod(0o755)
    path = os.pathsep.join(str(tmp_path / f) for f in ("shim", "a", "b"))
    found = shim.probe_real_program("mpirun", path, str(tmp_path / "shim"), lambda p: os.access(p, os.X_OK))
    assert found == str(tmp_path / "a" / "mpirun")
    assert shim.probe_real_program("mpirun", str(tmp_path / "shim"), str(tmp_path / "shim"), os.path.exists) is None


# --- real files and a real sshd ------------------------------------------------------------------


def _paths(tmp_path) -> v3ssh.V3SshPaths:
    key = tmp_path / "etc" / "ssh_host_ed25519_key"
    key.parent.mkdir()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return v3ssh.V3SshPaths(resource_config=str(tmp_path / "rc.json"), host_key=str(key), ssh_dir=str(tmp_path / "root-ssh"))


def test_root_logs_in_with_this_containers_host_key(tmp_path):
    paths = _paths(tmp_path)
    v3ssh.write_identity(paths)
    v3ssh.write_identity(paths)  # twice: bash-env.sh may start it again in a re-run container
    assert os.path.realpath(paths.identity) == paths.host_key
    assert os.stat(paths.ssh_dir).st_mode & 0o777 == 0o700
    v3ssh.write_authorized_keys(paths, "x\n")
    assert os.stat(paths.authorized_keys).st_mode & 0o777 == 0o600


needs_sshd = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists("/usr/sbin/sshd") or shutil.which("unshare") is None,
    reason="a real sshd needs root, /usr/sbin/sshd and unshare (its /run/sshd goes on a private tmpfs)",
)


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def _start_sshd(tmp_path, name: str, host_key: str, authorized_keys: str, port: int) -> subprocess.Popen:
    config = tmp_path / f"{name}_sshd_config"
    # Where "localhost" is ::1 first (a Debian container's /etc/hosts), ssh-keyscan localhost
    # tries only that address: listen there too when the machine has it.
    listen = "ListenAddress 127.0.0.1\n" + ("ListenAddress ::1\n" if _ipv6_loopback() else "")
    config.write_text(
        f"{listen}Port {port}\nHostKey {host_key}\nAuthorizedKeysFile {authorized_keys}\n"
        "PidFile none\nPermitRootLogin prohibit-password\nPasswordAuthentication no\nUsePAM no\nUseDNS no\n"
        "StrictModes no\nLogLevel ERROR\n"
    )
    # sshd needs /run/sshd; a private mount namespace with its own /run leaves the machine's alone.
    proc = subprocess.Popen(
        ["unshare", "--mount", "sh", "-c",
         'mount -t tmpfs tmpfs /run && mkdir /run/sshd && exec /usr/sbin/sshd -D -e -f "$0"', str(config)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 10
    while not _connects(port):
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline, "sshd never listened"
        time.sleep(0.05)
    return proc


def _connects(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _ssh(identity: str, port: int, bind: str = "127.0.0.1") -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ssh", "-F", "/dev/null", "-i", identity, "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
         "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", f"BindAddress={bind}",
         "-p", str(port), "root@127.0.0.1", "echo", "in"],
        capture_output=True, text=True, timeout=30,
    )


@needs_sshd
def test_trust_exchange_authorizes_the_peers_host_key_from_its_address_only(tmp_path):
    """Two "hosts" on one machine: the peer serves SSH with its host key; this host learns that
    key with ssh-keyscan and authorizes it from the peer's address. Then the peer, logging in
    with its host key as identity (what bash-env.sh's link makes it do), gets in from
    127.0.0.1, and not from 127.0.0.2 with the same key, nor with a key of its own."""
    peer_key = tmp_path / "peer_host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(peer_key)], check=True)
    peer_port, here_port = free_port(), free_port()
    here = _paths(tmp_path)
    os.makedirs(here.ssh_dir, mode=0o700)
    procs = [_start_sshd(tmp_path, "peer", str(peer_key), "/dev/null", peer_port)]
    try:
        missing = v3ssh.run_trust_exchange(here, ["localhost"], 10, lambda line: None, port=peer_port)
        assert missing == []
        lines = open(here.authorized_keys).read().splitlines()
        peer_public = " ".join(open(f"{peer_key}.pub").read().split()[:2])
        assert len(lines) == 1 and lines[0].endswith(f"restrict {peer_public} byoc-sdk-v3:localhost")
        assert lines[0].startswith('from="127.0.0.1')

        procs.append(_start_sshd(tmp_path, "here", here.host_key, here.authorized_keys, here_port))
        assert _ssh(str(peer_key), here_port).stdout.strip() == "in"
        assert _ssh(str(peer_key), here_port, bind="127.0.0.2").returncode == 255
        stranger = tmp_path / "stranger_key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
        assert _ssh(str(stranger), here_port).returncode == 255
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)


@needs_sshd
def test_a_peer_that_never_serves_ssh_is_reported_after_the_deadline(tmp_path, monkeypatch):
    """The exchange asks again until its deadline, and gives up at the first round that ends
    after it: its deadline is set before its first round, so at most one round can start at or
    after (first round + timeout). A second one means it ignored its deadline."""
    here = _paths(tmp_path)
    rounds: list[float] = []
    scan = v3ssh.ssh.scan_host_key

    def scan_and_note(host, port, timeout_s):
        rounds.append(time.monotonic())
        assert len([t for t in rounds if t >= rounds[0] + 1]) <= 1, "a round after the one past the deadline"
        return scan(host, port, timeout_s=timeout_s)

    monkeypatch.setattr(v3ssh.ssh, "scan_host_key", scan_and_note)
    started = time.monotonic()
    assert v3ssh.run_trust_exchange(here, ["localhost"], 1, lambda line: None, port=free_port()) == ["localhost"]
    assert time.monotonic() - started >= 1  # not before its deadline
    assert not os.path.exists(here.authorized_keys)


def test_every_hosts_ranks_are_told_to_write_whole_lines():
    """mpirun passes BYOC_WHOLE_LINES to the other hosts' ranks only with -x; the image's .pth
    then makes each Python rank write a line per write (test_cpu_image.py runs it)."""
    assert shim.build_whole_lines_argv(["--host", "algo-1,algo-2", "-np", "2", "python3", "x.py"]) == [
        "-x", "BYOC_WHOLE_LINES=1", "--host", "algo-1,algo-2", "-np", "2", "python3", "x.py"]


# --- NCCL_PROTO: SDK v3's drivers force "simple"; the job's own choice wins (sdk_v3/nccl_proto.py)


@pytest.mark.parametrize("recorded, current, want", [
    ("unset", "simple", None),  # the driver's workaround: gone, the plugin and NCCL choose
    ("set:LL128", "simple", "LL128"),  # the job's own value, which the driver overwrote
    ("set:simple", "simple", "simple"),  # the job asked for simple itself
    ("unset", "LL", "LL"),  # not the driver's value: left alone
    ("", "simple", "simple"),  # no record (not a v3 job bash-env.sh saw): nothing changes
    ("garbage", "simple", "simple"),
])
def test_the_torchrun_shim_gives_the_ranks_the_jobs_own_nccl_protocol(recorded, current, want):
    from entrypoint.sdk_v3.nccl_proto import build_torchrun_env

    environ = {"NCCL_PROTO": current, "PATH": "/bin", **({"BYOC_JOB_NCCL_PROTO": recorded} if recorded else {})}
    env, note = build_torchrun_env(environ)
    assert env.get("NCCL_PROTO") == want
    assert (note is not None) == (want != current)
    assert env["PATH"] == "/bin"


def test_v3_mpiruns_forced_simple_protocol_gives_way_to_the_jobs_choice():
    from entrypoint.sdk_v3.nccl_proto import build_mpirun_argv

    argv = ["--host", "algo-1,algo-2", "-np", "2", "-x", "FI_PROVIDER=efa", "-x", "NCCL_PROTO=simple", "python3", "x.py"]
    dropped, note = build_mpirun_argv(argv, {"BYOC_JOB_NCCL_PROTO": "unset"})
    assert dropped == ["--host", "algo-1,algo-2", "-np", "2", "-x", "FI_PROVIDER=efa", "python3", "x.py"] and note
    replaced, _ = build_mpirun_argv(argv, {"BYOC_JOB_NCCL_PROTO": "set:LL128"})
    assert replaced[7] == "NCCL_PROTO=LL128" and len(replaced) == len(argv)
    assert build_mpirun_argv(argv, {"BYOC_JOB_NCCL_PROTO": "set:simple"}) == (argv, None)
    assert build_mpirun_argv(argv, {}) == (argv, None)  # outside a recorded v3 job


def test_the_torchrun_shim_execs_the_real_torchrun_with_the_arguments_as_given(tmp_path):
    """A real process: the shim finds the next torchrun on PATH (a stand-in printing what it
    got) and execs it with v3's arguments untouched and the driver's NCCL_PROTO gone."""
    import subprocess

    real = tmp_path / "bin" / "torchrun"
    real.parent.mkdir()
    real.write_text("#!/bin/sh\necho \"argv=$*\"\necho \"NCCL_PROTO=${NCCL_PROTO-<unset>}\"\n")
    real.chmod(0o755)
    env = {"PATH": f"{real.parent}:/usr/bin:/bin", "NCCL_PROTO": "simple", "BYOC_JOB_NCCL_PROTO": "unset",
           "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "entrypoint.sdk_v3.torchrun", "--nnodes=2", "--node_rank=1", "x.py"],
                          env=env, capture_output=True, text=True, timeout=30, cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["argv=--nnodes=2 --node_rank=1 x.py", "NCCL_PROTO=<unset>"]
    assert "byoc sdk-v3 torchrun: NCCL_PROTO unset" in done.stderr


V3_TORCHRUN_ARGV = ["--nnodes=2", "--nproc_per_node=4", "--master_addr=algo-1", "--master_port=7777",
                    "--node_rank=1", "/opt/ml/input/data/code/train.py", "--epochs", "1"]


def _v3_resource(instance_type: str, current="algo-2"):
    return parse_resource_config({"current_host": current, "hosts": ["algo-1", "algo-2"],
                                  "current_instance_type": instance_type, "network_interface_name": "ethwe"})


def test_v3_torchrun_in_local_gpu_mode_gets_this_hosts_share_and_an_interface_that_exists():
    from entrypoint.sdk_v3.torchrun import decide_torchrun_launch

    environ = {"NCCL_SOCKET_IFNAME": "ethwe", "NCCL_PROTO": "simple", "BYOC_JOB_NCCL_PROTO": "unset"}
    argv, env, notes = decide_torchrun_launch(V3_TORCHRUN_ARGV, environ, _v3_resource("local_gpu"), 4, ("eth0", "lo"))
    assert argv == [*V3_TORCHRUN_ARGV[:1], "--nproc_per_node=2", *V3_TORCHRUN_ARGV[2:]]
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and env["NCCL_SOCKET_IFNAME"] == "eth0" and "NCCL_PROTO" not in env
    assert len(notes) == 4  # the protocol, the interface, the share, the process count
    leader_argv, leader_env, _ = decide_torchrun_launch(V3_TORCHRUN_ARGV, environ, _v3_resource("local_gpu", "algo-1"),
                                                        4, ("eth0", "lo"))
    assert leader_env["CUDA_VISIBLE_DEVICES"] == "0,1" and "--nproc_per_node=2" in leader_argv


def test_v3_torchrun_keeps_an_explicit_process_count_and_cloud_jobs_untouched():
    from entrypoint.sdk_v3.torchrun import decide_torchrun_launch

    explicit = ["--nnodes=2", "--nproc_per_node=1", "train.py"]
    argv, env, _ = decide_torchrun_launch(explicit, {}, _v3_resource("local_gpu"), 4, ("eth0",))
    assert argv == explicit and env["CUDA_VISIBLE_DEVICES"] == "2,3"
    argv, env, notes = decide_torchrun_launch(V3_TORCHRUN_ARGV, {"NCCL_SOCKET_IFNAME": "eth0"},
                                              _v3_resource("ml.g5.12xlarge"), 4, ("eth0",))
    assert argv == V3_TORCHRUN_ARGV and "CUDA_VISIBLE_DEVICES" not in env and notes == []
    assert decide_torchrun_launch(V3_TORCHRUN_ARGV, {}, None, 0, ("eth0",)) == (V3_TORCHRUN_ARGV, {}, [])

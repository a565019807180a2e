"""Real emulated hosts: names, addresses, /opt/ml, private files (root needed)."""

import json
import os
import sys
import textwrap

import pytest

from localcluster import Channel, ClusterError, EmulatedCluster, JobSpec

PYTHON = sys.executable
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="emulated hosts need root (namespaces, veths, mounts)")

REPORT = textwrap.dedent(
    """
    import json, os, socket, sys
    me = socket.gethostname()
    print(json.dumps({
        "hostname": me,
        "own_address": socket.gethostbyname(me),
        "others": {name: socket.gethostbyname(name) for name in sys.argv[1:]},
        "processes": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
        "init": open("/proc/1/cmdline").read().split("\\0")[:4],
    }))
    """
)


def report(cluster, host):
    result = cluster.run_on(host, [PYTHON, "-c", REPORT, *cluster.host_names])
    assert result.returncode == 0, result.output
    return json.loads(result.output)


def test_each_host_has_its_name_address_and_process_tree(machine_files):
    with EmulatedCluster(["algo-1", "algo-2"]) as cluster:
        addresses = {h: cluster.address(h) for h in cluster.host_names}
        assert addresses["algo-1"] != addresses["algo-2"]
        for host in ("algo-1", "algo-2"):
            seen = report(cluster, host)
            assert seen["hostname"] == host
            # gloo/NCCL advertise what their own name resolves to: it must be the host's address.
            assert seen["own_address"] == addresses[host]
            assert seen["others"] == addresses
            # A PID namespace of its own: the host init is PID 1, and little else runs.
            assert seen["processes"][0] == 1 and len(seen["processes"]) <= 3
            assert seen["init"][3].endswith("localcluster/hostinit.py")


def test_hosts_talk_over_tcp_by_name(wait_for_text):
    server = textwrap.dedent(
        """
        import socket
        s = socket.create_server(("algo-2", 5555))
        print("listening", flush=True)
        conn, peer = s.accept()
        conn.sendall(f"{socket.gethostname()} saw {peer[0]}".encode())
        conn.close()
        """
    )
    client = "import socket; c = socket.create_connection(('algo-2', 5555), timeout=10); print(c.recv(100).decode())"
    with EmulatedCluster(["algo-1", "algo-2"]) as cluster:
        listener = cluster.start_on("algo-2", [PYTHON, "-c", server])
        wait_for_text(listener, "listening")
        result = cluster.run_on("algo-1", [PYTHON, "-c", client])
        assert result.output.strip() == f"algo-2 saw {cluster.address('algo-1')}"
        assert listener.wait(10).returncode == 0


def test_names_that_sort_out_of_numeric_order():
    names = ["algo-1", "algo-2", "algo-10"]
    with EmulatedCluster(names) as cluster:
        for host in names:
            config = json.loads(cluster.run_on(host, ["cat", "/opt/ml/input/config/resourceconfig.json"]).output)
            assert config["current_host"] == host
            assert config["hosts"] == ["algo-1", "algo-10", "algo-2"]
            seen = report(cluster, host)
            assert seen["hostname"] == host
            assert seen["others"] == {h: cluster.address(h) for h in names}
        assert cluster.address("algo-10") == cluster.plan.subnet.replace("0/24", "3")


OPT_ML_PROBE = textwrap.dedent(
    """
    import json, os, socket
    host = socket.gethostname()
    cfg = "/opt/ml/input/config"
    seen = {name: json.load(open(os.path.join(cfg, name))) for name in sorted(os.listdir(cfg))}
    seen["top"] = sorted(os.listdir("/opt/ml"))
    seen["train"] = open("/opt/ml/input/data/train/part-0.csv").read()
    seen["eval"] = sorted(os.listdir("/opt/ml/input/data/eval"))
    seen["code"] = sorted(os.listdir("/opt/ml/code"))
    open(f"/opt/ml/model/{host}.txt", "w").write(host)
    open(f"/opt/ml/output/data/{host}.txt", "w").write(host)
    print(json.dumps(seen))
    """
)


def test_opt_ml_per_host_and_shared(tmp_path, machine_files):
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print('hi')\n")
    train = tmp_path / "train"
    train.mkdir()
    (train / "part-0.csv").write_text("1,2\n")
    job = JobSpec(
        job_name="opt-ml-test",
        hyperparameters={"epochs": 3, "name": "abc"},
        program="train.py",
        code_dir=str(code),
        channels=(Channel("train", str(train)), Channel("eval")),
    )
    with EmulatedCluster(["algo-1", "algo-2"], job) as cluster:
        for host in ("algo-1", "algo-2"):
            result = cluster.run_on(host, [PYTHON, "-c", OPT_ML_PROBE])
            assert result.returncode == 0, result.output
            seen = json.loads(result.output)
            assert seen["resourceconfig.json"]["current_host"] == host
            assert seen["resourceconfig.json"]["hosts"] == ["algo-1", "algo-2"]
            assert seen["hyperparameters.json"] == {
                "sagemaker_program": '"train.py"',
                "sagemaker_submit_directory": '"/opt/ml/code"',
                "sagemaker_container_log_level": "20",
                "sagemaker_job_name": '"opt-ml-test"',
                "epochs": "3",
                "name": '"abc"',
            }
            assert seen["inputdataconfig.json"] == {
                "train": {"TrainingInputMode": "File"},
                "eval": {"TrainingInputMode": "File"},
            }
            assert seen["top"] == ["code", "input", "model", "output", "shared"]
            assert (seen["train"], seen["eval"], seen["code"]) == ("1,2\n", [], ["train.py"])
        # model/ is shared: both hosts' files land in one folder on this machine ...
        assert sorted(os.listdir(cluster.model_dir)) == ["algo-1.txt", "algo-2.txt"]
        # ... output/ is each host's own.
        for host in ("algo-1", "algo-2"):
            assert os.listdir(os.path.join(cluster.opt_ml(host), "output", "data")) == [f"{host}.txt"]


def test_sagemaker_training_toolkit_reads_the_tree():
    """The reference implementation, run inside algo-2, understands the tree as SageMaker's."""
    probe = textwrap.dedent(
        """
        import json
        from sagemaker_training import environment
        env = environment.Environment()
        print(json.dumps({"current_host": env.current_host, "hosts": env.hosts,
                          "hps": env.hyperparameters, "channels": env.channel_input_dirs,
                          "module": env.module_name, "master": env.master_hostname}))
        """
    )
    job = JobSpec(hyperparameters={"lr": 0.5, "layers": [1, 2]}, program="train.py", channels=(Channel("train"),))
    with EmulatedCluster(["algo-1", "algo-2", "algo-3"], job) as cluster:
        result = cluster.run_on("algo-2", [PYTHON, "-c", probe])
        assert result.returncode == 0, result.output
        seen = json.loads(result.output.strip().splitlines()[-1])
        assert seen == {
            "current_host": "algo-2",
            "hosts": ["algo-1", "algo-2", "algo-3"],
            "hps": {"lr": 0.5, "layers": [1, 2]},
            "channels": {"train": "/opt/ml/input/data/train"},
            "module": "train",
            "master": "algo-1",
        }


def test_ssh_and_environment_files_are_private_to_each_host(machine_files):
    write = "echo algo1-key > /root/.ssh/authorized_keys; echo FOO=1 >> /etc/environment; cat /etc/ssh/ssh_host_ed25519_key.pub"
    with EmulatedCluster(["algo-1", "algo-2"]) as cluster:
        first = cluster.run_on("algo-1", ["sh", "-c", write])
        assert first.returncode == 0, first.output
        seen = cluster.run_on("algo-2", ["sh", "-c", "ls -A /root/.ssh; cat /etc/environment; cat /etc/ssh/ssh_host_ed25519_key.pub"])
        assert seen.returncode == 0, seen.output
        lines = seen.output.splitlines()
        assert "FOO=1" not in lines and "authorized_keys" not in lines
        # Each host has a host key of its own, named for it.
        assert first.output.split()[-1] == "root@algo-1" and lines[-1].split()[-1] == "root@algo-2"
        assert first.output.split()[1] != lines[-1].split()[1]
    # machine_files: /root/.ssh, /etc/environment, /etc/ssh and /opt are as they were


def test_commands_get_a_clean_container_like_environment():
    with EmulatedCluster(["algo-1"], JobSpec(job_name="envtest")) as cluster:
        result = cluster.run_on("algo-1", ["env"], env={"EXTRA": "yes"}, cwd="/opt/ml")
        env = dict(line.split("=", 1) for line in result.output.splitlines())
        assert env["HOSTNAME"] == "algo-1" and env["TRAINING_JOB_NAME"] == "envtest" and env["EXTRA"] == "yes"
        assert env["PATH"].startswith(os.path.dirname(PYTHON) + ":")
        assert "PYTEST_CURRENT_TEST" not in env  # nothing leaks in from the caller
        assert cluster.run_on("algo-1", ["pwd"], cwd="/opt/ml/input").output == "/opt/ml/input\n"


def test_argv_must_be_a_list():
    with EmulatedCluster(["algo-1"]) as cluster:
        with pytest.raises(TypeError, match="no shell here"):
            cluster.run_on("algo-1", "hostname")
        with pytest.raises(KeyError, match="algo-9"):
            cluster.run_on("algo-9", ["hostname"])


def test_write_opt_ml_between_runs(tmp_path):
    with EmulatedCluster(["algo-1", "algo-2"], JobSpec(hyperparameters={"epochs": 1})) as cluster:
        cluster.write_opt_ml(JobSpec(hyperparameters={"epochs": 2}))
        seen = cluster.run_on("algo-2", ["cat", "/opt/ml/input/config/hyperparameters.json"]).output
        assert json.loads(seen)["epochs"] == "2"
        with pytest.raises(ClusterError, match="mounted at start"):
            cluster.write_opt_ml(JobSpec(channels=(Channel("train", str(tmp_path)),)))

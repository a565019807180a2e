"""Failure and stop paths, piece by piece: which processes a stop request reaches, how soon a
failure ends the other processes, which line leads a stopped host's failure, where the
job's private SSH key lives. Multi-process behaviour with real processes."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from entrypoint.run import processes

from entrypoint.hosts import ssh
from entrypoint.outcome.records import RootCause, StepEnding
from entrypoint.outcome.failure import describe_failure
from support.jobs import make_job, plan_for
from support.jobtree import PYTHON, REPO

# --- the process table (pure) -------------------------------------------------------------


def test_stat_line_with_parentheses_and_spaces_in_the_command():
    info = processes.parse_stat("4242 (my (odd) name) S 17 4242 4242 0 -1 4194560 ...")
    assert (info.pid, info.comm, info.state, info.ppid, info.pgid) == (4242, "my (odd) name", "S", 17, 4242)


def table(*rows):
    return {pid: processes.ProcInfo(pid, ppid, pgid, comm, state) for pid, ppid, pgid, comm, state in rows}


def test_ranks_are_the_launchers_children_but_not_its_rsh_agent_or_zombies():
    t = table(
        (10, 1, 10, "mpirun", "S"),
        (11, 10, 11, "python", "S"),  # a rank, in its own group (Open MPI does that)
        (12, 10, 12, "python", "R"),
        (13, 10, 10, "ssh", "S"),  # mpirun's rsh agent to another host
        (14, 10, 14, "python", "Z"),  # a rank that already exited
        (15, 11, 11, "python", "S"),  # a data-loader worker of rank 11: in its group
        (20, 1, 20, "sshd", "S"),
    )
    assert processes.decide_rank_groups(t, [10]) == [11, 12]
    assert processes.decide_rank_groups(t, []) == []


def test_orted_found_below_the_worker_entrypoint():
    t = table((2, 1, 2, "python", "S"), (6, 2, 6, "sshd", "S"), (213, 2, 213, "orted", "S"),
              (216, 213, 216, "python", "S"), (300, 1, 300, "orted", "S"))
    assert processes.decide_launcher_pids(t, 2, ("orted",)) == [213]
    assert processes.build_descendants(t, 2) == [6, 213, 216]


# --- PID 1 / subreaper: orphans are reaped, Popen's own children are not ---------------------

REAPER = textwrap.dedent(
    """
    import ctypes, json, os, subprocess, sys, time
    sys.path.insert(0, sys.argv[1])
    from entrypoint.run import processes
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans come to us, as to PID 1
    child = subprocess.Popen([sys.executable, "-c", "import time, sys; time.sleep(0.5); sys.exit(7)"])
    # sh exits at once; its background sleep is orphaned and adopted by us.
    subprocess.run(["sh", "-c", "sleep 0.2 & echo $!"], capture_output=True, text=True)
    deadline = time.monotonic() + 5
    while child.poll() is None and time.monotonic() < deadline:
        processes.reap_orphans({child.pid})
        time.sleep(0.01)
    processes.reap_orphans(set())
    zombies = [p for p in os.listdir("/proc") if p.isdigit() and open(f"/proc/{p}/stat").read().split(") ")[1][0] == "Z"
               and int(open(f"/proc/{p}/stat").read().split(") ")[1].split()[1]) == os.getpid()]
    print(json.dumps({"child_code": child.returncode, "zombies": zombies}))
    """
)


def test_orphans_are_reaped_without_stealing_a_popen_childs_exit_code():
    done = subprocess.run([PYTHON, "-c", REAPER, str(REPO)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"child_code": 7, "zombies": []}


# --- the supervisor: a failure is not a stop request; a stop goes to the ranks ----------------

SUPERVISE = textwrap.dedent(
    """
    import json, sys, time
    sys.path.insert(0, sys.argv[1])
    from entrypoint.run.supervise import OutputCollector, RunHooks, run_processes
    from entrypoint.run.stop import Stop
    from entrypoint.decide.specs import ProcessSpec
    from entrypoint.settings import DEFAULTS
    specs = [ProcessSpec(s["name"], tuple(s["argv"]), signal_ranks=s.get("signal_ranks", False)) for s in json.loads(sys.argv[2])]
    hooks = RunHooks(DEFAULTS._replace(grace_period_s=float(sys.argv[4])))
    run = run_processes(tuple(specs), {"PATH": "/usr/bin:/bin"}, sys.argv[3], OutputCollector(), Stop(), hooks)
    print(json.dumps({"code": run.exit_code, "stopped_by": run.stopped_by, "killed_at_deadline": run.killed_at_deadline}))
    """
)


def supervise(tmp_path, specs, grace_s):
    return subprocess.Popen([PYTHON, "-c", SUPERVISE, str(REPO), json.dumps(specs), str(tmp_path), str(grace_s)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_one_failed_process_stops_the_others_within_the_failure_bound_not_the_grace_period(tmp_path):
    """A parameter-server host: the worker raises, the shard ignores SIGTERM. With a grace
    period of an hour the host still ends, by our SIGKILL at settings.failure_stop_s (10 s)."""
    specs = [
        {"name": "worker", "argv": [sys.executable, "-c", "import time, sys; time.sleep(1); sys.exit(3)"]},
        {"name": "shard", "argv": [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"]},
    ]
    proc = supervise(tmp_path, specs, 3600)
    try:
        out, err = proc.communicate(timeout=120)  # a guard against a hang: only the failure bound ends it before the hour
    finally:
        proc.kill()
    result = json.loads(out.splitlines()[-1])
    assert result == {"code": 3, "stopped_by": None, "killed_at_deadline": True}, err  # the shard, by our SIGKILL
    stopping = err.index("worker exited with code 3; stopping the other processes")
    assert err.index("time is up: sending SIGKILL", stopping) > stopping, err


# A stand-in for mpirun: starts a "rank" in a process group of its own, as Open MPI does; on
# SIGTERM it tears the job down the way Open MPI does, with its short kill timeout (here:
# SIGKILL to the rank after 1 s). The rank needs 2 s after SIGTERM to write its checkpoint.
LAUNCHER = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    rank = subprocess.Popen([sys.executable, "-c", '''
    import os, signal, sys, time
    def on_term(*_):
        time.sleep(2)
        open("saved", "w").write("checkpoint")
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    open("started", "w").close()
    time.sleep(300)
    '''], start_new_session=True)
    def teardown(*_):
        os.killpg(rank.pid, signal.SIGTERM)
        time.sleep(1)
        os.killpg(rank.pid, signal.SIGKILL)
        sys.exit(1)
    signal.signal(signal.SIGTERM, teardown)
    sys.exit(rank.wait())
    """
)


@pytest.mark.parametrize("signal_ranks", [True, False])
def test_a_stop_request_goes_to_the_ranks_not_through_the_launchers_teardown(tmp_path, signal_ranks):
    proc = supervise(tmp_path, [{"name": "mpirun", "argv": [sys.executable, "-c", LAUNCHER], "signal_ranks": signal_ranks}], 30)
    deadline = time.monotonic() + 30
    while not (tmp_path / "started").exists():
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    result = json.loads(out.splitlines()[-1])
    assert result["stopped_by"] == "SIGTERM"
    if signal_ranks:
        assert (tmp_path / "saved").read_text() == "checkpoint", err
        assert result["code"] == 0
    else:  # what mpirun did with SIGTERM itself: the rank had 1 s, not the grace period
        assert not (tmp_path / "saved").exists()


def test_mpirun_is_stopped_through_its_ranks_and_tears_down_in_a_second_whatever_the_grace_period():
    job = make_job(hosts=("algo-1", "algo-2"), hps={"sagemaker_mpi_enabled": True}, environ={"BYOC_GRACE_PERIOD_S": "300"})
    spec = plan_for(job).processes[0]
    assert spec.name == "mpirun" and spec.signal_ranks
    assert spec.argv[spec.argv.index("odls_base_sigkill_timeout") + 1] == "1"


@pytest.mark.parametrize("restarts, gap", [("0", "1"), ("1", "0"), ("100", "0")])
def test_mpirun_tears_a_failed_attempt_down_at_once_where_it_is_restarted(restarts, gap):
    """BYOC_MAX_RESTARTS: a failed attempt's ranks are thrown away, so Open MPI's teardown skips
    its gaps between SIGTERM and SIGKILL (slept twice on every host: 4 s of each restart of the
    main job on 2 hosts, docs/benchmarks-training.md)."""
    job = make_job(hosts=("algo-1", "algo-2"), hps={"sagemaker_mpi_enabled": True},
                   environ={"BYOC_MAX_RESTARTS": restarts})
    spec = plan_for(job).processes[0]
    assert spec.argv[spec.argv.index("odls_base_sigkill_timeout") + 1] == gap


# --- which line leads a stopped host's failure ---------------------------------------------

CAUSE = RootCause(host="algo-2", rank="1", type="RuntimeError", message="boom", time=1000.0)


def test_a_failure_before_the_stop_leads_a_stopped_hosts_report():
    report = describe_failure("torchrun on 2 host(s)", StepEnding(143, stopped_by="SIGTERM", stopped_at=1001.0), CAUSE, [],
                              "algo-1")
    assert report.startswith("RuntimeError: boom\nFirst failure: rank 1 on host algo-2")
    assert "Then this host (algo-1) was stopped by SIGTERM." in report.split("\n\n")[0]


def test_a_failure_after_the_stop_does_not_lead():
    report = describe_failure("torchrun on 2 host(s)", StepEnding(143, stopped_by="SIGTERM", stopped_at=999.0), CAUSE, [],
                              "algo-1")
    assert report.startswith("Training was stopped by SIGTERM. RuntimeError: boom")


# --- the job's private SSH key --------------------------------------------------------------

DOCKER_MOUNTS = """overlay / overlay rw,relatime 0 0
proc /proc proc rw 0 0
tmpfs /dev tmpfs rw,nosuid 0 0
shm /dev/shm tmpfs rw,nosuid,nodev,noexec,size=65536k 0 0
/dev/sda1 /opt/ml/model ext4 rw 0 0
"""


def test_mount_points_with_escaped_spaces():
    assert ssh.parse_mounts("tmpfs /mnt/my\\040dir tmpfs rw 0 0\n") == [("/mnt/my dir", "tmpfs")]


def test_under_docker_the_key_goes_to_dev_shm_not_to_run():
    mounts = ssh.parse_mounts(DOCKER_MOUNTS)
    assert ssh.filesystem_of("/run/byoc/ssh", mounts) == "overlay"
    assert ssh.decide_key_folder("/run/byoc/ssh", mounts, "/dev/shm/byoc-job-ab12") == ("/dev/shm/byoc-job-ab12/ssh", None)


def test_byoc_runtime_dir_separates_the_jobs_memory_backed_folder_too():
    """Two entrypoints of one job definition on one machine, told apart with BYOC_RUNTIME_DIR,
    must not share /dev/shm/byoc-job-<id> (the private key, the host's environment); every
    host of one job, with one setting, gets the same path."""
    from entrypoint.run.runtime_dirs import decide_runtime_files

    mounts = ssh.parse_mounts(DOCKER_MOUNTS)
    default = decide_runtime_files("/run/byoc", "ab12", mounts)
    assert default.private_folder == "/dev/shm/byoc-job-ab12"
    one, other = (decide_runtime_files(base, "ab12", mounts) for base in ("/tmp/run-a", "/tmp/run-b"))
    assert one.private_folder != other.private_folder
    assert {os.path.dirname(f.private_folder) for f in (one, other)} == {"/dev/shm"}
    assert decide_runtime_files("/tmp/run-a", "ab12", mounts) == one


def test_a_tmpfs_runtime_folder_keeps_the_key_beside_the_configuration():
    mounts = ssh.parse_mounts(DOCKER_MOUNTS + "tmpfs /run tmpfs rw 0 0\n")
    assert ssh.decide_key_folder("/run/byoc/ssh", mounts, "/dev/shm/byoc-job-ab12") == ("/run/byoc/ssh", None)


def test_without_memory_backed_storage_the_plan_says_so():
    mounts = [("/", "ext4")]
    folder, note = ssh.decide_key_folder("/run/byoc/ssh", mounts, "/dev/shm/byoc-job-ab12")
    assert folder == "/run/byoc/ssh" and "SIGKILL would leave it on disk" in note


def test_the_key_lives_apart_from_the_configuration_and_is_removed(tmp_path):
    files = ssh.SshFiles(str(tmp_path / "run/ssh"), str(tmp_path / "shm/byoc-ssh-x"))
    ssh.write_host_key_and_configs(files, 2222)
    assert files.host_key == str(tmp_path / "shm/byoc-ssh-x/host_ed25519_key")
    assert "PRIVATE KEY" in open(files.host_key).read()
    assert f"HostKey {files.host_key}" in open(files.sshd_config).read()
    assert f"IdentityFile {files.host_key}" in open(files.client_config).read()
    ssh.remove_private_key(files)
    assert not (tmp_path / "shm/byoc-ssh-x").exists()
    for folder, _, names in os.walk(tmp_path):
        for name in names:
            assert "PRIVATE KEY" not in open(os.path.join(folder, name), errors="replace").read()


def test_host_env_is_the_hosts_own_environment_under_the_plans_values():
    from entrypoint.roles.mpi import build_host_env

    environ = {"MY_SETTING": "user", "SM_CURRENT_HOST": "stale", "OMPI_COMM_WORLD_RANK": "0",
               "PMIX_RANK": "0", "PWD": "/x", "AWS_REGION": "us-west-2"}
    got = build_host_env(environ, {"SM_CURRENT_HOST": "algo-2"})
    assert got == {"MY_SETTING": "user", "SM_CURRENT_HOST": "algo-2", "AWS_REGION": "us-west-2"}


def test_host_env_file_is_the_same_path_on_every_host_and_beside_the_key():
    from entrypoint.decide.specs import decide_host_env_file

    # In the job's own memory-backed folder (its id is the same on every host, so the path
    # mpirun gives every rank is right on every host), beside the key, never shared by jobs.
    assert decide_host_env_file("/run/byoc/job-1a2b/ssh", "/dev/shm/byoc-job-1a2b/ssh") == "/dev/shm/byoc-job-1a2b/byoc-host-env.json"
    assert decide_host_env_file("/run/byoc/job-9f9f/ssh", "/dev/shm/byoc-job-9f9f/ssh") == "/dev/shm/byoc-job-9f9f/byoc-host-env.json"
    assert decide_host_env_file("/run/byoc/job-1a2b/ssh", "/run/byoc/job-1a2b/ssh") == "/run/byoc/job-1a2b/ssh/byoc-host-env.json"
    assert decide_host_env_file("/run/byoc/job-1a2b/ssh", "") == "/run/byoc/job-1a2b/ssh/byoc-host-env.json"


def _fake_sshd(child_sleep_s: float):
    """A stand-in for the listening sshd: a process with one session child that lives child_sleep_s."""
    import subprocess
    import sys
    code = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep({child_sleep_s})']); time.sleep(60)"
    return subprocess.Popen([sys.executable, "-c", code])


def test_a_worker_with_its_outcome_waits_for_the_leaders_session_to_close():
    """The session that delivered the outcome is still closing when the file appears: the
    worker waits for it (no false "closed by remote host" on the leader), but never long."""
    import time

    from entrypoint.run import processes
    from entrypoint.run.processes import wait_for_descendants_to_end as wait_for_sessions_to_close

    sshd = _fake_sshd(1.0)
    try:
        deadline = time.monotonic() + 10
        while not processes.build_descendants(processes.load_process_table(), sshd.pid):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert wait_for_sessions_to_close(sshd.pid, 60.0) is True
        table = processes.load_process_table()  # it returned because the session had ended
        assert all(table[p].state == "Z" for p in processes.build_descendants(table, sshd.pid) if p in table)
    finally:
        sshd.kill()
        sshd.wait()

    stuck = _fake_sshd(60)
    try:
        time.sleep(0.5)
        started = time.monotonic()
        assert wait_for_sessions_to_close(stuck.pid, 0.5) is False  # at its bound: the session lives a minute
        assert time.monotonic() - started >= 0.5  # not before it
    finally:
        for pid in processes.build_descendants(processes.load_process_table(), stuck.pid):
            os.kill(pid, 9)
        stuck.kill()
        stuck.wait()


@pytest.mark.parametrize("as_pid_1", [False, True], ids=["plain", "as-pid-1"])
def test_sigterm_during_start_up_is_honoured_at_once_with_143(tmp_path, as_pid_1):
    """Start-up here is the wait for the other host's name to resolve (an hour allowed). As PID 1
    (a container) a process without a handler never sees SIGTERM: it was dropped."""
    import shutil

    from support.jobtree import entrypoint_env, failure_text, write_tree

    if as_pid_1 and (os.geteuid() != 0 or shutil.which("unshare") is None):
        pytest.skip("PID 1 of a new PID namespace needs root and unshare(1)")
    root = write_tree(tmp_path, hosts=("algo-1", "no-such-host.invalid"), script="print('must not run')\n",
                      hyperparameters={"sagemaker_mpi_enabled": True})  # fmt: skip
    argv = [PYTHON, "-m", "entrypoint", "train"]
    if as_pid_1:
        argv = ["unshare", "--pid", "--fork", "--kill-child", "--", *argv]
    env = entrypoint_env(root, BYOC_HOST_RESOLUTION_TIMEOUT_S="3600")
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the entrypoint is up once it has cleared old outcomes
            time.sleep(0.2)
            target = _only_child(proc.pid) if as_pid_1 else proc.pid
            if target and _has_signal_handler(target, signal.SIGTERM):
                break
        else:
            pytest.fail("the entrypoint never installed its SIGTERM handler")
        os.kill(target, signal.SIGTERM)
        out, err = proc.communicate(timeout=60)  # a guard against a hang: the DNS wait alone is an hour
    finally:
        proc.kill()
    assert proc.returncode == 143, err[-2000:]
    assert "must not run" not in out
    assert failure_text(root).startswith("Stopped by SIGTERM during start-up, before the training processes started")
    assert "Traceback" not in err


def _only_child(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = f.read().split()
    except OSError:
        return None
    return int(kids[0]) if kids else None


def _has_signal_handler(pid: int, sig: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            caught = next(line for line in f if line.startswith("SigCgt:")).split()[1]
    except (OSError, StopIteration):
        return False
    return bool(int(caught, 16) & (1 << (sig - 1)))


# --- 137: out-of-memory only when the kernel says so -------------------------------------------

def test_137_is_called_out_of_memory_only_when_the_cgroup_counted_an_oom_kill():
    from entrypoint.outcome.failure import describe_exit_code

    assert "by the kernel's out-of-memory killer (2 OOM kill(s)" in describe_exit_code(137, oom_kills=2)
    assert "not by the out-of-memory killer on this host" in describe_exit_code(137, oom_kills=0)
    assert "could not be read to tell" in describe_exit_code(137, oom_kills=None)
    ours = describe_exit_code(137, oom_kills=1, killed_by_us=True)
    assert "sent by this entrypoint when the grace period after the stop ran out" in ours
    assert describe_exit_code(143) == "exit code 143: killed by SIGTERM (signal 15): it was asked to stop"
    assert describe_exit_code(134) == ("exit code 134: killed by SIGABRT (signal 6): the process aborted, often a C++ "
                                       "assertion or `terminate` in a library")
    assert describe_exit_code(135).startswith("exit code 135: killed by SIGBUS (signal 7): a bus error: often /dev/shm")
    assert describe_exit_code(128 + 40) == "exit code 168: killed by signal 40"


def test_the_oom_counter_is_found_for_cgroup_v1_v2_and_a_containers_own_namespace():
    from entrypoint.job.probe import decide_oom_event_files, parse_oom_kill_count

    v1 = "4:memory:/process_api/abc\n1:cpu:/\n0::/\n"
    assert decide_oom_event_files(v1, "/c")[:3] == [
        "/c/memory/process_api/abc/memory.oom_control", "/c/memory.events", "/c/unified/memory.events"]
    v2 = "0::/system.slice/docker-1.scope\n"
    assert decide_oom_event_files(v2, "/c")[0] == "/c/system.slice/docker-1.scope/memory.events"
    assert decide_oom_event_files("0::/\n", "/c")[0] == "/c/memory.events"  # in a container's namespace
    assert parse_oom_kill_count("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n") == 3
    assert parse_oom_kill_count("low 0\nhigh 0\nmax 5\noom 2\noom_kill 2\noom_group_kill 0\n") == 2
    assert parse_oom_kill_count("oom 1\n") is None


def test_a_kill_at_the_end_of_our_grace_period_says_so_not_out_of_memory(tmp_path):
    from support.jobtree import entrypoint_env, failure_text, write_tree

    started = tmp_path / "started"
    script = ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
              f"open({str(started)!r}, 'w').close()\ntime.sleep(60)\n")  # fmt: skip
    root = write_tree(tmp_path / "ml", script=script)
    proc = subprocess.Popen([PYTHON, "-m", "entrypoint", "train"], env=entrypoint_env(root, BYOC_GRACE_PERIOD_S="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 137, err[-2000:]
    report = failure_text(root)
    assert "sent by this entrypoint when the grace period after the stop ran out" in report
    assert "out-of-memory killer (" not in report


def test_a_real_oom_kill_is_reported_as_out_of_memory(tmp_path):
    """The entrypoint in a memory cgroup of its own, limited to 200 MB; the script allocates
    more. Needs root and a writable memory cgroup (v1 or v2)."""
    from support.jobtree import entrypoint_env, failure_text, write_tree

    cgroup = _make_memory_cgroup(tmp_path.name, 200 * 1024 * 1024)
    if cgroup is None:
        pytest.skip("no writable memory cgroup here (needs root; not inside an unprivileged container)")
    procs_file, remove = cgroup
    try:
        script = "blocks = []\nwhile True:\n    blocks.append(bytearray(32 * 1024 * 1024))\n"
        root = write_tree(tmp_path / "ml", script=script)
        done = subprocess.run(["sh", "-c", f'echo $$ > "{procs_file}" && exec "$0" -m entrypoint train', PYTHON],
                              env=entrypoint_env(root), capture_output=True, text=True, timeout=120)  # fmt: skip
    finally:
        remove()
    assert done.returncode == 137, done.stderr[-2000:]
    assert "killed by the kernel's out-of-memory killer (1 OOM kill(s)" in failure_text(root)


def _make_memory_cgroup(name: str, limit: int):
    """(cgroup.procs path, remove) for a new memory cgroup below ours, or None."""
    import contextlib

    if os.geteuid() != 0:
        return None
    with open("/proc/self/cgroup") as f:
        lines = f.read().splitlines()
    v1 = next((ln.split(":", 2)[2] for ln in lines if "memory" in ln.split(":")[1].split(",")), None)
    if v1 is not None:
        base, limit_file = f"/sys/fs/cgroup/memory{v1.rstrip('/')}", "memory.limit_in_bytes"
    else:
        v2 = next((ln.split(":", 2)[2] for ln in lines if ln.startswith("0::")), None)
        base, limit_file = f"/sys/fs/cgroup{(v2 or '').rstrip('/')}", "memory.max"
    path = os.path.join(base, f"byoc-oom-{name}"[:60])
    try:
        os.mkdir(path)
        with open(os.path.join(path, limit_file), "w") as f:
            f.write(str(limit))
        swap = os.path.join(path, "memory.memsw.limit_in_bytes" if v1 is not None else "memory.swap.max")
        if os.path.exists(swap):
            with open(swap, "w") as f:
                f.write(str(limit) if v1 is not None else "0")
    except OSError:
        with contextlib.suppress(OSError):
            os.rmdir(path)
        return None

    def remove():
        for _ in range(50):
            try:
                os.rmdir(path)
                return
            except OSError:
                time.sleep(0.1)

    return os.path.join(path, "cgroup.procs"), remove


def test_sigusr1_prints_every_ranks_stack_and_the_job_goes_on(tmp_path):
    from support.jobtree import entrypoint_env, write_tree

    started = tmp_path / "started"
    script = ("import time\n"
              "def waiting_in_a_known_place():\n"
              f"    open({str(started)!r}, 'w').close()\n"
              "    time.sleep(4)\n"
              "waiting_in_a_known_place()\nprint('finished')\n")  # fmt: skip
    root = write_tree(tmp_path / "ml", script=script)
    proc = subprocess.Popen([PYTHON, "-m", "entrypoint", "train"], env=entrypoint_env(root),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.2)
        proc.send_signal(signal.SIGUSR1)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "finished" in out
    assert "SIGUSR1: asking 1 rank process(es) on this host for their Python stacks" in err
    assert 'in waiting_in_a_known_place' in err and "(most recent call first)" in err


def test_a_job_port_already_in_use_is_one_clear_line_naming_the_setting(tmp_path):
    import socket

    from support.jobtree import entrypoint_env, failure_text, write_tree

    host = socket.gethostname()
    with socket.create_server(("", 0)) as taken:
        port = taken.getsockname()[1]
        root = write_tree(tmp_path, hosts=(host, "localhost"), current_host=host, script="print('must not run')\n",
                          hyperparameters={"sagemaker_distribution_instance_groups": [],
                                           "sagemaker_torch_distributed_enabled": True})  # fmt: skip
        done = subprocess.run([PYTHON, "-m", "entrypoint", "train"], capture_output=True, text=True, timeout=120,
                              env=entrypoint_env(root, BYOC_JOB_PORT=str(port)))  # fmt: skip
    assert done.returncode != 0
    line = f"port {port} on {host} is already in use by another process: the job's peers reach each other there; set BYOC_JOB_PORT"
    assert line in failure_text(root), failure_text(root)
    assert "Traceback" not in done.stderr and "must not run" not in done.stdout


LEAVES_A_GRANDCHILD = """\
import os, subprocess, sys
# A process of its own session: the SIGKILL to the script's group at the end misses it, and
# it keeps the script's stdout and stderr open.
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
open(os.environ["GRANDCHILD"], "w").write(str(child.pid))
print("the script is done", flush=True)
"""


def test_a_grandchild_holding_the_scripts_output_costs_one_wait_said_once(tmp_path):
    """Issue 43, case 8: a process the script left running with its stdout open made the
    entrypoint wait 5 s for each of two output pumps ("succeeded in 11.1 s" for a 1 s script).
    One deadline for the pumps together, and one line that says what is still open; the job's
    outcome is the script's (success)."""
    from support.jobtree import entrypoint_env, write_tree

    pid_file = tmp_path / "grandchild"
    root = write_tree(tmp_path / "ml", script=LEAVES_A_GRANDCHILD)
    try:
        done = subprocess.run([PYTHON, "-m", "entrypoint", "train"], env=entrypoint_env(root, GRANDCHILD=str(pid_file)),
                              capture_output=True, text=True, timeout=300, cwd=REPO)
    finally:
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert done.returncode == 0 and (root / "output/success").exists(), done.stderr[-3000:]
    assert "the script is done" in done.stdout
    held = [line for line in done.stderr.splitlines() if "still open after the process ended" in line]
    assert held == ["[entrypoint] script stdout, script stderr: still open after the process ended (a process it "
                    "started and left running holds it); waited 5 s for the rest of its output, not more: what "
                    "comes later is not kept"], done.stderr[-3000:]
    lines = done.stderr.splitlines()
    assert lines.index(held[0]) < next(i for i, line in enumerate(lines) if "succeeded in" in line)


def test_a_root_cause_of_an_earlier_attempt_that_lands_after_the_restart_is_not_the_next_attempts():
    """The job port takes a rank's root cause from any host at any time: one sent as attempt 1
    failed can arrive after attempt 2 began (the collector's reset), and must not lead attempt
    2's failure; one made after the reset does."""
    from entrypoint.hosts.job_port import ROOT_CAUSE
    from entrypoint.run.supervise import OutputCollector

    def line(message: str, made: float) -> str:
        return ROOT_CAUSE + json.dumps({"host": "algo-2", "rank": "1", "type": "SIGKILL", "message": message,
                                         "time": made})

    collector = OutputCollector()
    collector.add_line_text(line("attempt 1's", time.time()))
    collector.reset()
    collector.add_line_text(line("attempt 1's, late", collector.causes_since - 0.5))
    assert collector.root_causes == []
    collector.add_line_text(line("attempt 2's", collector.causes_since + 0.001))
    assert [c.message for c in collector.root_causes] == ["attempt 2's"]


# An MPI worker's run (Adopted: ranks it did not start) with the compile cache's periodic write
# overdue: the run asks for the write, as a run of its own processes does. ended() counts the
# run's looks; without the ask the loop wakes at once for ever, and the count ends it.
ADOPTED_PERIODIC = textwrap.dedent(
    """
    import json, sys, time
    sys.path.insert(0, sys.argv[1])
    from entrypoint.run.supervise import Adopted, OutputCollector, RunHooks, Supervisor

    class Periodic:
        asked = 0
        def due_at(self):
            return None if self.asked else time.monotonic() - 1.0
        def save_when_due(self):
            if self.due_at() is not None:
                self.asked += 1

    periodic, looks = Periodic(), []
    def ended():
        looks.append(periodic.asked)
        return periodic.asked > 0 or len(looks) > 1000
    supervisor = Supervisor(OutputCollector(), RunHooks(adopted=Adopted((), ended, set), periodic=periodic))
    print(json.dumps({"code": supervisor.wait(), "looks": looks}))
    """
)


def test_an_adopted_run_asks_for_the_periodic_write_when_it_is_due():
    done = subprocess.run([PYTHON, "-c", ADOPTED_PERIODIC, str(REPO)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"code": 0, "looks": [0, 1]}  # asked at the first look, ended at the next

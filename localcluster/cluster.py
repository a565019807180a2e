"""EmulatedCluster: N SageMaker-like hosts on this machine, each a set of namespaces.

    with EmulatedCluster(["algo-1", "algo-2"], JobSpec(...)) as cluster:
        result = cluster.run_on("algo-2", ["hostname"])
        run = cluster.start_all([python, "-m", "entrypoint", "train"])
        outcome = run.wait()

Per host: a network namespace with eth0 on a private bridge, a UTS namespace (hostname), an
IPC namespace, a mount namespace (/opt/ml, /run, /dev/shm, /etc/ssh, /root/.ssh and
/etc/environment of its own) and a PID namespace whose init (hostinit.py) holds it all up.
Commands enter a host with nsenter. Teardown removes everything, also after errors; a
cluster whose owner died is removed by the next cluster started (or `localcluster cleanup`).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Callable, Sequence, TextIO

from localcluster import network, registry
from localcluster.errors import ClusterError
from localcluster.jobenv import build_job_environment
from localcluster.multirun import ClusterRun
from localcluster.optml import (
    JobSpec,
    ROOT_BASHRC,
    WorkdirLayout,
    build_config_files,
    build_job_mounts,
    build_private_mounts,
    validate_job,
)
from localcluster.outcome import ClusterResult
from localcluster.plan import (
    DEFAULT_BASE_SUBNET,
    ClusterPlan,
    build_cluster_plan,
    build_default_host_names,
    decide_subnet,
    validate_host_names,
)
from localcluster.processes import (
    HostProcess,
    HostResult,
    LineEcho,
    build_nsenter_argv,
    kill_namespace_members,
    probe_pid_namespace,
    wait_for_namespaces_to_empty,
    probe_children,
)
from localcluster.requirements import probe_requirements
from localcluster.rootless import probe_in_user_namespace
from localcluster.teardown import remove_cluster_resources, remove_stale_clusters
from localcluster.workdir import ETC_SSH, host_home, write_workdir

HOSTINIT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hostinit.py")
READY_TIMEOUT = 20.0

ArgvFor = Sequence[str] | Callable[[str], Sequence[str]]
EnvFor = dict[str, str] | Callable[[str], dict[str, str]] | None


@dataclass
class _Init:
    popen: subprocess.Popen  # `ip netns exec ... unshare ...`, the init's parent
    pid: int | None  # the init itself (PID 1 inside the host); None until it said "ready"
    start: int | None
    pid_ns: str | None = None  # its PID namespace (/proc/<init>/ns/pid): every process of the host


class EmulatedCluster:
    def __init__(
        self,
        hosts: Sequence[str] | None = None,
        job: JobSpec | None = None,
        *,
        workdir: str | None = None,
        keep: bool = False,
        base_subnet: str = DEFAULT_BASE_SUBNET,
        echo: TextIO | None = None,
        python: str = sys.executable,
        ssh_seed: str | None = None,
    ):
        """hosts: names in creation order (default algo-1, algo-2). job: what /opt/ml holds.
        workdir: where the hosts' files go (kept afterwards; default a temp folder removed at
        teardown unless keep). echo: a stream that gets every host's output live, prefixed
        `[host] `. python: the interpreter whose bin folder leads PATH on the hosts.
        ssh_seed: a folder copied into every host's private /root/.ssh (like a key baked
        into an image)."""
        self.host_names = tuple(hosts) if hosts is not None else build_default_host_names(2)
        validate_host_names(self.host_names)
        self.job = job or JobSpec()
        validate_job(self.job, self.host_names)
        self.keep = keep or workdir is not None
        self.python = python
        self._workdir_arg = workdir
        self._base_subnet = base_subnet
        self._echo = LineEcho(echo) if echo is not None else None
        self._ssh_seed = ssh_seed
        self._plan: ClusterPlan | None = None
        self._layout: WorkdirLayout | None = None
        self._record: dict | None = None
        self._inits: dict[str, _Init] = {}
        self._down: set[str] = set()
        self._procs: list[HostProcess] = []
        self._started = False
        self._stopped = False
        self._rootless = False

    # ------------------------------------------------------------ lifecycle

    def __enter__(self) -> "EmulatedCluster":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> "EmulatedCluster":
        if self._started:
            raise ClusterError("this cluster was already started; make a new EmulatedCluster")
        self._started = True
        probe_requirements()
        self._rootless = probe_in_user_namespace()
        self._check_job_paths()
        with registry.registry_lock():
            remove_stale_clusters()
            records = registry.load_records()
            cluster_id = _new_cluster_id({r["id"] for r in records}, network.probe_link_names())
            subnet = decide_subnet(
                self._base_subnet, {r["subnet"] for r in records}, network.probe_networks_in_use()
            )
            self._plan = build_cluster_plan(cluster_id, self.host_names, subnet)
            workdir = self._workdir_arg or tempfile.mkdtemp(prefix=f"localcluster-{cluster_id}-")
            self._layout = WorkdirLayout(os.path.abspath(workdir))
            self._record = {
                "id": cluster_id,
                "owner_pid": os.getpid(),
                "owner_start": registry.probe_process_start(os.getpid()),
                "subnet": subnet,
                "bridge": self._plan.bridge,
                "netns": [h.netns for h in self._plan.hosts],
                "veths": [h.veth for h in self._plan.hosts],
                "inits": [],
                "workdir": self._layout.root,
                "keep": self.keep,
            }
            registry.write_record(self._record)
        try:
            self._prepare_workdir()
            # Under the lock: `ip netns add` racing another one can stack /run/netns mounts,
            # and /etc/netns may be removed by a cluster tearing down.
            with registry.registry_lock():
                network.start_network(self._plan)
            self._start_inits()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Remove everything: processes, namespaces, links, /etc/netns entries, the workdir
        (unless kept), the registry record. Safe to call twice, and after a failed start."""
        if self._stopped or self._record is None:
            self._stopped = True
            return
        self._stopped = True
        for init in self._inits.values():
            with contextlib.suppress(OSError, ValueError):
                if init.popen.stdin:
                    init.popen.stdin.close()  # the lifeline: the init exits on EOF
        registry.kill_processes([(i.pid, i.start) for i in self._inits.values() if i.pid is not None])
        for init in self._inits.values():
            # An init still starting exits at the EOF on its lifeline; unshare waits for it.
            try:
                init.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                init.popen.kill()
                init.popen.wait()
        for proc in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        with registry.registry_lock():
            remove_cluster_resources(self._record)

    # ------------------------------------------------------------ what the cluster is

    @property
    def plan(self) -> ClusterPlan:
        if self._plan is None:
            raise ClusterError("the cluster is not started")
        return self._plan

    @property
    def layout(self) -> WorkdirLayout:
        if self._layout is None:
            raise ClusterError("the cluster is not started")
        return self._layout

    @property
    def cluster_id(self) -> str:
        return self.plan.cluster_id

    @property
    def workdir(self) -> str:
        return self.layout.root

    def address(self, host: str) -> str:
        return self.plan.host(host).address

    def opt_ml(self, host: str) -> str:
        """The host's own /opt/ml tree on this machine (input/, output/)."""
        return self.layout.opt_ml(host)

    @property
    def model_dir(self) -> str:
        """/opt/ml/model of every host, on this machine."""
        return self.layout.shared_model

    def init_pid(self, host: str) -> int:
        return self._live_init(host).pid

    def is_up(self, host: str) -> bool:
        init = self._inits.get(host)
        return (
            init is not None
            and init.pid is not None
            and host not in self._down
            and registry.is_alive(init.pid, init.start)
        )

    # ------------------------------------------------------------ /opt/ml

    def write_opt_ml(self, job: JobSpec | None = None) -> None:
        """(Re)write every host's input/config files, e.g. new hyperparameters between runs.
        Mounts (code, channels) are fixed when the cluster starts."""
        if job is not None:
            validate_job(job, self.host_names)
            if (job.code_dir, job.channels) != (self.job.code_dir, self.job.channels):
                raise ClusterError("code_dir and channels are mounted at start; start a new cluster to change them")
            self.job = job
        for host in self.host_names:
            for rel, text in build_config_files(self.job, host, self.host_names).items():
                path = os.path.join(self.layout.opt_ml(host), rel)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w") as f:
                    f.write(text)

    # ------------------------------------------------------------ running commands

    def start_on(
        self,
        host: str,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str = "/",
        stop_host_on_exit: bool = False,
    ) -> HostProcess:
        """Start argv on one host, in all of its namespaces. env adds to the host's base
        environment (jobenv.py). stop_host_on_exit: when the command ends, kill everything
        else it left running on the host, as a container's processes end with it."""
        argv = _check_argv(argv)
        init = self._live_init(host)
        full_env = build_job_environment(
            host, os.path.dirname(self.python), self.job.job_name, self.job.region, env, home=self._home(host)
        )
        on_exit = (lambda pid=init.pid: kill_namespace_members(pid)) if stop_host_on_exit else None
        proc = HostProcess(
            host,
            build_nsenter_argv(init.pid, argv, cwd),
            full_env,
            log_path=self.layout.log(host),
            echo=self._echo,
            on_exit=on_exit,
        )
        self._procs.append(proc)
        return proc

    def run_on(
        self,
        host: str,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str = "/",
        timeout: float | None = 60.0,
    ) -> HostResult:
        """Run argv on one host and wait. On timeout the command is killed and
        subprocess.TimeoutExpired raised."""
        proc = self.start_on(host, argv, env=env, cwd=cwd)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
            raise

    def start_all(
        self,
        argv: ArgvFor,
        *,
        env: EnvFor = None,
        hosts: Sequence[str] | None = None,
        cwd: str = "/",
        stop_host_on_exit: bool = False,
    ) -> ClusterRun:
        """Start a command on every host (or `hosts`) at once. argv and env may be callables
        taking the host name, for per-host differences."""
        targets = tuple(hosts) if hosts is not None else self.host_names
        procs = {}
        for host in targets:
            host_argv = argv(host) if callable(argv) else argv
            host_env = env(host) if callable(env) else env
            procs[host] = self.start_on(host, host_argv, env=host_env, cwd=cwd, stop_host_on_exit=stop_host_on_exit)
        return ClusterRun(procs)

    def run_all(
        self,
        argv: ArgvFor,
        *,
        env: EnvFor = None,
        hosts: Sequence[str] | None = None,
        cwd: str = "/",
        timeout: float | None = 300.0,
        fail_fast: bool = True,
        grace: float = 10.0,
    ) -> ClusterResult:
        run = self.start_all(argv, env=env, hosts=hosts, cwd=cwd)
        return run.wait(timeout=timeout, fail_fast=fail_fast, grace=grace)

    def signal_all(self, sig: int) -> None:
        """Send sig to the main process of every command still running on any host."""
        for proc in self._procs:
            if proc.poll() is None:
                proc.send_signal(sig)

    # ------------------------------------------------------------ faults

    def kill_host(self, host: str, cut_network: bool = True) -> None:
        """The host dies: SIGKILL its init, which ends every process of the host at once.
        With cut_network (default) its cable is pulled first, so peers see silence (as when
        an instance disappears) rather than connections closed by a dying kernel."""
        init = self._live_init(host)
        if cut_network:
            self.disconnect(host)
        self._down.add(host)
        left = registry.kill_processes([(init.pid, init.start)])
        if left:
            raise ClusterError(f"{host}: init {init.pid} survived SIGKILL")
        with contextlib.suppress(subprocess.TimeoutExpired):
            init.popen.wait(timeout=5)
        left = wait_for_namespaces_to_empty({init.pid_ns} - {None})
        if left:
            raise ClusterError(f"{host}: processes {left} outlived its init")

    def disconnect(self, host: str) -> None:
        """Pull the host's network cable (its bridge-side veth goes down); it stays up."""
        network.set_link(self.plan.host(host).veth, up=False)

    def reconnect(self, host: str) -> None:
        network.set_link(self.plan.host(host).veth, up=True)

    # ------------------------------------------------------------ internals

    def _live_init(self, host: str) -> _Init:
        self.plan.host(host)  # KeyError with the list of hosts for a wrong name
        if self._stopped:
            raise ClusterError("the cluster has been torn down")
        if host in self._down:
            raise ClusterError(f"{host} is down (killed)")
        init = self._inits.get(host)
        if init is None or init.pid is None:
            raise ClusterError(f"{host} is not up yet")
        return init

    def _check_job_paths(self) -> None:
        for what, path in [("code_dir", self.job.code_dir)] + [
            (f"channel {c.name!r}", c.source) for c in self.job.channels
        ]:
            if path is not None and not os.path.isdir(path):
                raise ClusterError(f"{what}: {path} is not a folder")
        code, program = self.job.code_dir, self.job.program
        if code is not None and program is not None and not os.path.exists(os.path.join(code, program)):
            raise ClusterError(f"program {program!r} is not in the code folder {code}")

    def _prepare_workdir(self) -> None:
        write_workdir(self.layout, self.job, self.host_names, self._ssh_seed, self._rootless)
        self.write_opt_ml()

    def _home(self, host: str) -> str:
        return host_home(self.layout, host, self._rootless)

    def _host_spec(self, host: str) -> dict:
        mounts = build_job_mounts(self.job, self.layout, host) + build_private_mounts(
            self.layout, host, with_etc_ssh=os.path.isdir(ETC_SSH), with_root_ssh=not self._rootless,
            with_root_bashrc=os.path.isfile(ROOT_BASHRC),
        )
        return {"hostname": host, "mounts": [asdict(m) for m in mounts]}

    def _start_inits(self) -> None:
        pending = {}
        for h in self.plan.hosts:
            argv = [
                "ip", "netns", "exec", h.netns,
                "unshare", "--uts", "--ipc", "--mount", "--pid", "--fork", "--mount-proc",
                "--propagation", "private",
                self.python, "-I", "-S", HOSTINIT, json.dumps(self._host_spec(h.name)),
            ]  # fmt: skip
            pending[h.name] = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
            self._inits[h.name] = _Init(pending[h.name], None, None)
        deadline = time.monotonic() + READY_TIMEOUT
        for host, popen in pending.items():
            line = _read_line(popen, deadline)
            if line.strip() != "ready":
                rest = b""
                with contextlib.suppress(subprocess.TimeoutExpired):
                    rest, _ = popen.communicate(timeout=2)
                detail = (line + rest.decode("utf-8", "replace")).strip() or "no output"
                raise ClusterError(f"{host}: the host did not come up: {detail}")
            children = probe_children(popen.pid)
            if not children:
                raise ClusterError(f"{host}: the host's init vanished right after starting")
            assert popen.stdout is not None
            popen.stdout.close()
            self._inits[host] = _Init(popen, children[0], registry.probe_process_start(children[0]),
                                      probe_pid_namespace(children[0]))
        assert self._record is not None
        self._record["inits"] = [[i.pid, i.start, i.pid_ns] for i in self._inits.values()]
        registry.write_record(self._record)


def _read_line(popen: subprocess.Popen, deadline: float) -> str:
    assert popen.stdout is not None
    fd = popen.stdout.fileno()
    data = b""
    while not data.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            break
        chunk = os.read(fd, 1)
        if not chunk:
            break
        data += chunk
    return data.decode("utf-8", "replace")


def _check_argv(argv: Sequence[str]) -> list[str]:
    if isinstance(argv, (str, bytes)) or not all(isinstance(a, str) for a in argv) or not argv:
        raise TypeError(f"argv must be a non-empty list of strings (no shell here), got {argv!r}")
    return list(argv)


def _new_cluster_id(taken: set[str], links: set[str]) -> str:
    while True:
        cluster_id = secrets.token_hex(3)
        if cluster_id not in taken and not any(cluster_id in link for link in links):
            return cluster_id

"""End-to-end overhead of a multi-host job: ours (`python -m entrypoint train`) vs the
sagemaker-training toolkit, for mpirun and for torchrun, on emulated hosts (localcluster:
Linux namespaces, needs root); 2 hosts unless --hosts names other counts.

    .venv/bin/python benchmarks/multihost_overhead.py [--runs 5] [--mpi-toolkit-runs N]
        [--only mpi|torchrun] [--who ours|toolkit] [--hosts 2,4,8,16] [--timeline] [--trace]

For ours under mpirun it also reports the leader's serial time: the leader's own steps,
not counting the time it waits for the workers' own start-up (which runs on each worker's
machine, in parallel, on a real cluster) nor the script. See LEADER_STEPS.

overhead = wall time of the whole job (from starting the container command on every host
until every host has exited) - the script's own time (from the first rank's first line to
the last rank's last line; each rank writes both timestamps into the shared model dir).
For torchrun the goal counts what is beyond one `import torch` (torchrun imports torch
before any rank starts), measured here as `python -c "import torch"` between the runs.

What runs on each host (the same /opt/ml, hyperparameters and trivial script for both):
- mpirun, ours:     python -m entrypoint train
- mpirun, toolkit:  .venv/bin/train (sagemaker_training.trainer, its MPI runner). It needs
  passwordless root SSH in place (AWS bakes one key pair into the image): one key pair made
  here is copied into every host's /root/.ssh (ssh_seed), for both sides alike.
- torchrun, ours:     python -m entrypoint train
- torchrun, toolkit:  .venv/bin/train with SAGEMAKER_TRAINING_MODULE naming
  toolkit_torch_main below, as the PyTorch DLC names sagemaker_pytorch_container.training:main
  (that framework toolkit is not installed; toolkit_torch_main does what it does for
  torch_distributed: wait for the host names, set the NCCL/MASTER_* variables, and run the
  script through the toolkit's entry_point.run with its TorchDistributedRunner).

Runs alternate ours/toolkit after one discarded warm-up run of each. --trace adds, for
finding where the time goes, every process the hosts start and end (with its CPU time) and
a table of marks; it costs CPU itself, so use untraced runs for the numbers. Not part of
the test suite (nothing under tests/ imports it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH_DIR = Path(__file__).resolve().parent
VENV_BIN = Path(sys.executable).parent
DEFAULT_HOSTS = 2


def build_host_names(count: int) -> list[str]:
    return [f"algo-{i}" for i in range(1, count + 1)]

TOOLKIT_DONE_FILE = "/tmp/done.algo-1"  # the toolkit's MPI status file (/tmp is shared here)
GOALS = {"mpi": 3.0, "torchrun": 1.0}  # s: ours mpirun overhead; ours torchrun beyond import torch

# The trivial scripts: each rank notes when its first and last lines ran (wall clock: one
# kernel, one clock for every emulated host) and does one collective so both hosts take part.
MPI_SCRIPT = '''\
import time
_start = time.time()
import json, os, socket
from mpi4py import MPI
comm = MPI.COMM_WORLD
total = comm.allreduce(comm.Get_rank() + 1)
comm.Barrier()
record = {"rank": comm.Get_rank(), "host": socket.gethostname(), "sum": total, "start": _start, "end": time.time(),
          "cpu": sum(os.times()[:2])}
with open(os.path.join(os.environ["SM_MODEL_DIR"], "timing-%d.json" % comm.Get_rank()), "w") as f:
    json.dump(record, f)
'''

TORCH_SCRIPT = '''\
import time
_start = time.time()
import json, os, socket
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
dist.barrier()
rank = dist.get_rank()
dist.destroy_process_group()
record = {"rank": rank, "host": socket.gethostname(), "sum": t.item(), "start": _start, "end": time.time()}
with open(os.path.join(os.environ["SM_MODEL_DIR"], "timing-%d.json" % rank), "w") as f:
    json.dump(record, f)
'''

SCRIPTS = {"mpi": ("bench_mpi.py", MPI_SCRIPT), "torchrun": ("bench_torch.py", TORCH_SCRIPT)}
DISTRIBUTIONS = {"mpi": "mpi", "torchrun": "torch_distributed"}
HYPERPARAMETERS = {"epochs": 1, "lr": 0.1}


# ---------------------------------------------------------------- the toolkit's torchrun driver


def toolkit_torch_main() -> None:
    """Runs on each host under the toolkit's `train` (SAGEMAKER_TRAINING_MODULE points here),
    doing what the PyTorch framework toolkit's training.main does for torch_distributed.
    The toolkit imports this module: only the standard library at its top level."""
    import socket

    from sagemaker_training import entry_point, environment, runner

    env = environment.Environment()
    for host in env.hosts:  # the framework toolkit's DNS wait; names resolve at once here
        socket.gethostbyname(host)
    os.environ["NCCL_SOCKET_IFNAME"] = env.network_interface_name
    os.environ["NCCL_IB_DISABLE"] = "1"
    os.environ["NCCL_DEBUG"] = "WARN"
    os.environ["MASTER_ADDR"] = env.master_hostname
    os.environ["MASTER_PORT"] = "7777"
    # runner.get builds TorchDistributedRunner(entry point, args, env vars, processes_per_host
    # = GPUs or Neuron cores or 1 (so 1 here), env.master_hostname, env.distribution_hosts,
    # env.current_host, env.network_interface_name, instance_type=env.current_instance_type).
    entry_point.run(
        uri=env.module_dir,
        user_entry_point=env.user_entry_point,
        args=env.to_cmd_args(),
        env_vars=env.to_env_vars(),
        capture_error=True,
        runner_type=runner.RunnerType.TorchDistributed,
    )


# ---------------------------------------------------------------- what one run is


@dataclass(frozen=True)
class Side:
    launcher: str  # mpi | torchrun
    who: str  # ours | toolkit
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    timeout_s: float


@dataclass(frozen=True)
class RunResult:
    side: Side
    wall_s: float
    script_s: float
    timeline: tuple[tuple[float, str, str], ...]  # (seconds since start, host, line), in order
    script_start_s: float  # since start
    script_end_s: float
    host_exit_s: tuple[tuple[str, float], ...]
    load: float  # 1-minute load average when the run ended
    leader_rank_cpu_s: float = float("nan")  # the CPU of the rank on the leader host, to its last line

    @property
    def overhead_s(self) -> float:
        return self.wall_s - self.script_s


def build_sides() -> dict[tuple[str, str], Side]:
    ours = (sys.executable, "-m", "entrypoint", "train")
    toolkit = (str(VENV_BIN / "train"),)
    torch_driver = (
        ("SAGEMAKER_TRAINING_MODULE", f"{Path(__file__).stem}:toolkit_torch_main"),
        ("PYTHONPATH", str(BENCH_DIR)),
    )
    return {
        # Ours from this checkout, whichever one the venv's editable install points at.
        ("mpi", "ours"): Side("mpi", "ours", ours, (("PYTHONPATH", str(REPO)),), 180),
        # The toolkit's leader and worker each sleep 30 s by design after mpirun.
        ("mpi", "toolkit"): Side("mpi", "toolkit", toolkit, (), 400),
        ("torchrun", "ours"): Side("torchrun", "ours", ours, (("PYTHONPATH", str(REPO)),), 180),
        ("torchrun", "toolkit"): Side("torchrun", "toolkit", toolkit, torch_driver, 180),
    }


def build_job(launcher: str, code_dir: str):
    from localcluster import JobSpec

    return JobSpec(
        job_name=f"bench-{launcher}",
        hyperparameters=HYPERPARAMETERS,
        program=SCRIPTS[launcher][0],
        code_dir=code_dir,
        distribution=DISTRIBUTIONS[launcher],
        processes_per_host=1 if launcher == "mpi" else None,
    )


def write_code(code_dir: Path) -> None:
    code_dir.mkdir(parents=True, exist_ok=True)
    for name, text in SCRIPTS.values():
        (code_dir / name).write_text(text)


def write_ssh_seed(folder: Path, kex_algorithms: str | None = None) -> None:
    """One key pair trusted by every host, as the toolkit's images bake in. kex_algorithms:
    the clients' KexAlgorithms (default: OpenSSH's own)."""
    folder.mkdir(mode=0o700, parents=True)
    key = folder / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "bench", "-f", str(key)],
                   check=True, stdin=subprocess.DEVNULL)  # fmt: skip
    shutil.copyfile(str(key) + ".pub", folder / "authorized_keys")
    kex = f"  KexAlgorithms {kex_algorithms}\n" if kex_algorithms else ""
    (folder / "config").write_text("Host *\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n" + kex)
    for path in folder.iterdir():
        os.chmod(path, 0o600)


class TimedLines:
    """The cluster's echo stream: notes when each `[host] line` arrived."""

    def __init__(self) -> None:
        self.lines: list[tuple[float, str, str]] = []

    def write(self, text: str) -> None:
        now = time.monotonic()
        for line in text.splitlines():
            host, _, rest = line.partition("] ")
            self.lines.append((now, host.lstrip("["), rest))

    def flush(self) -> None:
        pass


class ProcessTrace:
    """With --trace: a thread that lists the hosts' processes every 10 ms and notes when each
    command line appeared (+) and vanished (-), with the CPU time it had used by then. An
    outside view: nothing in the launchers changes."""

    TICK = os.sysconf("SC_CLK_TCK")

    def __init__(self, namespaces: dict[str, str], every_s: float = 0.01):
        self.namespaces = namespaces  # pid namespace link -> host
        self.every_s = every_s
        self.events: list[tuple[float, str, str]] = []
        # (pid, start time) -> [host, command line, CPU seconds]; host "" = not one of ours
        self._seen: dict[tuple[int, str], list] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _look(self, pid: str, now: float) -> tuple[int, str] | None:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        key = (int(pid), fields[19])
        info = self._seen.get(key)
        if info is None:
            info = self._seen[key] = [self.namespaces.get(os.readlink(f"/proc/{pid}/ns/pid"), ""), "", 0.0]
        if not info[0]:
            return None
        info[2] = (int(fields[11]) + int(fields[12])) / self.TICK
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = _short_cmdline(f.read())
        if cmd == "hostinit":
            info[0] = ""
            return None
        if cmd == "(exited)":  # a zombie: it has ended, its parent has not reaped it yet
            if info[1]:
                self.events.append((now, info[0], f"- {info[1]}  [cpu {info[2]:.2f} s]"))
            info[0] = ""
            return None
        if cmd != info[1]:  # new, or exec'd into another program
            if info[1]:
                self.events.append((now, info[0], f"- {info[1]}"))
            self.events.append((now, info[0], f"+ {cmd}"))
            info[1] = cmd
        return key

    def _watch(self) -> None:
        while not self._stop.is_set():
            now, alive = time.monotonic(), set()
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    try:
                        key = self._look(entry, now)
                    except (OSError, IndexError, ValueError):
                        continue
                    if key is not None:
                        alive.add(key)
            for key, info in self._seen.items():
                if info[0] and info[1] and key not in alive:
                    self.events.append((now, info[0], f"- {info[1]}  [cpu {info[2]:.2f} s]"))
                    info[0] = ""
            self._stop.wait(self.every_s)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def _short_cmdline(raw: bytes) -> str:
    parts = [p.decode(errors="replace") for p in raw.split(b"\0") if p]
    if not parts:
        return "(exited)"
    if any(p.endswith("hostinit.py") for p in parts):
        return "hostinit"
    if len(parts) > 2 and parts[1] == "-c" and os.path.basename(parts[0]).startswith("python"):  # too long to show
        parts = [parts[0], "-c", "CODE", *parts[3:]]
    words: list[str] = []
    for p in parts:
        if p.startswith("-mca") or len(" ".join(words)) > 90:
            words.append("...")
            break
        words.append(os.path.basename(p) if p.startswith("/") else p)
    return " ".join(words).replace("\n", " ")


def load_script_span(model_dir: str) -> tuple[float, float, int, float]:
    """(first rank's start, last rank's end, ranks, the CPU of the leader host's rank: NaN when
    it did not say) from the timing files, wall clock."""
    records = []
    for name in os.listdir(model_dir):
        if name.startswith("timing-"):
            with open(os.path.join(model_dir, name)) as f:
                records.append(json.load(f))
    if not records:
        raise RuntimeError(f"no timing-*.json in {model_dir}: the script did not finish")
    leader_cpu = [r["cpu"] for r in records if r.get("host") == LEADER and "cpu" in r]
    return (min(r["start"] for r in records), max(r["end"] for r in records), len(records),
            sum(leader_cpu) if leader_cpu else float("nan"))


def clear_model_dir(model_dir: str) -> None:
    for name in os.listdir(model_dir):
        path = os.path.join(model_dir, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        else:
            os.remove(path)


def run_once(cluster, side: Side, lines: TimedLines, trace: bool = False) -> RunResult:
    from localcluster.multirun import ClusterRun

    clear_model_dir(cluster.model_dir)
    if os.path.exists(TOOLKIT_DONE_FILE):
        os.remove(TOOLKIT_DONE_FILE)
    lines.lines.clear()
    tracer = None
    if trace:
        tracer = ProcessTrace({os.readlink(f"/proc/{cluster.init_pid(h)}/ns/pid"): h for h in cluster.host_names})
    procs, started = {}, {}
    clock_offset = time.time() - time.monotonic()
    for host in cluster.host_names:
        argv = list(side.argv)
        if host == LEADER and side.who == "ours" and os.path.exists(GNU_TIME):
            # The leader's CPU time, its children's included (ssh clients, mpirun and its ssh
            # clients): GNU time, a small C program, so the start is not slowed.
            argv = [GNU_TIME, "-f", LEADER_CPU_FORMAT, *argv]
        started[host] = time.monotonic()
        # stop_host_on_exit: what the command leaves running (sshd) ends with it, as in a container.
        procs[host] = cluster.start_on(host, argv, env=dict(side.env), stop_host_on_exit=True)
    t0 = min(started.values())
    result = ClusterRun(procs).wait(timeout=side.timeout_s, fail_fast=True, grace=10)
    if tracer is not None:
        tracer.close()
    if not result.ok:
        tails = "\n".join(f"--- {h}\n{r.output[-4000:]}" for h, r in result.results.items())
        raise RuntimeError(f"{side.launcher}/{side.who} run failed ({result.stop_reason or 'a host failed'}):\n{tails}")
    # HostResult.seconds runs from just before the host's process started to its exit.
    ends = {h: started[h] + r.seconds for h, r in result.results.items()}
    first, last, ranks, leader_rank_cpu = load_script_span(cluster.model_dir)
    if ranks != len(cluster.host_names):
        raise RuntimeError(f"{side.launcher}/{side.who}: {ranks} rank(s) reported, expected {len(cluster.host_names)}")
    events = lines.lines + (tracer.events if tracer else [])
    events.sort(key=lambda e: e[0])
    return RunResult(
        side=side,
        wall_s=max(ends.values()) - t0,
        script_s=last - first,
        timeline=tuple((t - t0, h, text) for t, h, text in events),
        script_start_s=first - clock_offset - t0,
        script_end_s=last - clock_offset - t0,
        host_exit_s=tuple((h, e - t0) for h, e in ends.items()),
        load=os.getloadavg()[0],
        leader_rank_cpu_s=leader_rank_cpu,
    )


def probe_torch_import() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True, cwd="/")
    return time.perf_counter() - start


# ---------------------------------------------------------------- where the time goes (--trace)

# Marks in a traced run: (name, regex over the timeline's lines, first or last match). Process
# events read "+ cmd" / "- cmd"; the others are the launchers' own log lines.
LAUNCHER = r"(mpirun|torch\.distributed\.run|torchrun) "
RANK = r"(record_errors\.py|mpi4py|-u bench_torch\.py) "
MARKS = (
    ("leader: job port open, waiting for the workers", r"\[entrypoint\] waiting for \d+ worker\(s\) to serve SSH|Waiting for MPI workers to establish", "first"),
    ("worker: trusts the leader, sshd up", r"\[entrypoint\] .*serving SSH to the leader|MPI Master online", "first"),
    ("leader: every worker is ready", r"\[entrypoint\] every worker is ready|Worker algo-2 available", "first"),
    ("launcher (mpirun/torchrun) started", rf"^\+ .*{LAUNCHER}", "first"),
    ("last rank process started", rf"^\+ .*{RANK}", "last"),
    ("script's first line", None, "script_start"),
    ("script's last line", None, "script_end"),
    ("last rank process gone", rf"^- .*{RANK}", "last"),
    ("launcher gone", rf"^- .*{LAUNCHER}", "last"),
    ("first host's command exited", None, "first_exit"),
    ("last host's command exited", None, "last_exit"),
)  # fmt: skip
HOST_COMMAND_CPU = r"^- python (-m entrypoint |-c CODE )?train  \[cpu ([0-9.]+) s\]"


def build_marks(r: RunResult) -> dict[str, float]:
    """When each mark happened in one traced run (seconds since start); absent ones left out."""
    special = {
        "script_start": r.script_start_s,
        "script_end": r.script_end_s,
        "first_exit": min(t for _, t in r.host_exit_s),
        "last_exit": max(t for _, t in r.host_exit_s),
    }
    found = {}
    for name, pattern, which in MARKS:
        if pattern is None:
            found[name] = special[which]
            continue
        times = [t for t, _, text in r.timeline if re.search(pattern, text)]
        if times:
            found[name] = times[0] if which == "first" else times[-1]
    return found


def format_phases(runs: list[RunResult]) -> str:
    """Median time of each mark and median time since the previous mark, over traced runs;
    then the CPU time of each host's container command."""
    traced = [r for r in runs if any(text.startswith("+ ") for _, _, text in r.timeline)]
    if not traced:
        return ""
    marks = [build_marks(r) for r in traced]
    names = [name for name, _, _ in MARKS if all(name in m for m in marks)]
    lines = [f"    {'mark (medians of ' + str(len(traced)) + ' traced runs)':<44} {'at, s':>7} {'since previous':>15}"]
    for i, name in enumerate(names):
        at = statistics.median(m[name] for m in marks)
        delta = statistics.median(m[name] - m[names[i - 1]] for m in marks) if i else at
        lines.append(f"    {name:<44} {at:7.2f} {delta:15.2f}")
    cpu: dict[str, list[float]] = {}
    for r in traced:
        last: dict[str, float] = {}  # the main process ends last (its forks end before exec)
        for _, host, text in r.timeline:
            match = re.search(HOST_COMMAND_CPU, text)
            if match:
                last[host] = float(match.group(2))
        for host, seconds in last.items():
            cpu.setdefault(host, []).append(seconds)
    if cpu:
        lines.append("    CPU time of the container command's own process, median: "
                     + ", ".join(f"{h} {statistics.median(v):.2f} s" for h, v in sorted(cpu.items())))  # fmt: skip
    return "\n".join(lines)


# ---------------------------------------------------------------- the leader's serial time

# Ours under mpirun, from the hosts' log lines (no tracer needed). With one machine per host
# the workers' start-up overlaps the leader's; what stays on the critical path is the
# leader's own steps, one after another:
LEADER_STEPS = (
    ("start", "leader's start until it waits for the workers (interpreter, /opt/ml, host key, job port)"),
    ("probe", "last worker ready (serving SSH, every key trusted) until the leader knows it (job port)"),
    ("launch", "mpirun started until the script's first line (orted as a tree over SSH, ranks start)"),
    ("finish", "script's last line until mpirun reports (MPI_Finalize, orteds end)"),
    ("tell", "mpirun reported until the leader's command exited (the outcome to every worker's job port)"),
)
LEADER = "algo-1"
GNU_TIME = "/usr/bin/time"
LEADER_CPU_FORMAT = "BENCH leader cpu %U %S"


def _first(r: RunResult, host: str | None, pattern: str) -> float | None:
    for t, h, text in r.timeline:
        if (host is None or h == host) and re.search(pattern, text):
            return t
    return None


def build_leader_steps(r: RunResult) -> dict[str, float] | None:
    """Seconds of each LEADER_STEPS step in one run of ours under mpirun; None if a line is
    missing (another launcher, or the toolkit)."""
    probing = _first(r, LEADER, r"\[entrypoint\] waiting for \d+ worker\(s\) to serve SSH")
    accepted = _first(r, LEADER, r"\[entrypoint\] every worker is ready")
    launched = _first(r, LEADER, r"\[entrypoint\] .*: running mpirun on")
    reported = _first(r, LEADER, r"\[entrypoint\] .*: mpirun on .* (succeeded|failed)")
    ready = [t for t, h, text in r.timeline if h != LEADER and "serving SSH to the leader" in text]
    if None in (probing, accepted, launched, reported) or not ready:
        return None
    leader_exit = dict(r.host_exit_s)[LEADER]
    cpu = [text.split()[-2:] for _, h, text in r.timeline if h == LEADER and text.startswith("BENCH leader cpu ")]
    return {
        "cpu": float(cpu[0][0]) + float(cpu[0][1]) if cpu else float("nan"),
        "rank_cpu": r.leader_rank_cpu_s,
        "start": probing,
        "probe": max(0.0, accepted - max(max(ready), probing)),
        "launch": r.script_start_s - launched,
        "finish": reported - r.script_end_s,
        "tell": leader_exit - reported,
    }


def format_leader_steps(runs: list[RunResult]) -> list[str]:
    steps = [s for s in (build_leader_steps(r) for r in runs) if s]
    if not steps:
        return []
    medians = {name: statistics.median(s[name] for s in steps) for name, _ in LEADER_STEPS}
    serial = statistics.median(sum(s[name] for name, _ in LEADER_STEPS) for s in steps)
    cpu = statistics.median(s["cpu"] for s in steps)
    # The launcher's part: the leader's CPU less its own rank's (the script's, and its wait in
    # MPI's collectives for the slower hosts' ranks: spinning, while 2 cores run every host).
    launcher = statistics.median(s["cpu"] - s["rank_cpu"] for s in steps)
    parts = "  ".join(f"{name} {medians[name]:.2f}" for name, _ in LEADER_STEPS)
    return [f"leader's serial time {serial:5.2f} s  ({parts})  leader's CPU {cpu:.2f} s"
            f" (its rank's excluded: {launcher:.2f} s)"]


# ---------------------------------------------------------------- reporting


def format_run(r: RunResult) -> str:
    return (
        f"  {r.side.who:<7} wall {r.wall_s:6.2f} s  script {r.script_s:5.2f} s  "
        f"overhead {r.overhead_s:6.2f} s  (load {r.load:.1f})"
    )


LAUNCHER_LINE = re.compile(r"^(\[entrypoint\] |[+-] |\d{4}-\d\d-\d\d [\d:,]+ sagemaker-training-toolkit |Traceback)")
# The toolkit logs these on every Environment() it builds: no time passes there.
TOOLKIT_NOISE = re.compile(r"No (GPUs|Neurons) detected|Exceptions not imported|smdistributed.dataparallel not found")


def format_timeline(r: RunResult, launcher_lines_only: bool = False) -> str:
    """Every line with its arrival time, plus the script's span and each host's exit.
    launcher_lines_only: only the launchers' own log lines and process events."""
    # sshd retitles its listener on every connection: not a process event.
    events = [e for e in r.timeline if "[listener]" not in e[2]]
    if launcher_lines_only:
        events = [e for e in events if LAUNCHER_LINE.match(e[2]) and not TOOLKIT_NOISE.search(e[2])]
    events.append((r.script_start_s, "*", "script: first rank's first line"))
    events.append((r.script_end_s, "*", "script: last rank's last line"))
    events += [(t, h, "host's command exited") for h, t in r.host_exit_s]
    events.sort(key=lambda e: e[0])
    return "\n".join(f"    {t:7.3f}  {h:<7} {text[:150]}" for t, h, text in events)


def pick_median_run(runs: list[RunResult]) -> RunResult:
    ordered = sorted(runs, key=lambda r: r.overhead_s)
    return ordered[(len(ordered) - 1) // 2]


def build_summary(launcher: str, results: dict[str, list[RunResult]], torch_import_s: float | None,
                  hosts: int = DEFAULT_HOSTS) -> list[str]:
    out = []
    label = f"{hosts:>2} hosts  "
    for who in ("ours", "toolkit"):
        runs = results.get(who)
        if not runs:
            continue
        over = [r.overhead_s for r in runs]
        line = (
            f"{label}{launcher:<8} {who:<7} runs {len(runs)}  wall {statistics.median(r.wall_s for r in runs):6.2f} s  "
            f"script {statistics.median(r.script_s for r in runs):5.2f} s  overhead {statistics.median(over):6.2f} s "
            f"(min {min(over):.2f}, max {max(over):.2f})"
        )
        if torch_import_s is not None:
            line += f"  beyond import torch {statistics.median(over) - torch_import_s:5.2f} s"
        out.append(line)
        if who == "ours" and launcher == "mpi":
            out += [f"{label}{launcher:<8} {who:<7} {text}" for text in format_leader_steps(runs)]
    if results["ours"] and hosts == DEFAULT_HOSTS:
        over = statistics.median(r.overhead_s for r in results["ours"])
        if launcher == "mpi":
            verdict = "met" if over <= GOALS["mpi"] else "MISSED"
            out.append(f"{launcher:<8} goal: ours overhead <= {GOALS['mpi']:g} s: {verdict} ({over:.2f} s)")
        elif torch_import_s is not None:
            beyond = over - torch_import_s
            verdict = "met" if beyond <= GOALS["torchrun"] else "MISSED"
            out.append(f"{launcher:<8} goal: ours overhead beyond import torch <= {GOALS['torchrun']:g} s: {verdict} ({beyond:.2f} s)")
    return out


# ---------------------------------------------------------------- main


def bench_launcher(
    cluster, launcher: str, runs: dict[str, int], lines: TimedLines, code_dir: str, args, torch_imports: list[float]
) -> dict[str, list[RunResult]]:
    sides = build_sides()
    cluster.write_opt_ml(build_job(launcher, code_dir))
    order = tuple(who for who in ("ours", "toolkit") if runs[who])
    results: dict[str, list[RunResult]] = {who: [] for who in ("ours", "toolkit")}
    print(f"== {launcher}: warm-up (one run each, not counted)", flush=True)
    for who in order:
        print(format_run(run_once(cluster, sides[(launcher, who)], lines)) + "  [warm-up]", flush=True)
    print(f"== {launcher}: " + ", ".join(f"{runs[who]} runs {who}" for who in order)
          + (", alternating" if len(order) > 1 else ""), flush=True)
    for i in range(max(runs.values())):
        if launcher == "torchrun":
            # Between the runs, under the same load as the runs.
            torch_imports.append(probe_torch_import())
            print(f"  python -c 'import torch': {torch_imports[-1]:.2f} s", flush=True)
        for who in order:
            if i >= runs[who]:
                continue
            r = run_once(cluster, sides[(launcher, who)], lines, args.trace)
            results[who].append(r)
            print(format_run(r), flush=True)
            if args.timeline:
                print(format_timeline(r), flush=True)
    for who in order:
        if results[who]:
            print(f"-- {launcher}/{who}: timeline of the median run (s since start; * = from the timing files)")
            print(format_timeline(pick_median_run(results[who]), launcher_lines_only=True), flush=True)
            phases = format_phases(results[who])
            if phases:
                print(f"-- {launcher}/{who}: where the time goes")
                print(phases, flush=True)
    return results


def parse_host_counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected host counts like 2,4,8,16, got {text!r}") from None
    if any(c < 2 or c > 64 for c in counts):
        raise argparse.ArgumentTypeError(f"host counts must be 2 to 64 (got {text})")
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per side (default 5)")
    parser.add_argument("--mpi-toolkit-runs", type=int, default=None,
                        help="runs of the toolkit's mpirun flow, ~35 s each (default: --runs)")  # fmt: skip
    parser.add_argument("--only", choices=("mpi", "torchrun"), help="one launcher only")
    parser.add_argument("--who", choices=("ours", "toolkit"), help="one side only (default: both, alternating)")
    parser.add_argument("--hosts", type=parse_host_counts, default=(DEFAULT_HOSTS,),
                        help="host counts, comma-separated, e.g. 2,4,8,16: one cluster each (default 2)")
    parser.add_argument("--timeline", action="store_true", help="print every run's timeline")
    parser.add_argument("--trace", action="store_true",
                        help="add the hosts' processes (+ started, - ended) to the timelines; costs CPU itself")  # fmt: skip
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("multihost_overhead: needs root (emulated hosts are Linux namespaces)", file=sys.stderr)
        return 2

    from localcluster import EmulatedCluster

    launchers = (args.only,) if args.only else ("mpi", "torchrun")
    toolkit_mpi_runs = args.mpi_toolkit_runs if args.mpi_toolkit_runs is not None else args.runs
    runs = {"mpi": {"ours": args.runs, "toolkit": toolkit_mpi_runs}, "torchrun": {"ours": args.runs, "toolkit": args.runs}}
    if args.who:
        for per_side in runs.values():
            for who in per_side:
                per_side[who] = per_side[who] if who == args.who else 0
    python = os.path.relpath(sys.executable, REPO) if sys.executable.startswith(str(REPO)) else sys.executable
    print(f"command: {python} {os.path.relpath(__file__, REPO)} {' '.join(sys.argv[1:])}".rstrip())
    print(f"machine: {os.cpu_count()} CPUs, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)

    summary: list[str] = []
    torch_imports: list[float] = []
    lines = TimedLines()
    with tempfile.TemporaryDirectory(prefix="bench-multihost-") as tmp:
        code_dir = Path(tmp) / "code"
        write_code(code_dir)
        seed = Path(tmp) / "ssh-seed"
        write_ssh_seed(seed)
        if "torchrun" in launchers:
            probe_torch_import()  # warm the page cache
        try:
            for count in args.hosts:
                hosts = build_host_names(count)
                with EmulatedCluster(hosts, build_job(launchers[0], str(code_dir)), echo=lines, ssh_seed=str(seed)) as cluster:
                    print(f"cluster {cluster.cluster_id}: {', '.join(f'{h}={cluster.address(h)}' for h in hosts)}", flush=True)
                    for launcher in launchers:
                        results = bench_launcher(cluster, launcher, runs[launcher], lines, str(code_dir), args, torch_imports)
                        torch_import = statistics.median(torch_imports) if launcher == "torchrun" and torch_imports else None
                        summary += build_summary(launcher, results, torch_import, count)
        finally:
            if os.path.exists(TOOLKIT_DONE_FILE):
                os.remove(TOOLKIT_DONE_FILE)
    print("== summary (medians; overhead = wall - script)" + ("; TRACED runs (perturbed)" if args.trace else ""))
    if torch_imports:
        print(f"python -c 'import torch': median {statistics.median(torch_imports):.2f} s of {len(torch_imports)} "
              f"(min {min(torch_imports):.2f}, max {max(torch_imports):.2f})")  # fmt: skip
    print("\n".join(summary))
    if any(line for line in summary if "leader's serial time" in line):
        print("leader's steps (s): " + "; ".join(f"{name} = {what}" for name, what in LEADER_STEPS))
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the cluster's teardown runs on SIGTERM too
    sys.exit(main())

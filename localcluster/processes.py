"""Processes on emulated hosts: start them with nsenter, stream and keep their output, wait,
signal, and find what runs inside a host's PID namespace."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, TextIO

# How long to keep reading a host's output after its main process exits: a background
# process it left behind may hold the pipe open for good.
OUTPUT_DRAIN_SECONDS = 0.5


@dataclass(frozen=True)
class HostResult:
    host: str
    returncode: int  # negative: killed by that signal
    output: str  # stdout and stderr together, as they came
    seconds: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def describe(self) -> str:
        return describe_returncode(self.returncode)


def describe_returncode(returncode: int) -> str:
    if returncode >= 0:
        return f"exit {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"killed by {name}"


def build_nsenter_argv(init_pid: int, argv: list[str] | tuple[str, ...], cwd: str) -> list[str]:
    """Enter every namespace of the host whose init is `init_pid`; `--wdns` resolves the working
    folder inside the host's mount namespace."""
    return ["nsenter", "-t", str(init_pid), "-n", "-u", "-i", "-m", "-p", f"--wdns={cwd}", "--", *argv]


class LineEcho:
    """Writes whole lines from many hosts to one stream, each with a `[host] ` prefix."""

    def __init__(self, stream: TextIO):
        self._stream = stream
        self._lock = threading.Lock()

    def write(self, host: str, line: str) -> None:
        if not line.endswith("\n"):
            line += "\n"
        with self._lock:
            self._stream.write(f"[{host}] {line}")
            self._stream.flush()


class HostProcess:
    """One command running on one host (through nsenter, in its own session so that a Ctrl-C
    at the terminal reaches only the controller, which then decides what the hosts get)."""

    def __init__(
        self,
        host: str,
        argv: list[str],
        env: dict[str, str],
        log_path: str | None = None,
        echo: LineEcho | None = None,
        on_exit: Callable[[], None] | None = None,
    ):
        self.host = host
        self.argv = list(argv)
        self._lines: list[str] = []
        self._lock = threading.Lock()
        # Notified on each line read and when the process ends: wait_for_text waits on it.
        self._changed = threading.Condition(self._lock)
        self._reader_done = False  # the output's end read (after the exit, or the pipe closed)
        self._echo = echo
        self._on_exit = on_exit
        self._log = open(log_path, "a", encoding="utf-8") if log_path else None
        self._started = time.monotonic()
        self._ended: float | None = None
        self._popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, name=f"output-{host}", daemon=True)
        self._reader.start()
        self._waiter = threading.Thread(target=self._wait, name=f"wait-{host}", daemon=True)
        self._waiter.start()

    def _read(self) -> None:
        assert self._popen.stdout is not None
        for raw in iter(self._popen.stdout.readline, b""):
            line = raw.decode("utf-8", "replace")
            with self._lock:
                self._lines.append(line)
                if self._log is not None:
                    self._log.write(line)
                    self._log.flush()
                self._changed.notify_all()
            if self._echo is not None:
                self._echo.write(self.host, line)
        self._popen.stdout.close()
        with self._lock:
            if self._log is not None:
                self._log.close()
                self._log = None
            self._reader_done = True
            self._changed.notify_all()

    def _wait(self) -> None:
        self._popen.wait()
        self._ended = time.monotonic()
        with self._changed:
            self._changed.notify_all()
        if self._on_exit is not None:
            self._on_exit()

    @property
    def pid(self) -> int:
        """The nsenter process (outside the host)."""
        return self._popen.pid

    @property
    def output(self) -> str:
        with self._lock:
            return "".join(self._lines)

    def wait_for_text(self, text: str, timeout: float) -> bool:
        """Whether the output holds `text` (within one line) by `timeout` seconds from now:
        woken by each line read, not polling; False at once when its output has ended
        without it."""
        deadline = time.monotonic() + timeout
        seen = 0  # lines already looked at: each is looked at once
        with self._changed:
            while True:
                if any(text in line for line in self._lines[seen:]):
                    return True
                seen = len(self._lines)
                left = deadline - time.monotonic()
                if self._reader_done or left <= 0:
                    return False
                self._changed.wait(left)

    def lines_from(self, index: int) -> list[str]:
        """The output's lines from the index-th on, each as it was read (whole; the last one at
        the end may lack its newline): a watcher of a long job's output copies only what is new,
        not the whole output each time it looks (that took a share of a core from the job)."""
        with self._lock:
            return self._lines[index:]

    def poll(self) -> int | None:
        if self._waiter.is_alive():
            return None
        return self._popen.returncode

    def job_pid(self, timeout: float = 2.0) -> int | None:
        """The command's own process (nsenter's child, inside the host), or None once it ended."""
        deadline = time.monotonic() + timeout
        while True:
            children = probe_children(self._popen.pid)
            if children:
                return children[0]
            if self._popen.poll() is not None or time.monotonic() > deadline:
                return None
            time.sleep(0.005)

    def send_signal(self, sig: int) -> bool:
        """Signal the command's main process, as `docker stop` signals a container's process.
        nsenter forwards nothing itself, and must live on to report the exit status."""
        pid = self.job_pid()
        if pid is None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
            return True
        return False

    def wait(self, timeout: float | None = None) -> HostResult:
        self._waiter.join(timeout)
        if self._waiter.is_alive():
            raise subprocess.TimeoutExpired(self.argv, timeout)
        self._reader.join(OUTPUT_DRAIN_SECONDS)
        assert self._ended is not None
        return HostResult(
            host=self.host,
            returncode=self._popen.returncode,
            output=self.output,
            seconds=self._ended - self._started,
        )


def probe_children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except FileNotFoundError:
        return []
    except OSError:
        pass
    # Kernels without CONFIG_PROC_CHILDREN: scan for processes whose parent is pid.
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
                found.append(int(entry))
    return found


def probe_descendants(pid: int) -> list[int]:
    """pid's children, theirs, and so on (those that have not been adopted elsewhere)."""
    found, todo = [], [pid]
    while todo:
        children = probe_children(todo.pop())
        found += children
        todo += children
    return found


def write_stacks(procs: list[HostProcess], out: TextIO) -> None:
    """The threads' stacks (py-spy, native frames too) of every process under each host's
    command, to out: a job that ran past its time says where it was stuck, which a hang seen
    once in a full run needs (the development venv has py-spy; without it, one line says so)."""
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.access(spy, os.X_OK):
        out.write("localcluster: no py-spy here: the stuck processes' stacks are not shown\n")
        return
    for proc in procs:
        for pid in probe_descendants(proc.pid):
            try:
                done = subprocess.run([spy, "dump", "--native", "--pid", str(pid)], capture_output=True,
                                      text=True, timeout=60)
                text = done.stdout + done.stderr
            except subprocess.TimeoutExpired:
                text = "py-spy took more than 60 s\n"
            out.write(f"localcluster: {proc.host}: stacks of pid {pid}:\n{text}\n")
    out.flush()


def probe_pid_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def probe_namespace_members(init_pid: int) -> list[int]:
    """Every process in the PID namespace whose init is init_pid, init excluded."""
    ns = probe_pid_namespace(init_pid)
    if ns is None:
        return []
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != init_pid and probe_pid_namespace(int(entry)) == ns:
            members.append(int(entry))
    return members


def probe_namespace_links(pid: int) -> set[str]:
    """The PID and network namespaces pid is in (/proc/<pid>/ns/{pid,net}); empty once it is gone."""
    links = set()
    for kind in ("pid", "net"):
        with contextlib.suppress(OSError):
            links.add(os.readlink(f"/proc/{pid}/ns/{kind}"))
    return links


def wait_for_namespaces_to_empty(namespaces: set[str], timeout_s: float = 10.0) -> list[int]:
    """After their inits were killed: until no process is left in any of these PID or network
    namespaces (the kernel ends every member of a namespace whose init died, each a moment later
    under load, and the `unshare` that waited for the init, in its host's network, exits after
    it); the pids still there at timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = [int(e) for e in os.listdir("/proc") if e.isdigit() and probe_namespace_links(int(e)) & namespaces]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.02)


def kill_namespace_members(init_pid: int, rounds: int = 20) -> None:
    """SIGKILL everything on a host except its init (a container stopping, the host staying up).
    Repeated because a process may fork while we look."""
    for _ in range(rounds):
        members = probe_namespace_members(init_pid)
        if not members:
            return
        for pid in members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)

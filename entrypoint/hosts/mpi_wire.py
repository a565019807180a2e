"""The MPI leader's words to its workers, over the SSH that mpirun already uses (no port of
ours): each is one remote shell command built here from our own constants, run on every
worker in parallel (MAX_PARALLEL_SESSIONS at a time).

- tell: the job's outcome, written into the worker's runtime folder (`job-failure`, then
  `job-exit-code`, whose appearance is what the worker waits for: roles/mpi.py);
- ask: STACKS_SIGNAL (SIGUSR1) to the worker's entrypoint, which passes it to its ranks;
- collect: FIGURES_SIGNAL (SIGUSR2) to the worker's entrypoint, which writes this host's job
  report figures (decide/job_report.HOST_FIGURES_FILE), then read back;
- follow: a session for the whole of each run, in which the worker follows its ranks' files
  (run/rank_output.run_for_leader) and streams their lines back (hosts/worker_output.py).
The files' paths are the plan's (plan.files: runtime_dirs.py), the same on every host.
"""

from __future__ import annotations

import os
import shlex
import signal
from typing import NamedTuple
import subprocess

from entrypoint.decide.job_report import HOST_FIGURES_FILE
from entrypoint.decide.plan import LaunchPlan
from entrypoint.hosts import ssh
from entrypoint.hosts.net import can_connect
from entrypoint.settings import DEFAULTS

# What follows a worker's rank files for the leader (hosts/worker_output.py), run by path on the
# worker with the standard library only, as the ranks' wrapper is (decide/plan.RECORD_ERRORS).
RANK_OUTPUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "run", "rank_output.py")

# What a signal to a worker's entrypoint means (its handlers: roles/mpi.MpiWorker).
STACKS_SIGNAL = signal.SIGUSR1  # its ranks print their Python stacks
FIGURES_SIGNAL = signal.SIGUSR2  # it writes this host's figures for the job report


class LeaderAsked(NamedTuple):
    """The leader's signal reached this worker's entrypoint (posted on the host loop by the
    handler; the role answers on the main thread)."""

    signum: int
    at: float = 0.0  # time.monotonic() of its post (a burst is told by when the signals came)

# The leader's SSH sessions to its workers (probes, telling the outcome) run this many at a
# time: each is an ssh process (~5 MB, a key exchange), and a small leader instance with
# 255 workers should not start 255 at once. Open MPI's own orted launch has its own limit
# (plm_rsh_num_concurrent, 128 by default).
MAX_PARALLEL_SESSIONS = 64


# The leader's output/failure as it is written on each worker (over SSH, not the job port).
LEADER_REPORT_MAX_BYTES = 256 * 1024


def ssh_argv(files: ssh.SshFiles, host: str, remote_command: str) -> list[str]:
    return ["ssh", "-F", files.client_config, host, remote_command]


def probe_workers(files: ssh.SshFiles, hosts: list[str], port: int,
                  timeout_s: float = DEFAULTS.ssh_probe_timeout_s) -> set[str]:
    """The hosts that accept our SSH login now, probed in parallel (at most
    MAX_PARALLEL_SESSIONS at a time), so the wait does not grow with the host count the way
    one-after-another probes did (0.3-0.4 s each). A host whose port does not answer yet
    costs a TCP connect, not an ssh process."""
    def accepts(host: str) -> bool:
        if not can_connect(host, port, timeout_s=timeout_s):
            return False
        done = subprocess.run(ssh_argv(files, host, "true"), capture_output=True, stdin=subprocess.DEVNULL)
        return done.returncode == 0

    return {host for host, ok in zip(hosts, run_per_host(accepts, hosts)) if ok}


def run_per_host(action, hosts: list[str]) -> list:
    """action(host) for every host, at most MAX_PARALLEL_SESSIONS at a time; the results in
    the hosts' order."""
    from concurrent.futures import ThreadPoolExecutor  # imports logging: only where it is used

    if not hosts:
        return []
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_SESSIONS, len(hosts))) as pool:
        return list(pool.map(action, hosts))


def build_tell_command(plan: LaunchPlan, exit_code: int) -> str:
    """The remote command that stores the outcome on a worker: the report (stdin, possibly
    empty) first, then the exit code, whose file's appearance is what the worker waits for.
    Only our integer and constant paths appear in it."""
    code_file, failure_file = shlex.quote(plan.files.outcome), shlex.quote(plan.files.leader_failure)
    return (
        f"cat > {failure_file}.tmp && mv {failure_file}.tmp {failure_file} && "
        f"printf %s {int(exit_code)} > {code_file}.tmp && mv {code_file}.tmp {code_file}"
    )


def build_follow_command(python: str, folder: str, quiet_s: float, poll_s: float) -> str:
    """The remote command that follows a worker's rank files for the leader: the image's
    python (the ranks' own, the same path on every host) runs run/rank_output.py by path,
    isolated (-I: no PYTHON* variable, no folder of the user's on its path). Only that path,
    the plan's folder and two numbers appear in it, each quoted."""
    argv = [python, "-I", RANK_OUTPUT, folder, repr(float(quiet_s)), repr(float(poll_s))]
    return "exec " + shlex.join(argv)


def start_follow_session(plan: LaunchPlan, host: str, command: str) -> subprocess.Popen:
    """One long session to host running command; its stdin stays open until the leader closes it."""
    return subprocess.Popen(ssh_argv(plan.files.ssh, host, command), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def tell_workers(plan: LaunchPlan, exit_code: int, report: str | None, log) -> None:
    """Write the job's outcome on every worker; a dead worker is skipped. report: as
    outcome/writer.render_reason made it (secrets masked, readable: a lone surrogate arrives
    escaped, never as "?" or an encoding error)."""
    payload = (report or "").encode("utf-8")[:LEADER_REPORT_MAX_BYTES] if exit_code != 0 else b""
    run_on_workers(plan, build_tell_command(plan, exit_code), payload, "tell {host} the outcome", log)


def ask_workers_for_stacks(plan: LaunchPlan, log) -> None:
    """SIGUSR1 to every worker's entrypoint (its PID is in its job folder's owner file, the
    same path on every host), which passes it to its ranks; their stacks reach the leader's
    log through mpirun. Only our constant path appears in the command."""
    owner = shlex.quote(plan.files.owner)
    run_on_workers(plan, f"kill -{STACKS_SIGNAL.name[3:]} \"$(cut -d' ' -f1 {owner})\"", b"", "ask {host} for its ranks' stacks", log)


def collect_worker_figures(plan: LaunchPlan, log) -> dict[str, str]:
    """Each worker's figures for the job report (host -> their JSON): SIGUSR2 to its
    entrypoint, which writes them in its job folder (jobreport/host.write_figures_file), then
    read back, over the same SSH the job already trusts. Only our constant paths appear in
    the command; a worker that has none within 5 s is left out (the report says so)."""
    owner = shlex.quote(plan.files.owner)
    figures = shlex.quote(os.path.join(plan.report.rank_folder, HOST_FIGURES_FILE))
    command = (f"rm -f {figures}; kill -{FIGURES_SIGNAL.name[3:]} \"$(cut -d' ' -f1 {owner})\" && for i in $(seq 50); do "
               f"[ -s {figures} ] && exec cat {figures}; sleep 0.1; done; echo 'no figures within 5 s' >&2; exit 1")
    got = run_on_workers(plan, command, b"", "read {host}'s figures for the job report", log)
    return {host: out.decode("utf-8", "replace") for host, out in got.items()}


def run_on_workers(plan: LaunchPlan, command: str, payload: bytes, what: str, log) -> dict[str, bytes]:
    """One SSH session to every worker, running `command` with `payload` on its stdin, in
    parallel (MAX_PARALLEL_SESSIONS at a time); a worker that fails or times out is logged
    ("could not " + what) and skipped. Returns each other worker's stdout."""
    files = plan.files.ssh
    timeout_s = plan.settings.ssh_session_timeout_s

    def on(host: str) -> bytes | None:
        try:
            done = subprocess.run(ssh_argv(files, host, command), input=payload, capture_output=True, timeout=timeout_s)
            if done.returncode != 0:
                log(f"could not {what.format(host=host)}: {done.stderr.decode(errors='replace').strip()}")
                return None
            return done.stdout
        except subprocess.TimeoutExpired:
            log(f"could not {what.format(host=host)}: timed out")
            return None

    hosts = list(plan.peers)
    return {host: out for host, out in zip(hosts, run_per_host(on, hosts)) if out is not None}

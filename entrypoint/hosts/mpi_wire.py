"""The MPI leader's SSH sessions to its workers beside mpirun's own: one for the whole of each
run, in which the worker follows its ranks' files (run/rank_output.run_for_leader) and streams
their lines back (hosts/worker_output.py). Everything else between the hosts is on the job
port (roles/mpi.py). The files' paths are the plan's (plan.files: runtime_dirs.py), the same
on every host.
"""

from __future__ import annotations

import os
import shlex
import subprocess

from entrypoint.decide.plan import LaunchPlan
from entrypoint.hosts import ssh

# What follows a worker's rank files for the leader (hosts/worker_output.py), run by path on the
# worker with the standard library only, as the ranks' wrapper is (decide/plan.RECORD_ERRORS).
RANK_OUTPUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "run", "rank_output.py")


def ssh_argv(files: ssh.SshFiles, host: str, remote_command: str) -> list[str]:
    return ["ssh", "-F", files.client_config, host, remote_command]


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

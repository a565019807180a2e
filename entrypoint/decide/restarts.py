"""Restart in place (BYOC_MAX_RESTARTS, off by default): when a rank crashes, start the job's
processes again on the hosts it already has, instead of failing a job whose scripts can
resume from their latest checkpoint (train/ does).

Who restarts what:
- torch_distributed: torchrun's own `--max_restarts` (it restarts this host's ranks; the
  entrypoint does not relaunch torchrun).
- mpirun (mpi, pytorchddp, smdataparallel) and a single process: the leader relaunches the
  whole job — mpirun starts every rank again on every host; the workers' entrypoints keep
  waiting for the outcome and do not notice.
- the parameter server: not restarted (every host runs its own part; a relaunch on one host
  cannot rejoin the others' rpc group).

Pure: decide from the finished run what happens next.
"""

from __future__ import annotations

from typing import NamedTuple


class RunEnding(NamedTuple):
    """What decide_restart needs to know of a finished run."""

    exit_code: int
    stopped_by: str | None = None  # SIGTERM/SIGINT from the platform: a stop, not a crash
    launch_error: str | None = None  # the program could not be started: it never will
    lost_host: str | None = None  # a host is gone: the cluster it needs no longer exists


def decide_restart(relaunched: bool, max_restarts: int, restarts_done: int, ending: RunEnding) -> str | None:
    """Why the job is not restarted, or None when it is. relaunched: this host's entrypoint
    starts every process of the job, so a relaunch here is a relaunch of the whole job
    (roles/choose.py RELAUNCHED_ROLES)."""
    if ending.exit_code == 0:
        return "it succeeded"
    if not relaunched:
        return "its processes are not relaunched by the entrypoint"
    if ending.stopped_by:
        return f"it was stopped by {ending.stopped_by}"
    if ending.launch_error:
        return "its program could not be started"
    if ending.lost_host:
        return "a host was lost"
    if restarts_done >= max_restarts:
        return f"it was restarted {restarts_done} time(s) already (BYOC_MAX_RESTARTS={max_restarts})"
    return None


def build_restart_line(restarts_done: int, max_restarts: int, what: str, exit_code: int, cause: str) -> str:
    """The log line of a restart: which one, what failed and why."""
    return (f"restart {restarts_done + 1} of {max_restarts}: {what} exited with code {exit_code} ({cause}); "
            f"starting it again in place (BYOC_MAX_RESTARTS)")



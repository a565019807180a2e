"""Restart in place (BYOC_MAX_RESTARTS, off by default): when a rank crashes, start the job's
processes again on the hosts it already has, instead of failing a job whose scripts can
resume from their latest checkpoint (train/ does).

Who restarts what:
- torch_distributed on one host: torchrun's own `--max_restarts` (it restarts the host's ranks).
- torch_distributed on several hosts, and the parameter server: every host's entrypoint, on
  the leader's word (roles/attempts.py): each host stops its processes of the failed attempt,
  and once all of them are gone every host starts the next attempt, with its own rendezvous
  (build_attempt_processes).
- mpirun (mpi, pytorchddp, smdataparallel) and a single process: the leader relaunches the
  whole job — mpirun starts every rank again on every host; the workers' entrypoints keep
  waiting for the outcome and do not notice.
- A lost host is not replaced: the cluster the job needs no longer exists.

Pure: decide from the finished run what happens next, and what the next attempt runs.
"""

from __future__ import annotations

from typing import NamedTuple

from entrypoint.decide.specs import ProcessSpec

ATTEMPT_ENV = "BYOC_ATTEMPT"  # the attempt a process belongs to, from 1 (docs/reliability.md)


class RunEnding(NamedTuple):
    """What decide_restart needs to know of a finished run."""

    exit_code: int
    stopped_by: str | None = None  # SIGTERM/SIGINT from the platform: a stop, not a crash
    launch_error: str | None = None  # the program could not be started: it never will
    lost_host: str | None = None  # a host is gone: the cluster it needs no longer exists


def decide_restart(relaunched: bool, max_restarts: int, restarts_done: int, ending: RunEnding) -> str | None:
    """Why the job is not restarted, or None when it is. relaunched: this host's entrypoint
    starts every process of the job, so a relaunch here is a relaunch of the whole job
    (each family's decide_relaunched: decide/launchers/)."""
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




def build_attempt_rendezvous_id(attempt: int) -> str:
    """torchrun's --rdzv_id for an attempt: its rendezvous store's keys live under it."""
    return f"byoc-attempt-{attempt}"


def build_attempt_processes(processes: tuple[ProcessSpec, ...], attempt: int) -> tuple[ProcessSpec, ...]:
    """The plan's processes (attempt 1's) for `attempt`: each told its attempt (ATTEMPT_ENV), and
    torchrun given the attempt's rendezvous id."""
    built = []
    for spec in processes:
        argv = list(spec.argv)
        if "--rdzv_id" in argv[:-1]:
            argv[argv.index("--rdzv_id") + 1] = build_attempt_rendezvous_id(attempt)
        env = tuple((k, v) for k, v in spec.env if k != ATTEMPT_ENV) + ((ATTEMPT_ENV, str(attempt)),)
        built.append(spec._replace(argv=tuple(argv), env=env))
    return tuple(built)

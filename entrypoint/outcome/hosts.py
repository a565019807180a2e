"""The words of what another host did (pure): a worker host whose part failed, an MPI worker's
word from its leader, a job port that could not open."""

from __future__ import annotations

from entrypoint.outcome.failure import describe_exit_code
from entrypoint.outcome.records import RootCause


def describe_worker_host_failure(*, what: str, host: str, exit_code: int, root_cause: RootCause | None,
                                 current_host: str) -> str:
    """The leader's report when its own part succeeded and a worker host's failed: the job
    failed there. The leader's output is not that host's, so none is quoted here."""
    ended = describe_exit_code(exit_code)
    if root_cause is not None:
        head = (f"{root_cause.type}: {root_cause.message}\n"
                f"First failure: rank {root_cause.rank} on host {root_cause.host}, while running {what}; "
                f"host {host} ended its part with {ended}.")
        if root_cause.where:
            head += f"\nWhere:\n{root_cause.where.rstrip()}"
    else:
        head = f"{what} failed on host {host} with {ended}."
    head += (f"\nThis host ({current_host}) ran its own part to the end; host {host}'s log and "
             f"output/failure have that host's output.")
    return head + "\n"


def describe_job_outcome(reason: str) -> str:
    return reason.rstrip() + "\n"


def describe_port_problem(port: int, host: str, error: OSError) -> str:
    """One line for a job port we could not open, naming the setting that moves it."""
    import errno

    if error.errno == errno.EADDRINUSE:
        return (f"port {port} on {host} is already in use by another process: the job's peers reach each "
                f"other there; set BYOC_JOB_PORT to a free port (or BYOC_MASTER_PORT, which it follows)")
    return f"cannot listen on port {port} on {host} (BYOC_JOB_PORT): {error.strerror or error}"


def describe_worker_failure(current_host: str, leader: str, exit_code: int, reason: str | None,
                            leader_failure: str | None) -> str:
    """What a worker's output/failure says when the job failed."""
    if reason is not None:
        return reason
    if leader_failure:
        # The leader's report, whose first lines are the job's root cause: SDK v2 local mode
        # keeps only the last host's output/failure, and that is a worker's.
        return (f"{leader_failure.rstrip()}\n\n({current_host} ended with the job; "
                f"this report is the leader {leader}'s.)")
    return (f"The MPI job failed: the leader {leader} reported exit code {exit_code}. "
            f"The leader's output/failure names the first failing host, rank and exception.")

"""How the job ended, as plain data (values: this module imports nothing of entrypoint, so every
room that learns how something ended, the transports included, takes them from here).

An Outcome holds its reason as composed (outcome/failure.py's describe_* words): raw text.
It is rendered (made readable) and redacted (the job's secrets masked) once, by
writer.render_reason, wherever the text leaves this process: output/failure (write_outcome,
the one writer of output/), the log, or an SSH session to a worker.
"""

from __future__ import annotations

from typing import NamedTuple


class Outcome(NamedTuple):
    """How the job ended on this host: every way a job ends (a bad definition, a failed
    pre-flight, a start problem, the script's exit, a stop, a lost host, a worker's word)
    becomes one of these, and cli.main hands it to write_outcome, the one writer of output/."""

    exit_code: int
    reason: str | None = None  # the reason output/failure gives, raw (None: success, or nothing to say)
    logged: bool = False  # the whole reason is in the log already (write_outcome adds no FAILED line)


SUCCESS = Outcome(0)


class RootCause(NamedTuple):
    """A rank's first failure, as a host heard it (hosts/job_port.parse_root_cause_line reads
    the record rank/record_errors.py prints and sends)."""

    host: str
    rank: str
    type: str
    message: str
    time: float
    where: str = ""


class StepEnding(NamedTuple):
    """How one step's processes ended, as the failure words need it (failure.build_step_ending
    makes one from a supervise.RunResult), and what this host heard from its peers."""

    exit_code: int
    stopped_by: str | None = None  # the stop signal's name (SIGTERM, SIGINT), when a stop came
    stopped_at: float | None = None  # when the stop request arrived (time.time())
    oom_kills: int | None = None  # the kernel's OOM kills in this container's memory cgroup; None: unknown
    killed_by_us: bool = False  # SIGKILLed by this entrypoint when the grace period ran out
    signaled: bool | None = None  # whether a signal ended the first process that failed; None: unknown
    lost: str | None = None  # the host this job lost (the peer watch's words)
    peer_failed: str | None = None  # another host's failure that stopped this host's processes

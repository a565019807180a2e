"""The text of output/failure (pure): the root cause first, then the output's tail.

SageMaker shows the first 1,024 characters as FailureReason, so the first paragraph must
stand alone: what failed, where (host, rank), the exception and the exit code. Values of
environment variables whose names look like secrets are masked everywhere in the report, in
every form they take in text, and in each output line before it is cut to length.
"""

from __future__ import annotations

import json
import re
import signal
from typing import Iterable, Mapping, NamedTuple

from entrypoint.rank.record_errors import MARKER, MASK, build_secret_forms, is_secret_name

EXCEPTION_LINE = re.compile(r"^(?:\[[^\]]*\]<std(?:out|err)>:)?\s*([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Fault|Warning)\b[^\n]*)$")


class RootCause(NamedTuple):
    host: str
    rank: str
    type: str
    message: str
    time: float
    where: str = ""


def parse_root_cause_line(line: str) -> RootCause | None:
    at = line.find(MARKER)
    if at < 0:
        return None
    try:
        data = json.loads(line[at + len(MARKER):])
        return RootCause(
            host=str(data["host"]),
            rank=str(data["rank"]),
            type=str(data["type"]),
            message=str(data["message"]),
            time=float(data["time"]),
            where=str(data.get("where", "")),
        )
    except (ValueError, KeyError, TypeError, RecursionError):  # a rank's output is any text
        return None


def first_root_cause(causes: Iterable[RootCause]) -> RootCause | None:
    causes = list(causes)
    return min(causes, key=lambda c: c.time) if causes else None


def describe_root_cause(cause: RootCause, limit: int = 300) -> str:
    """One line: `rank 1 on algo-2: ValueError: bad shard` (the message's first line)."""
    message = (cause.message.splitlines() or [""])[0]
    if len(message) > limit:
        message = message[:limit] + "..."
    return f"rank {cause.rank} on {cause.host}: {cause.type}: {message}"


def describe_exit_code(code: int, oom_kills: int | None = None, killed_by_us: bool = False) -> str:
    """oom_kills: the kernel's OOM kills in this container's memory cgroup during the run (None:
    unknown); killed_by_us: this entrypoint sent SIGKILL at the end of its grace period.
    137 is called out-of-memory only when the kernel's counter says so."""
    if code == 137:
        if killed_by_us:
            return ("exit code 137: killed by SIGKILL, sent by this entrypoint when the grace period after "
                    "the stop ran out (BYOC_GRACE_PERIOD_S)")
        if oom_kills:
            return (f"exit code 137: killed by the kernel's out-of-memory killer ({oom_kills} OOM kill(s) in "
                    f"this container's memory cgroup during the run): the container ran out of memory")
        if oom_kills == 0:
            return ("exit code 137: killed by SIGKILL, not by the out-of-memory killer on this host (its "
                    "memory cgroup counted no OOM kill): something outside the job sent it")
        return ("exit code 137: killed by SIGKILL (the out-of-memory killer is the usual cause; this "
                "container's memory cgroup could not be read to tell)")
    if code > 128 and code - 128 < 65:
        try:
            name = signal.Signals(code - 128).name
        except ValueError:
            name = f"signal {code - 128}"
        return f"exit code {code}: killed by {name}"
    return f"exit code {code}"


def guess_exception_from_tail(lines: list[str]) -> str | None:
    """For programs that did not run under record_errors (shell scripts, executables): the
    last line that looks like a Python exception."""
    for line in reversed(lines):
        if MARKER in line:
            continue
        match = EXCEPTION_LINE.match(line.strip())
        if match:
            return match.group(1)
    return None


LOST_DAEMON = re.compile(r"Remote daemon:.* on node (\S+)")


def guess_lost_host(lines: list[str]) -> str | None:
    """Open MPI's "ORTE has lost communication with a remote daemon" names the dead host."""
    for line in lines:
        match = LOST_DAEMON.search(line)
        if match:
            return match.group(1)
    return None


def secret_values(environ: Mapping[str, str]) -> list[str]:
    values = {v for k, v in environ.items() if is_secret_name(k) and len(v) >= 6}
    return sorted(values, key=len, reverse=True)  # longest first: no partial masking


def redact(text: str, secrets: list[str]) -> str:
    """Mask every form of every secret (build_secret_forms), also where the text breaks it
    over lines (a wrapped print, a value split across two output lines)."""
    if not secrets:
        return text
    for form in build_secret_forms(secrets):
        text = text.replace(form, MASK)
        if len(form) >= 12 and "\n" in text:
            # Line breaks between any of its characters (a wrapped print).
            spread = "\n?".join(re.escape(c) for c in form)
            text = re.sub(spread, MASK, text)
    return text


def build_failure_report(
    *,
    what: str,
    exit_code: int,
    root_cause: RootCause | None,
    tail: list[str],
    current_host: str,
    environ: Mapping[str, str],
    stopped_by: str | None = None,
    stopped_at: float | None = None,
    lost: str | None = None,
    oom_kills: int | None = None,
    killed_by_us: bool = False,
) -> str:
    """`what`: the stage that failed, e.g. "torchrun on 2 hosts", "installing requirements.txt".
    stopped_at: when the stop request arrived (time.time()); a root cause recorded before it
    still leads (a host stopped because another host's rank failed), the stop follows."""
    if root_cause is not None:
        head = (
            f"{root_cause.type}: {root_cause.message}\n"
            f"First failure: rank {root_cause.rank} on host {root_cause.host}, "
            f"while running {what}; the job ended with {describe_exit_code(exit_code, oom_kills, killed_by_us)}."
        )
        if root_cause.where:
            head += f"\nWhere:\n{root_cause.where.rstrip()}"
    else:
        guess = guess_exception_from_tail(tail)
        lost_daemon = guess_lost_host(tail)
        head = f"{what} failed on host {current_host} with {describe_exit_code(exit_code, oom_kills, killed_by_us)}."
        if lost_daemon:
            head = f"Host {lost_daemon} stopped responding: mpirun lost its daemon there (the host died or its network failed).\n" + head
        elif guess:
            head = f"{guess}\n" + head
    if lost and root_cause is None:
        head = f"The job lost a host: {lost}.\n" + head
    if stopped_by and decide_root_cause_leads(root_cause, stopped_at):
        head += f"\nThen this host ({current_host}) was stopped by {stopped_by}."
    elif stopped_by:
        head = f"Training was stopped by {stopped_by}. " + head
    lines = [head.rstrip(), "", f"Last {len(tail)} lines of output:" if tail else "No output."]
    lines += [line for line in tail if MARKER not in line]
    return redact("\n".join(lines).rstrip() + "\n", secret_values(environ))


def decide_root_cause_leads(root_cause: RootCause | None, stopped_at: float | None) -> bool:
    """On a stopped host, the failure leads with the root cause only when a rank failed before
    the stop request: then the stop (e.g. docker-compose stopping the other containers once one
    exited) is a consequence. A failure after the stop is the stop's doing."""
    return root_cause is not None and stopped_at is not None and root_cause.time <= stopped_at


def build_job_outcome_report(reason: str, environ: Mapping[str, str]) -> str:
    return redact(reason.rstrip() + "\n", secret_values(environ))


def build_job_definition_report(message: str, environ: Mapping[str, str]) -> str:
    return redact(f"The training job definition is invalid: {message}\n", secret_values(environ))

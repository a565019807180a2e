"""The text of output/failure (pure): the root cause first, then the output's tail.

SageMaker shows the first 1,024 characters as FailureReason, so the first paragraph must
stand alone: what failed, where (host, rank), the exception and the exit code. The describe_*
words compose raw text; values of environment variables whose names look like secrets are
masked in it once, when it leaves the process (writer.render_reason: redact), in every form
they take in text, also broken over lines; and in each output line before it is cut to length
(SecretLines: together with the lines before it in its stream).
"""

from __future__ import annotations

import functools
import re
from typing import Iterable, Mapping

from entrypoint.outcome.records import RootCause, StepEnding
from entrypoint.outcome.stops import SIGNAL_EXIT_BASE
from entrypoint.rank.record_errors import MARKER as ROOT_CAUSE  # the rank's copy of the job port's word
from entrypoint.rank.record_errors import (build_masked, build_secret_forms, build_secret_pattern,
                                           build_secret_values, describe_signal, find_secret_spans)

EXCEPTION_LINE = re.compile(r"^(?:\[[^\]]*\]<std(?:out|err)>:)?\s*([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Fault|Warning)\b[^\n]*)$")


def first_root_cause(causes: Iterable[RootCause]) -> RootCause | None:
    causes = list(causes)
    return min(causes, key=lambda c: c.time) if causes else None


def describe_root_cause(cause: RootCause, limit: int = 300) -> str:
    """One line: `rank 1 on algo-2: ValueError: bad shard` (the message's first line)."""
    message = (cause.message.splitlines() or [""])[0]
    if len(message) > limit:
        message = message[:limit] + "..."
    return f"rank {cause.rank} on {cause.host}: {cause.type}: {message}"


def describe_exit_code(code: int, oom_kills: int | None = None, killed_by_us: bool = False,
                       signaled: bool | None = None) -> str:
    """oom_kills: the kernel's OOM kills in this container's memory cgroup during the run (None:
    unknown); killed_by_us: this entrypoint sent SIGKILL at the end of its grace period;
    signaled: whether a signal ended the process (False: it returned the code itself, as
    `os._exit(137)` or mpirun do; None: unknown). 137 is called out-of-memory only when the
    kernel's counter says so, and a signal only when one was seen."""
    signum = code - SIGNAL_EXIT_BASE  # the signal, were the code a signal's
    if signaled is False and 0 < signum <= 64 and not killed_by_us and not oom_kills:
        return (f"exit code {code}, which the process returned itself: no signal ended it (a shell or launcher "
                f"returns {SIGNAL_EXIT_BASE} + {signum} when a process it ran was killed by {describe_signal(signum)[0]})")
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
    if 0 < signum < 65:
        return f"exit code {code}: killed by {describe_signal(signum)[1]}"
    return f"exit code {code}"


def guess_exception_from_tail(lines: list[str]) -> str | None:
    """For programs that did not run under record_errors (shell scripts, executables): the
    last line that looks like a Python exception."""
    for line in reversed(lines):
        if ROOT_CAUSE in line:
            continue
        match = EXCEPTION_LINE.match(line.strip())
        if match:
            return match.group(1)
    return None


# Open MPI's word when a rank died of a signal: the only record of it mpirun gives.
MPI_SIGNAL_DEATH = re.compile(r"mpirun noticed that process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)")


def guess_signal_death(lines: list[str]) -> str | None:
    """`rank 1 on algo-2 was killed by SIGABRT (signal 6): ...` from mpirun's notice."""
    for line in lines:
        match = MPI_SIGNAL_DEATH.search(line)
        if match:
            rank, host, signum = match.groups()
            return f"rank {rank} on {host} was killed by {describe_signal(int(signum))[1]}"
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
    """The values masked in every report (record_errors.build_secret_values: the ranks' rule)."""
    return build_secret_values(environ)


@functools.lru_cache(maxsize=16)
def _secret_pattern(secrets: tuple[str, ...]):
    """(the pattern, the longest form's length), built once per set of secrets."""
    forms = build_secret_forms(secrets)
    return build_secret_pattern(secrets), max(map(len, forms), default=0)


def redact(text: str, secrets: list[str]) -> str:
    """Mask every form of every secret (build_secret_forms), also where the text breaks it
    over lines, each break followed by any indentation (a wrapped print, a value split across
    two output lines): each occurrence, breaks and all, becomes one MASK."""
    pattern = _secret_pattern(tuple(secrets))[0] if secrets else None
    return build_masked(text, find_secret_spans(pattern, text)) if pattern is not None else text


# How far back in a stream a secret broken over lines is looked for, beyond the longest form's
# length: room for the line breaks inside it and the indentation after them.
SPLIT_REACH_CHARS = 256


class SecretLines:
    """The secrets in one stream of output lines (one child's stdout or stderr), masked line by
    line before anything cuts a line to length. Pure: no I/O.

    Each line is masked together with the end of the stream's lines before it, so a value broken
    over lines is masked in every line that holds a part of it: the new line comes back masked,
    and so does each earlier line whose end it completed (a line shown only in part, or one
    already gone from a bounded tail, leaves nothing of it behind). A value is found when all of
    it lies within the longest form's length and SPLIT_REACH_CHARS of the stream."""

    def __init__(self, secrets: list[str] | tuple[str, ...]) -> None:
        self.pattern, longest = _secret_pattern(tuple(secrets)) if secrets else (None, 0)
        self.reach = longest + SPLIT_REACH_CHARS
        self.recent: list[tuple[str, list[tuple[int, int]], object]] = []  # (text, masked spans, key), oldest first

    def add(self, text: str, key: object = None) -> tuple[str, list[tuple[object, str]]]:
        """text masked, and (key, masked text) for each earlier line of the stream that this one
        changed (key: what the caller passed with that line)."""
        if self.pattern is None:
            return text, []
        skip = max(0, len(self.recent[0][0]) - self.reach) if self.recent else 0  # the first line: its end only
        pieces = [t for t, _, _ in self.recent] + [text]
        pieces[0] = pieces[0][skip:]
        starts, at = [], 0
        for piece in pieces:
            starts.append(at)
            at += len(piece) + 1
        joined = "\n".join(pieces)
        spans: list[list[tuple[int, int]]] = [[] for _ in pieces]
        for found_start, found_end in find_secret_spans(self.pattern, joined, max(0, starts[-1] - self.reach)):
            if found_end <= starts[-1]:
                continue  # all in earlier lines: masked when the last of them came
            for i, start in enumerate(starts):
                low, high = max(found_start, start), min(found_end, start + len(pieces[i]))
                if low < high:
                    offset = skip - start if i == 0 else -start
                    spans[i].append((low + offset, high + offset))
        changed = []
        for (earlier, earlier_spans, earlier_key), new_spans in zip(self.recent, spans):
            if new_spans:
                earlier_spans += new_spans
                changed.append((earlier_key, build_masked(earlier, earlier_spans)))
        self.recent.append((text, spans[-1], key))
        after = 0  # forget the lines that no later match can reach
        for i in range(len(self.recent) - 1, 0, -1):
            after += len(self.recent[i][0]) + 1
            if after >= self.reach:
                del self.recent[:i]
                break
        return build_masked(text, spans[-1]), changed


def describe_failure(what: str, ended: StepEnding, root_cause: RootCause | None, tail: list[str],
                     current_host: str) -> str:
    """`what`: the stage that failed, e.g. "torchrun on 2 hosts", "installing requirements.txt".
    ended.stopped_at: when the stop request arrived (time.time()); a root cause recorded before
    it still leads (a host stopped because another host's rank failed), the stop follows."""
    exit_code, stopped_by, signaled = ended.exit_code, ended.stopped_by, ended.signaled
    oom_kills, killed_by_us = ended.oom_kills, ended.killed_by_us
    if root_cause is not None:
        head = (
            f"{root_cause.type}: {root_cause.message}\n"
            f"First failure: rank {root_cause.rank} on host {root_cause.host}, "
            f"while running {what}; the job ended with {describe_exit_code(exit_code, oom_kills, killed_by_us, signaled)}."
        )
        if root_cause.where:
            head += f"\nWhere:\n{root_cause.where.rstrip()}"
    else:
        guess = guess_exception_from_tail(tail)
        lost_daemon = guess_lost_host(tail)
        signal_death = guess_signal_death(tail)  # mpirun's word that a rank died of a signal
        how = describe_exit_code(exit_code, oom_kills, killed_by_us, None if signal_death else signaled)
        head = f"{what} failed on host {current_host} with {how}."
        if lost_daemon:
            head = f"Host {lost_daemon} stopped responding: mpirun lost its daemon there (the host died or its network failed).\n" + head
        elif signal_death:
            head = f"{signal_death}\n" + head
        elif guess:
            head = f"{guess}\n" + head
    if ended.lost and root_cause is None:
        head = f"The job lost a host: {ended.lost}.\n" + head
    if ended.peer_failed and root_cause is None:
        head = f"{ended.peer_failed}, so this host's processes were stopped.\n" + head
    if stopped_by and decide_root_cause_leads(root_cause, ended.stopped_at):
        head += f"\nThen this host ({current_host}) was stopped by {stopped_by}."
    elif stopped_by:
        head = f"Training was stopped by {stopped_by}. " + head
    lines = [head.rstrip(), "", f"Last {len(tail)} lines of output:" if tail else "No output."]
    lines += [line for line in tail if ROOT_CAUSE not in line]
    return "\n".join(lines).rstrip() + "\n"


def decide_root_cause_leads(root_cause: RootCause | None, stopped_at: float | None) -> bool:
    """On a stopped host, the failure leads with the root cause only when a rank failed before
    the stop request: then the stop (e.g. docker-compose stopping the other containers once one
    exited) is a consequence. A failure after the stop is the stop's doing."""
    return root_cause is not None and stopped_at is not None and root_cause.time <= stopped_at


def describe_bad_definition(message: str) -> str:
    return f"The training job definition is invalid: {message}\n"


def build_step_ending(run=None, lost: str | None = None, peer_failed: str | None = None) -> StepEnding:
    """How a step ended (run: supervise.RunResult; None when nothing ran: exit code 1) and what
    this host heard from its peers (lost, peer_failed)."""
    if run is None:
        return StepEnding(1, lost=lost, peer_failed=peer_failed)
    return StepEnding(run.exit_code, run.stopped_by, run.stopped_at, run.oom_kills, run.killed_at_deadline,
                      run.signaled, lost, peer_failed)


def describe_run_failure(what: str, collector, current_host: str, ended: StepEnding) -> str:
    """The failure report of one step (an install, the training run, the start of the workers)
    from what its processes printed (collector: supervise.OutputCollector) and how it ended."""
    return describe_failure(what, ended, first_root_cause(collector.root_causes), list(collector.tail), current_host)


def describe_job_failure(report: str, hang: str | None, earlier: list[str]) -> str:
    """The training run's report, led by why it was stopped as hung (hangs.py) and followed by
    the failures that were restarted before it (restarts.py)."""
    text = f"{hang}\n\n{report}" if hang else report
    if earlier:
        text = f"{text.rstrip()}\n\n{describe_earlier_failures(earlier)}\n"
    return text


def describe_earlier_failures(earlier: list[str]) -> str:
    """For the final failure report: the failures that were restarted before this one."""
    lines = [f"  attempt {i}: {text}" for i, text in enumerate(earlier, 1)]
    return f"The job was restarted {len(earlier)} time(s) before this failure (BYOC_MAX_RESTARTS):\n" + "\n".join(lines)

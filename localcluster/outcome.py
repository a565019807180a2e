"""Deciding when a multi-host run is over, and how to report it (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from localcluster.processes import HostResult

# SageMaker shows the first 1024 characters of /opt/ml/output/failure as FailureReason.
FAILURE_REASON_LIMIT = 1024
TAIL_LINES = 20


@dataclass(frozen=True)
class ClusterResult:
    results: dict[str, HostResult]  # by host, in the order the hosts were given
    stop_reason: str | None  # why localcluster stopped hosts that were still running
    seconds: float

    @property
    def ok(self) -> bool:
        return self.stop_reason is None and all(r.ok for r in self.results.values())

    @property
    def failed(self) -> list[str]:
        return [h for h, r in self.results.items() if not r.ok]


def decide_stop_reason(
    exit_codes: dict[str, int | None],
    elapsed: float,
    timeout: float | None,
    fail_fast: bool,
) -> str | None:
    """Why the hosts still running should be stopped now, or None to keep waiting.
    exit_codes: host -> exit code, None while running. Like SageMaker, a job whose host
    failed is over (fail_fast), and a job past its maximum runtime is stopped."""
    running = [h for h, code in exit_codes.items() if code is None]
    if not running:
        return None
    if fail_fast:
        failed = [h for h, code in exit_codes.items() if code is not None and code != 0]
        if failed:
            return f"{failed[0]} failed"
    if timeout is not None and elapsed >= timeout:
        return f"the job ran past its {timeout:g} s limit"
    return None


def build_summary(result: ClusterResult, failure_files: dict[str, str] | None = None) -> str:
    """The end-of-run report: one line per host, the tail of each failed host's output and its
    /opt/ml/output/failure (what SageMaker would show as FailureReason)."""
    failure_files = failure_files or {}
    width = max((len(h) for h in result.results), default=0)
    lines = [f"localcluster: job finished in {result.seconds:.1f} s"]
    if result.stop_reason:
        lines.append(f"localcluster: stopped the hosts still running: {result.stop_reason}")
    for host, r in result.results.items():
        lines.append(f"  {host.ljust(width)}  {r.describe()}  ({r.seconds:.1f} s)")
    for host in result.failed:
        reason = failure_files.get(host, "").strip()
        if reason:
            lines.append(f"--- {host}: /opt/ml/output/failure")
            lines.append(reason[:FAILURE_REASON_LIMIT])
        tail = result.results[host].output.splitlines()[-TAIL_LINES:]
        if tail:
            lines.append(f"--- {host}: last {len(tail)} lines of output")
            lines.extend(tail)
    if result.ok:
        lines.append(f"localcluster: all {len(result.results)} hosts succeeded")
    else:
        lines.append(f"localcluster: {len(result.failed)} of {len(result.results)} hosts failed")
    return "\n".join(lines)

"""One command started on several hosts at once: wait for all, stop them all."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from localcluster.errors import ClusterError
from localcluster.outcome import ClusterResult, decide_stop_reason
from localcluster.processes import HostProcess, write_stacks

POLL_SECONDS = 0.05


class ClusterRun:
    def __init__(self, procs: dict[str, HostProcess]):
        self.procs = dict(procs)
        self._started = time.monotonic()

    def exit_codes(self) -> dict[str, int | None]:
        return {host: p.poll() for host, p in self.procs.items()}

    def signal(self, sig: int) -> None:
        """Send `sig` to the main process of every host's command that is still running."""
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(sig)

    def wait(self, timeout: float | None = None, fail_fast: bool = True, grace: float = 10.0) -> ClusterResult:
        """Wait for every host. With fail_fast, the first host that fails ends the job: the
        others get SIGTERM, then SIGKILL after `grace` seconds. Past `timeout` seconds, the
        same. Interrupting (Ctrl-C) leaves the hosts running: call stop() then."""
        while True:
            codes = self.exit_codes()
            elapsed = time.monotonic() - self._started
            reason = decide_stop_reason(codes, elapsed, timeout, fail_fast)
            if reason is not None:
                if timeout is not None and elapsed >= timeout:
                    write_stacks(list(self.procs.values()), sys.stderr)  # where it was stuck
                return self.stop(reason, grace)
            if all(code is not None for code in codes.values()):
                return self._collect(None)
            time.sleep(POLL_SECONDS)

    def stop(self, reason: str, grace: float = 10.0) -> ClusterResult:
        """SIGTERM to every host's command still running (as StopTrainingJob does), SIGKILL to
        those still running after `grace` seconds."""
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(c is None for c in self.exit_codes().values()):
            time.sleep(POLL_SECONDS)
        self.signal(signal.SIGKILL)
        return self._collect(reason)

    def _collect(self, reason: str | None) -> ClusterResult:
        results = {}
        for host, p in self.procs.items():
            try:
                results[host] = p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                # Only a process that ignores SIGKILL gets here (stuck in the kernel).
                raise ClusterError(f"{host}: the command did not end after SIGKILL") from None
        return ClusterResult(results=results, stop_reason=reason, seconds=time.monotonic() - self._started)

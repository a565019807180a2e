"""A rank that stops making progress fails the job instead of holding the cluster.

A deadlocked collective, a rank stuck in I/O, a peer that vanished without closing its
sockets: the other ranks wait in their next collective, and with MPI (which polls) or a
process group's default 30-minute timeout nothing ends the job before SageMaker's maximum
runtime. The training loop tells the watchdog when each step ends (`beat`); when none has
ended for `timeout_s`, the watchdog thread

  - prints every thread's Python stack on stderr (faulthandler: it needs nothing from the
    stuck thread),
  - records the root cause, naming the rank, its host and the call it is stuck in, the way a
    failing rank does (entrypoint/rank/record_errors.py: the leader's output/failure leads
    with it),
  - ends the process with HANG_EXIT_CODE, which makes the launcher (mpirun, torchrun) stop
    the other ranks.

Every rank runs its own watchdog, so each stuck rank's stack is in the log.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
import traceback

HANG_EXIT_CODE = 124  # what timeout(1) uses: "it ran out of time"


def build_hang_message(timeout_s: float, rank: int, host: str, frame_summary: traceback.FrameSummary | None) -> str:
    where = f" in {frame_summary.name} ({frame_summary.filename}:{frame_summary.lineno})" if frame_summary else ""
    return (f"no training step finished in {timeout_s:g} s on rank {rank} (host {host}); it is stuck{where}. "
            f"Every rank's stack is in the log. Raise hang_timeout_s if a step can take this long.")


class StepWatchdog:
    def __init__(self, timeout_s: float, rank: int, host: str):
        self.timeout_s = timeout_s
        self.rank = rank
        self.host = host
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._watched = threading.main_thread()
        self._thread = threading.Thread(target=self._watch, name="byoc-step-watchdog", daemon=True)

    def start(self) -> "StepWatchdog":
        if self.timeout_s > 0:
            self._last = time.monotonic()
            self._thread.start()
        return self

    def beat(self) -> None:
        self._last = time.monotonic()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        check_every = min(5.0, max(0.05, self.timeout_s / 10))
        while not self._stop.wait(check_every):
            if time.monotonic() - self._last > self.timeout_s:
                self._fire()

    def _fire(self) -> None:
        frame = sys._current_frames().get(self._watched.ident)
        stack = traceback.extract_stack(frame) if frame is not None else []
        message = build_hang_message(self.timeout_s, self.rank, self.host, stack[-1] if stack else None)
        try:
            sys.stderr.write(f"[hang] {message}\n")
            sys.stderr.flush()
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        try:
            from entrypoint.rank.record_errors import build_root_cause, emit_root_cause

            emit_root_cause(build_root_cause("TrainingHang", message, "".join(traceback.format_list(stack[-3:]))))
        except Exception:  # noqa: BLE001 - outside our image the launcher has no report to read
            pass
        os._exit(HANG_EXIT_CODE)

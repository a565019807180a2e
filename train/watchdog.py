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

Every rank runs its own watchdog, so each stuck rank's stack is in the log. They fire at about
the same time (each rank's last step ended in the same collective), and the job's root cause is
the earliest report (entrypoint/outcome/failure.py first_root_cause): so a rank that only waits in a
collective (an allreduce, a barrier, a broadcast or a wait in torch.distributed, mpi4py or
Horovod) for a rank that has not joined it prints its stack at once but reports a moment later
(decide_report_delay), and its message says what it waits in. The rank stuck in a call of its
own then leads output/failure.
"""

from __future__ import annotations

import faulthandler
import os
import re
import sys
import threading
import time
import traceback

HANG_EXIT_CODE = 124  # what timeout(1) uses: "it ran out of time"

# Where a rank that waits for the others is blocked: code of the collective libraries, or a line
# that calls a collective (mpi4py's and Horovod's run in C, so the caller's line is the last
# Python frame). `wait`/`recv` in lower case are left out: sockets, events and subprocesses use
# them too, and a rank stuck there is stuck in a call of its own.
COLLECTIVE_FOLDERS = ("/torch/distributed/", "/torch/nn/parallel/distributed.py", "/horovod/", "/mpi4py/")
COLLECTIVE_CALL = re.compile(
    r"\.\s*(all_?reduce_?|i?allreduce|grouped_allreduce_?|all_?gather\w*|reduce_scatter\w*|all_?to_?all\w*|"
    r"(?:monitored_)?barrier|broadcast\w*|i?bcast|gather(?:_object)?|scatter(?:_object_list)?|reduce|synchronize|"
    r"I?Allreduce|I?Allgatherv?|I?Alltoallv?|I?Barrier|I?Bcast|I?Gatherv?|I?Scatterv?|I?Reduce(?:_scatter)?|"
    r"Wait(?:all|any|some)?|Sendrecv|Recv)\s*\(")
# Autograd's backward waits there for DDP's gradient allreduce when a process group is running.
BACKWARD_FOLDER = "/torch/autograd/"

# How much later a rank that waits in a collective reports than one stuck elsewhere: more than
# the spread of the ranks' watchdog checks (check_every) and the clock difference between hosts.
COLLECTIVE_REPORT_DELAY_S = 10.0


def decide_collective_wait(stack: list[traceback.FrameSummary], in_process_group: bool = False) -> str | None:
    """The collective the innermost frame of `stack` waits in (a name such as "allreduce"), or
    None when it is stuck in a call of its own. in_process_group: torch.distributed is running
    (then a backward pass waits for DDP's gradient allreduce)."""
    if not stack:
        return None
    frame = stack[-1]
    filename = frame.filename.replace("\\", "/")
    match = COLLECTIVE_CALL.search(frame.line or "")
    if match:
        return match.group(1)
    if any(folder in filename for folder in COLLECTIVE_FOLDERS):
        return frame.name
    if in_process_group and BACKWARD_FOLDER in filename:
        return "backward (DDP's gradient allreduce)"
    return None


def decide_report_delay(timeout_s: float, check_every_s: float, collective: str | None) -> float:
    """Seconds between printing the stacks and reporting the root cause: none for a rank stuck
    in a call of its own; for one waiting in a collective, enough for the stuck rank to report
    first (capped by timeout_s: a test's 2 s timeout waits 2 s more, not 10)."""
    if collective is None:
        return 0.0
    return min(COLLECTIVE_REPORT_DELAY_S, max(timeout_s, 1.0)) + 2 * check_every_s


def build_hang_message(timeout_s: float, rank: int, host: str, frame_summary: traceback.FrameSummary | None,
                       collective: str | None = None) -> str:
    where = f" in {frame_summary.name} ({frame_summary.filename}:{frame_summary.lineno})" if frame_summary else ""
    if collective is not None:
        state = (f"it is waiting in a collective ({collective}){where}, for a rank that has not joined it: "
                 f"look for a rank stuck elsewhere")
    else:
        state = f"it is stuck{where}"
    return (f"no training step finished in {timeout_s:g} s on rank {rank} (host {host}); {state}. "
            f"Every rank's stack is in the log. Raise hang_timeout_s if a step can take this long.")


def decide_caller_frame(stack: list[traceback.FrameSummary]) -> traceback.FrameSummary | None:
    """The innermost frame of the job's own code (not an installed package's): where a rank
    that waits in a library's collective called it."""
    for frame in reversed(stack):
        if "-packages/" not in frame.filename.replace("\\", "/"):
            return frame
    return stack[-1] if stack else None


def probe_in_process_group() -> bool:
    """torch.distributed has a process group of more than one rank (read, never imported)."""
    dist = sys.modules.get("torch.distributed")
    try:
        return bool(dist is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)
    except Exception:  # noqa: BLE001 - a watchdog must not fail on a half-made process group
        return False


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
                self._fire(check_every)

    def _fire(self, check_every: float) -> None:
        frame = sys._current_frames().get(self._watched.ident)
        stack = traceback.extract_stack(frame) if frame is not None else []
        collective = decide_collective_wait(stack, probe_in_process_group())
        where = decide_caller_frame(stack) if collective is not None else (stack[-1] if stack else None)
        message = build_hang_message(self.timeout_s, self.rank, self.host, where, collective)
        try:
            sys.stderr.write(f"[hang] {message}\n")
            sys.stderr.flush()
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        # The stack is out now (the launcher may stop this rank at any moment once another
        # reports); the root cause waits, so that a rank stuck elsewhere is the job's first.
        last = self._last
        if self._stop.wait(decide_report_delay(self.timeout_s, check_every, collective)):
            return  # the training ended meanwhile
        if self._last != last:
            try:
                sys.stderr.write(f"[hang] rank {self.rank}: a training step finished after all; going on\n")
            except (OSError, ValueError):
                pass
            return
        try:
            from entrypoint.rank.record_errors import load_root_cause, emit_root_cause

            emit_root_cause(load_root_cause("TrainingHang", message, "".join(traceback.format_list(stack[-3:]))))
        except Exception:  # noqa: BLE001 - outside our image the launcher has no report to read
            pass
        os._exit(HANG_EXIT_CODE)

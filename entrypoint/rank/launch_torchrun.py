"""torchrun, as `python -m torch.distributed.run ARGS` runs it, which also reports a rank that a
signal killed as the job's root cause.

Usage: python launch_torchrun.py [TORCHRUN ARGS...]

A rank that dies of a signal (SIGABRT from a C++ abort, SIGSEGV, SIGKILL from the OOM killer)
runs no Python at its end, so the rank wrapper (record_errors.py) writes no record of it; torch's
agent only prints `exitcode: -6` in its summary. This catches torchrun's own error record of the
failure (ChildFailedError: the global rank, local rank, exit code and time of each failed rank)
and sends the first signal death as a BYOC-ROOT-CAUSE record, exactly as a rank sends its
exception: on stderr (this host's entrypoint reads it) and to every host's job port, signed, so
every host's output/failure leads with it, also a worker host that docker-compose stops once the
leader exits. Then torchrun ends as it would have (its summary, exit code 1).

The time of the record is when the rank died: a small thread waits for children to exit
without collecting them (waitid with WNOWAIT: torch's agent still reaps them). torch's own
record keeps whole seconds only, which would put a death before a failure on another host up
to a second earlier; it is used only where the thread missed a death (two children exiting
within DEATH_POLL_S).

Run by path, like record_errors.py, whose functions it uses.
"""

import _thread
import os
import sys
import time

try:
    import record_errors  # run by path: this folder is sys.path[0]
except ImportError:  # imported as entrypoint.rank.launch_torchrun (the tests)
    from entrypoint.rank import record_errors

DEATH_POLL_S = 0.02
_deaths: dict = {}  # pid -> time.time() when this process first saw it exited


def _watch_children() -> None:
    """Note when each child exits, leaving it for its owner (torch's agent) to collect: the
    wait returns the moment a child exits (WNOWAIT: it stays waitable), and again while that
    child waits to be collected, hence the short sleep then."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:  # no child yet, or none left
            info = None
        if info is not None and info.si_pid not in _deaths:
            _deaths[info.si_pid] = time.time()
            continue
        time.sleep(DEATH_POLL_S)


def report_signal_death(failures: dict, environ, deaths: dict) -> dict | None:
    """The record of the first rank in failures (torchrun's: global rank -> ProcessFailure) that
    a signal killed, sent as a rank's root cause; None when none was (an exception: the rank
    reported it itself). deaths: pid -> when it was seen exited (torch's whole second if not)."""
    killed = sorted((deaths.get(f.pid, float(f.timestamp)), rank, f) for rank, f in failures.items() if f.exitcode < 0)
    if not killed:
        return None
    when, rank, failure = killed[0]
    host = environ.get("SM_CURRENT_HOST") or os.uname().nodename
    record = record_errors.build_signal_root_cause(str(rank), str(failure.local_rank), host, -failure.exitcode,
                                                   when)
    record_errors.emit_root_cause(record)
    return record


def main(argv: list) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as run_torchrun

    sys.argv = ["torchrun", *argv]
    _thread.start_new_thread(_watch_children, ())
    try:
        run_torchrun(argv)
    except ChildFailedError as failed:
        report_signal_death(failed.failures, os.environ, dict(_deaths))
        raise


if __name__ == "__main__":
    main(sys.argv[1:])

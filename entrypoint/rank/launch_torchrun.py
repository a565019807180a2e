"""torchrun, as `python -m torch.distributed.run ARGS` runs it, which also reports a rank that a
signal killed as the job's root cause.

Usage: python launch_torchrun.py [--held] [TORCHRUN ARGS...]

--held: the next attempt's torchrun, started ahead during this one (entrypoint/run/held.py):
it imports torch (and what its forked ranks need: preload_for_forked_ranks) at the lowest
priority (run_at_low_priority), then waits for one line on its stdin, and runs only then (at its
end of input, without one, it exits 0, having started nothing). So a restart does not wait for
torchrun's import of torch, and the attempt beside it keeps its cores.

However it ends, torchrun ends without the interpreter's teardown (run_and_end): with torch
loaded that took 0.7 s, between a rank's failure and the exit the restart waits for.

A rank that dies of a signal (SIGABRT from a C++ abort, SIGSEGV, SIGKILL from the OOM killer)
runs no Python at its end, so the rank wrapper (record_errors.py) writes no record of it; torch's
agent only prints `exitcode: -6` in its summary. This catches torchrun's own error record of the
failure (ChildFailedError: the global rank, local rank, exit code and time of each failed rank)
and sends the first signal death as a BYOC-ROOT-CAUSE record, exactly as a rank sends its
exception: on stderr (this host's entrypoint reads it) and to every host's job port, signed, so
every host's output/failure leads with it, also a worker host that docker-compose stops once the
leader exits. Then torchrun ends as it would have (its summary, exit code 1).

The time of the record is when the rank died. A rank killed by SIGSEGV, SIGABRT, SIGBUS, SIGFPE or
SIGILL says so itself: the rank wrapper has faulthandler write its Python stacks to a crash file
in BYOC_CRASH_DIR (a folder made here) the moment the signal arrives, and the record takes the
file's time and, as where it happened, its stacks. That matters: a peer's "connection closed"
error is often dated a few ms before this launcher can see the rank's exit. For other signals
(SIGKILL) a small thread waits for children to exit
without collecting them (waitid with WNOWAIT: torch's agent still reaps them). torch's own
record keeps whole seconds only, which would put a death before a failure on another host up
to a second earlier; it is used only where the thread missed a death (two children exiting
within DEATH_POLL_S).

Run by path, like record_errors.py, whose functions it uses.
"""

import os
import sys
import time

try:
    import record_errors  # run by path: this folder is sys.path[0]
except ImportError:  # imported as entrypoint.rank.launch_torchrun (the tests)
    from entrypoint.rank import record_errors
internals = record_errors.internals  # torch's and CPython's internals, behind one seam (byoc_internals.py)

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
    folder = environ.get(record_errors.CRASH_DIR_ENV, "")
    killed = []
    for rank, f in failures.items():
        if f.exitcode < 0:
            # The rank's own word of its death first (when, to the nanosecond, and where), then ours.
            crash = load_crash_file(folder, f.pid)
            killed.append((crash[0] if crash else deaths.get(f.pid, float(f.timestamp)), rank, f, crash))
    if not killed:
        return None
    when, rank, failure, crash = min(killed, key=lambda k: (k[0], k[1]))
    host = environ.get("SM_CURRENT_HOST") or os.uname().nodename
    record = record_errors.build_signal_root_cause(str(rank), str(failure.local_rank), host, -failure.exitcode,
                                                   when)
    if crash is not None:
        record["where"] = crash[1]
        sys.stderr.write(f"[launch_torchrun] rank {rank}'s Python stacks when {record['type']} arrived:\n{crash[1]}\n")
    record_errors.emit_root_cause(record)
    return record


# How much of a crash file's stacks the record carries (the current thread's come first).
CRASH_TEXT_CHARS = 1500


def load_crash_file(folder: str, pid: int) -> tuple[float, str] | None:
    """(when the rank wrote it, its stacks) from the crash file faulthandler wrote in the rank
    (record_errors._record_fatal_signals); None when it wrote none."""
    if not folder:
        return None
    path = record_errors.build_crash_file_path(folder, pid)
    try:
        with open(path, errors="replace") as f:
            text = f.read(CRASH_TEXT_CHARS + 1)
        # The kernel stamps files from its coarse clock: this can be up to one tick (1-10 ms)
        # before the rank's own time.time() at the crash. Hosts' clocks differ by more than that.
        when = os.stat(path).st_mtime_ns / 1e9
    except OSError:
        return None
    if not text:
        return None
    text = build_crash_text(text)
    return when, text[:CRASH_TEXT_CHARS] + ("\n..." if len(text) > CRASH_TEXT_CHARS else "")


def build_crash_text(dump: str) -> str:
    """faulthandler's dump with the crashing thread's stack first, and without the rank
    wrapper's own line-flushing thread (record_errors.py): a reader looks for the first frame."""
    blocks = dump.strip("\n").split("\n\n")
    head, threads = blocks[0], blocks[1:]
    current = [b for b in threads if b.startswith("Current thread")]
    others = [b for b in threads if not b.startswith("Current thread") and "in flush_partial_lines" not in b]
    return "\n\n".join([head, *current, *others]) + "\n"


HOLD_FLAG = "--held"  # entrypoint/run/held.py's


def decide_preload(torchrun_argv: list) -> bool:
    """Whether torchrun forks its ranks (--start-method fork), read as torchrun reads its
    arguments (a program's own `--start-method` is the program's)."""
    import contextlib
    import io

    from torch.distributed.run import parse_args

    try:
        with contextlib.redirect_stderr(io.StringIO()):
            return parse_args(torchrun_argv).start_method == "fork"
    except SystemExit:  # arguments torchrun refuses: it says so itself, once, when it runs
        return False


def preload_for_forked_ranks() -> None:
    """Import torch._dynamo before any rank is forked (about 0.8 s on a 2-core host). Each rank
    imports it anyway: DDP's constructor does. And torch's agent imports it the moment a rank
    fails: its log formatter reads torch._dynamo.config to print the failure's traceback. In a
    restart both imports lay on the way from the failure to the next step; here they are made
    once, before the ranks start, and a held torchrun makes them while the attempt before runs."""
    environ = dict(os.environ)
    internals.import_dynamo()  # where it cannot, each rank imports it where it needs it
    # What the import set in the environment (inductor's TORCHINDUCTOR_CACHE_DIR, its default
    # folder) is not the job's: a started rank, which imports it later, has none of it.
    os.environ.clear()
    os.environ.update(environ)


def load_torchrun(argv: list) -> None:
    """What torchrun imports, and what its forked ranks need (preload_for_forked_ranks), with
    the exit handlers those imports register kept for the ranks (record_import_exit_handlers)."""
    def load() -> None:
        import importlib

        for name in ("torch.distributed.elastic.multiprocessing.errors", "torch.distributed.run"):  # main's
            importlib.import_module(name)
        if decide_preload(argv):
            preload_for_forked_ranks()

    record_import_exit_handlers(load)


def record_import_exit_handlers(load) -> None:
    """load(), noting each exit handler registered meanwhile (atexit.register, less what
    atexit.unregister takes back): those are what importing these modules registers (logging's
    shutdown, multiprocessing's, torch's), which a started rank registers as it imports them,
    and a forked rank registers again after it clears torchrun's (record_errors.
    _keep_import_exit_handlers reads them from record_errors.IMPORT_EXIT_HANDLERS). atexit's
    own functions are back in place before any rank is forked (byoc_internals.record_exit_handlers)."""
    handlers = []
    try:
        internals.record_exit_handlers(load, handlers)
    finally:
        setattr(record_errors, record_errors.IMPORT_EXIT_HANDLERS, handlers)


HELD_IMPORT_NICE = 19  # the lowest priority: a held torchrun imports in the cores' idle time
AUTOGROUP = "/proc/self/autogroup"  # this session's scheduling group, where the kernel has them


def run_at_low_priority(fn) -> None:
    """fn (a held torchrun's imports: about 1.5 s of a core, made while the attempt before runs)
    in a thread at the lowest priority, so that attempt's ranks keep their cores: on this 2-core
    host two busy processes kept 78% of their work beside such an import at full priority, 96%
    beside one at the lowest.
    Two settings, as the kernel schedules:
      - the thread's nice value (Linux's nice is a thread's): the main thread, which later runs
        torchrun and forks the ranks, keeps its own priority, and the ranks inherit that one;
      - where the kernel groups a session's threads (sched_autogroup, on when no CPU cgroup
        holds the process: these emulated hosts), a thread's nice counts only within its
        session: this session's group (the held torchrun's own) takes the nice value while fn
        runs, and gets its own back after (raising nice needs no privilege; lowering it back to
        the group's own 0 needs none either). The ranks start sessions of their own.
    A restart ends the ranks of the attempt before, so an import not done by then finishes at
    full speed on cores gone idle. Where a setting is refused, fn runs without it."""
    import threading

    group_nice = load_autogroup_nice()

    def low() -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), HELD_IMPORT_NICE)
        except OSError:
            pass
        fn()

    if group_nice is not None:
        write_autogroup_nice(HELD_IMPORT_NICE)
    try:
        loader = threading.Thread(target=low, name="held-import", daemon=True)
        loader.start()
        loader.join()
    finally:
        if group_nice is not None:
            write_autogroup_nice(group_nice)


def load_autogroup_nice() -> int | None:
    """This session's group's nice value (`/autogroup-7 nice 0`); None without the file."""
    try:
        with open(AUTOGROUP) as f:
            return int(f.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


AUTOGROUP_TRIES = 50  # the kernel takes one change of any group's nice per 0.1 s, machine-wide
AUTOGROUP_RETRY_S = 0.02


def write_autogroup_nice(nice: int) -> None:
    """Set this session's group's nice value; where refused, it stays as it is."""
    import errno

    for _ in range(AUTOGROUP_TRIES):
        try:
            with open(AUTOGROUP, "w") as f:
                f.write(str(nice))
            return
        except OSError as error:
            if error.errno != errno.EAGAIN:  # EAGAIN: another group's change in the last 0.1 s
                return
            time.sleep(AUTOGROUP_RETRY_S)


def main(argv: list) -> None:
    held = argv[:1] == [HOLD_FLAG]
    argv = argv[1:] if held else argv
    if held:
        run_at_low_priority(lambda: load_torchrun(argv))
    else:
        load_torchrun(argv)
    if held and not sys.stdin.readline():  # the entrypoint let it go unused
        return
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as run_torchrun

    sys.argv = ["torchrun", *argv]
    if not internals.start_thread(_watch_children):
        import threading

        threading.Thread(target=_watch_children, daemon=True).start()
    import shutil
    import tempfile

    crash_dir = tempfile.mkdtemp(prefix="byoc-crash-")  # the ranks inherit our environment
    os.environ[record_errors.CRASH_DIR_ENV] = crash_dir
    try:
        run_torchrun(argv)
    except ChildFailedError as failed:
        report_signal_death(failed.failures, os.environ, dict(_deaths))
        raise
    finally:
        shutil.rmtree(crash_dir, ignore_errors=True)


def run_and_end(argv: list, run=None) -> None:
    """main (or run: the tests' stand-in for torchrun), then this process ends as Python would
    end it, but for the teardown of its modules (record_errors.end_without_teardown: the
    program's threads joined, its exit handlers run, its files flushed). With torch and torch._dynamo loaded that teardown takes about 0.7 s on a
    2-core host, and it lies on a restart's path: from a rank's failure to this torchrun's exit
    the entrypoint waits for, before the next attempt starts. KeyboardInterrupt takes Python's
    own way (it ends the process by SIGINT)."""
    try:
        (run or main)(argv)
        code = 0
    except SystemExit as exc:
        code = record_errors.decide_exit_code(exc.code)
    except KeyboardInterrupt:
        raise
    except BaseException:  # noqa: BLE001 - printed as Python prints it, then the exit status 1
        sys.excepthook(*sys.exc_info())
        code = 1
    record_errors.end_without_teardown(code)


if __name__ == "__main__":
    run_and_end(sys.argv[1:])

"""Run a user's Python program as `python script.py args` (or `python -m module args`) would,
and record the exception that ends it, so the failure report can name the root cause.

Usage: python record_errors.py SCRIPT [ARGS...]   |   python record_errors.py -m MODULE [ARGS...]
       python record_errors.py --exec PROGRAM [ARGS...]   (another program: this host's values, then exec)

Run by path, never with -m: this folder then becomes sys.path[0] only until we replace it, and
nothing in the user's code folder (an `entrypoint.py`, a `train.py`) can shadow it. Standard
library only, imported lazily where possible: this runs in every rank.

On an uncaught exception it
  - prints one line `BYOC-ROOT-CAUSE {json}` on stderr (host, rank, exception type, message,
    time, last frames): it travels with the rank's output (through mpirun and torchrun to the
    leader) and the entrypoint picks the earliest one as the root cause; under torchrun and
    the parameter server it also goes to every host's job port (BYOC_JOB_PORTS);
  - writes torchelastic's error file when torchrun asked for one (TORCHELASTIC_ERROR_FILE), so
    torchrun's own summary names the failing rank too;
  - prints the usual traceback and exits 1; under MPI with more than one rank it aborts the
    whole job (what `python -m mpi4py` does), so the other ranks do not hang in a collective.
"""

import _thread
import os
import runpy
import sys
import time

# torch's and CPython's internals, behind one seam (byoc_internals.py, beside this file).
if __package__:  # imported as entrypoint.rank.record_errors: the entrypoint, the tests, the image's .pth
    from entrypoint.rank import byoc_internals as internals
else:  # run by path (every rank) or imported by its bare name (launch_torchrun.py)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # this folder: under -P or -I it is not first
    try:
        import byoc_internals as internals
    finally:
        del sys.path[0]

MARKER = "BYOC-ROOT-CAUSE "
# A root cause sent to a job port is `BYOC-SIGNED <hmac> BYOC-ROOT-CAUSE {json}`: the HMAC-SHA256
# of the record line with the job's key (BYOC_JOB_PORT_KEY, hex; made by the
# entrypoint), so a host's port takes root causes only from this job's ranks. These words are a
# standard-library copy of entrypoint/hosts/job_port.py's, the protocol's own module (a test
# holds the two to the same words).
SIGNED = "BYOC-SIGNED "
JOB_KEY_ENV = "BYOC_JOB_PORT_KEY"
JOB_KEY_OLD_ENV = "BYOC_JOB_REPORT_KEY"  # its name until 2026-11: still read, for one release
JOB_PORTS_ENV = "BYOC_JOB_PORTS"  # where every host's job port is: host:port,host:port
MESSAGE_LIMIT = 2000
# Environment variables whose names hold one of these words carry secrets: their values are
# masked in every report, in every form (entrypoint/outcome/failure.py uses the same rule).
SECRET_NAME_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "SESSION")
MIN_SECRET_CHARS = 6  # a shorter value (or form of one) is not masked: it would mask ordinary text
MASK = "****"
# Between any two characters of a secret in text: nothing, or a line break (a wrapped print, a
# value split over two output lines) and the next line's indentation. Not \s*: blank lines are
# not indentation, and a run of line breaks would make the match backtrack without end.
SECRET_LINE_BREAK = r"(?:\r?\n[^\S\r\n]*)?"
REPORT_TIMEOUT_S = 5.0

# What sys.path was before the user's program: this folder first, then the interpreter's own.
_INTERPRETER_PATH = sys.path[1:]


_STDLIB_LOCK = _thread.RLock()  # the launcher's output pumps call it from their own threads


def _stdlib(name: str):
    """A standard-library module, imported only when needed: json, socket and traceback
    together cost every rank ~12 ms of start-up, and most programs never raise. By then
    sys.path[0] is the user's code folder, so the import looks only where the interpreter's
    own modules are: a json.py or socket.py of the user's cannot stand in for them."""
    with _STDLIB_LOCK:  # a second thread must not take a module the first is still importing
        module = sys.modules.get(name)
        if module is None:
            saved = sys.path[:]
            sys.path[:] = _INTERPRETER_PATH
            try:
                module = __import__(name)
            finally:
                sys.path[:] = saved
        return module


def is_secret_name(name: str) -> bool:
    upper = name.upper()
    return any(word in upper for word in SECRET_NAME_WORDS)


def build_secret_values(environ) -> list:
    """The values to mask: those of environ's secret-named variables, MIN_SECRET_CHARS or
    longer, longest first (the launcher and the ranks use this one rule)."""
    values = {v for k, v in environ.items() if is_secret_name(k) and len(v) >= MIN_SECRET_CHARS}
    return sorted(values, key=lambda v: (-len(v), v))


def build_secret_forms(values) -> list:
    """Every form a secret value takes in text: as written, escaped as repr() and JSON write
    it (inside the quotes), URL-encoded; longest first, so no form is masked only in part."""
    json = _stdlib("json")
    _stdlib("urllib.parse")
    parse = sys.modules["urllib.parse"]
    forms = set()
    for value in values:
        forms |= {value, repr(value)[1:-1], json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1],
                  parse.quote(value, safe=""), parse.quote_plus(value, safe="")}
    return sorted((f for f in forms if len(f) >= MIN_SECRET_CHARS), key=lambda f: (-len(f), f))


def build_secret_pattern(values):
    """One regular expression that finds every form of every secret (build_secret_forms), also
    where the text breaks it over lines between any two of its characters (SECRET_LINE_BREAK),
    whatever its length; None when there is nothing to mask. The one masking mechanism: the
    ranks' records here, the entrypoint's reports and output tail (entrypoint/outcome/failure.py).
    It matches (empty) at every place a secret starts, the secret as group 1: overlapping
    occurrences are all found (find_secret_spans)."""
    forms = build_secret_forms(values) if values else []
    if not forms:
        return None
    re = _stdlib("re")
    return re.compile("(?=(" + "|".join(SECRET_LINE_BREAK.join(re.escape(c) for c in form) for form in forms) + "))")


def find_secret_spans(pattern, text: str, pos: int = 0) -> list:
    """Where the secrets of pattern (build_secret_pattern) lie in text[pos:]: [start, end) pairs."""
    return [match.span(1) for match in pattern.finditer(text, pos)]


def build_masked(text: str, spans) -> str:
    """text with each run of masked characters (spans: [start, end) pairs, may overlap) one MASK."""
    out, at = [], 0
    for start, end in sorted(spans):
        if end <= at:
            continue
        if start >= at:
            out += [text[at:start], MASK]
        at = end
    return "".join(out) + text[at:]


def mask_secrets(text: str, environ=None) -> str:
    """text with every form of every secret in environ (default: ours) masked, also where it is
    broken over lines: each occurrence, breaks and all, becomes one MASK."""
    pattern = build_secret_pattern(build_secret_values(os.environ if environ is None else environ))
    return build_masked(text, find_secret_spans(pattern, text)) if pattern is not None else text


# --- the text policy: what any text becomes on its way to a file, the log or a job port ---------
# A reason must be readable wherever it lands (output/failure is SageMaker's FailureReason in
# the console and the API): control characters other than newline and tab are shown as escapes
# (`\x1b`, `\x00`), never passed raw; a lone surrogate, which no UTF-8 writer takes, is shown as
# the byte it stands for (`\xe9`: a file name that was not UTF-8, read with surrogateescape) or
# as its code point (`\ud800`). Printable text, newline and tab pass unchanged.
_UNREADABLE = None


def build_readable_text(text: str) -> str:
    """text with every character a reader or a UTF-8 writer cannot take escaped (see above)."""
    global _UNREADABLE
    if _UNREADABLE is None:
        _UNREADABLE = _stdlib("re").compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
    return _UNREADABLE.sub(_escape_character, text)


def _escape_character(match) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape's stand-in for one undecodable byte
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _rank() -> str:
    for name in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        if os.environ.get(name):
            return os.environ[name]
    return "0"


def _record(exc: BaseException, message: str | None = None) -> None:
    json, traceback = _stdlib("json"), _stdlib("traceback")
    frames = traceback.extract_tb(exc.__traceback__)
    # Drop our own and runpy's frames: the report shows the user's code.
    user_frames = [f for f in frames if f.filename != __file__ and "runpy" not in os.path.basename(f.filename)]
    # Secrets are masked before the message is cut: half a secret is still a secret.
    record = load_root_cause(
        type(exc).__qualname__ if type(exc).__module__ in ("builtins", "__main__") else f"{type(exc).__module__}.{type(exc).__qualname__}",
        str(exc) if message is None else message, "".join(traceback.format_list(user_frames[-3:])))
    emit_root_cause(record)
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:
        payload = {
            "message": {
                "message": f"{record['type']}: {record['message']}",
                "extraInfo": {
                    "py_callstack": mask_secrets("".join(traceback.format_exception(exc))),
                    "timestamp": str(int(record["time"])),
                },
            }
        }
        try:
            with open(error_file, "w") as f:
                json.dump(payload, f)
        except OSError:
            pass


SIGNAL_EXIT_CODES = range(129, 129 + 64)  # 128 + a signal's number: how a program says it was stopped


def describe_failing_exit(exit_arg) -> str | None:
    """The root cause's message for `sys.exit(exit_arg)` when it fails the rank: the code, or
    the text a program gave instead of one (Python prints it). None when it does not fail it
    (exit code 0), and for 128 + a signal's number (143): a script's SIGTERM handler ends so
    after its checkpoint, answering a stop that another failure, or the platform, sent; the
    stop's reason leads, not the answer to it (a host lost: tests/multihost/test_faults.py)."""
    if exit_arg is None:
        return None
    if isinstance(exit_arg, int):
        code = exit_arg & 0xFF
        if code == 0 or code in SIGNAL_EXIT_CODES:
            return None
        return f"the program called sys.exit({exit_arg}): exit code {code}"
    return f"the program called sys.exit() with a message, exit code 1: {exit_arg}"


def _record_failing_exit(exc: SystemExit) -> None:
    """A sys.exit that fails a torchrun rank is its root cause, as an exception is: the failure
    report was led by torch's `ChildFailedError`, naming no rank, host or line (issue 62). One
    process's report already names the program and its exit code."""
    message = describe_failing_exit(exc.code)
    if message is not None and os.environ.get("TORCHELASTIC_RUN_ID"):
        _record(exc, message)


def load_root_cause(type_name: str, message: str, where: str) -> dict:
    """A root-cause record of this rank (what _record makes from an exception). The message is
    masked whole, before it is cut: a secret across the cut, even broken over lines, is masked."""
    message = mask_secrets(message)
    if len(message) > MESSAGE_LIMIT:
        message = message[:MESSAGE_LIMIT] + "..."
    return {"host": os.environ.get("SM_CURRENT_HOST") or _stdlib("socket").gethostname(), "rank": _rank(),
            "type": type_name, "message": message, "time": time.time(), "where": mask_secrets(where)}


def build_root_cause_line(record: dict) -> str:
    """`BYOC-ROOT-CAUSE {json}`, ASCII: any text survives the trip."""
    return MARKER + _stdlib("json").dumps(record, ensure_ascii=True)


def send_root_cause(record: dict, environ) -> None:
    """To every host's job port of environ's launch, for a launcher that saw a rank die."""
    _send_to_hosts(build_root_cause_line(record)[len(MARKER):], environ)


def emit_root_cause(record: dict) -> None:
    """The record on stderr (it travels with the rank's output to the leader) and to every
    host's job port. Also for code that fails a rank without an exception (train/watchdog.py)."""
    line = _stdlib("json").dumps(record, ensure_ascii=True)
    try:
        sys.stderr.write(MARKER + line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    _send_to_hosts(line)


def _send_to_hosts(line: str, environ=None) -> None:
    """Send the record to every host's job port (entrypoint/hosts/job_port.py), if the launch has
    them (environ: the rank's, default ours): each host's output/failure then leads with the
    job's first failure, wherever it happened. In parallel and bounded: a dead host must not
    hold up a failing rank."""
    environ = os.environ if environ is None else environ
    addresses = [a for a in environ.get(JOB_PORTS_ENV, "").split(",") if a]
    key = environ.get(JOB_KEY_ENV) or environ.get(JOB_KEY_OLD_ENV, "")
    if not addresses or not key:
        return  # a port takes only signed messages: without the key, the stderr record must do
    socket, threading = _stdlib("socket"), _stdlib("threading")
    record = MARKER + line
    try:
        payload = f"{SIGNED}{sign_record(key, record)} {record}\n".encode("utf-8")
    except ValueError:  # not a hex key: nothing a port would take
        return

    def send(address: str) -> None:
        try:
            host, _, port = address.rpartition(":")
            with socket.create_connection((host, int(port)), timeout=REPORT_TIMEOUT_S) as conn:
                conn.sendall(payload)
        except (OSError, ValueError):
            pass  # the local record is already printed

    threads = [threading.Thread(target=send, args=(a,), daemon=True) for a in addresses]
    for t in threads:
        t.start()
    deadline = time.monotonic() + REPORT_TIMEOUT_S
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))


def sign_record(key_hex: str, record: str) -> str:
    """HMAC-SHA256 of a record line (`BYOC-ROOT-CAUSE {json}`) with the job's key."""
    hmac = _stdlib("hmac")
    return hmac.new(bytes.fromhex(key_hex), record.encode("utf-8"), "sha256").hexdigest()


# What each fatal signal usually means, for the reason a person reads (Linux numbers: the same
# on x86_64 and aarch64 for these). `signal` is not imported: it costs every rank ~2 ms.
SIGNALS = {
    1: ("SIGHUP", "its terminal or session went away"),
    2: ("SIGINT", "interrupted (Ctrl-C, or a stop passed on)"),
    4: ("SIGILL", "an illegal instruction: a native library built for another CPU"),
    6: ("SIGABRT", "the process aborted, often a C++ assertion or `terminate` in a library"),
    7: ("SIGBUS", "a bus error: often /dev/shm too small (Docker gives 64 MB; DataLoader workers use it) "
                  "or a memory-mapped file cut short"),
    8: ("SIGFPE", "an arithmetic error in native code (an integer division by zero)"),
    9: ("SIGKILL", "killed outright: the kernel's out-of-memory killer, or something outside the job"),
    11: ("SIGSEGV", "a segmentation fault: an invalid memory access in native code"),
    13: ("SIGPIPE", "it wrote to a pipe or socket whose reader was gone"),
    15: ("SIGTERM", "it was asked to stop"),
}


def describe_signal(signum: int) -> tuple[str, str]:
    """(`SIGABRT`, `SIGABRT (signal 6): the process aborted, ...`)."""
    if signum not in SIGNALS:
        return f"signal {signum}", f"signal {signum}"
    name, meaning = SIGNALS[signum]
    return name, f"{name} (signal {signum}): {meaning}"


def build_signal_root_cause(rank: str, local_rank: str, host: str, signum: int, when: float) -> dict:
    """The root-cause record of a rank killed by a signal: it could write none itself, so its
    launcher does (entrypoint/rank/launch_torchrun.py), in the form a rank's exception takes."""
    name, described = describe_signal(signum)
    return {"host": host, "rank": str(rank), "type": name,
            "message": f"rank {rank} (local rank {local_rank}) on {host} was killed by {described}",
            "time": when, "where": ""}


def _abort_mpi_job() -> None:
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None:
        return
    try:
        if mpi.Is_initialized() and not mpi.Is_finalized() and mpi.COMM_WORLD.Get_size() > 1:
            sys.stderr.flush()
            mpi.COMM_WORLD.Abort(1)
    except Exception:  # noqa: BLE001 - best effort on the way out
        pass


def _apply_host_env() -> None:
    """Under mpirun, this host's own SM_* values replace the ones forwarded from the leader."""
    path = os.environ.get("BYOC_HOST_ENV_FILE")
    if not path:
        return
    try:
        with open(path) as f:
            values = _stdlib("json").load(f)
    except (OSError, ValueError):
        return
    os.environ.update({k: v for k, v in values.items() if isinstance(v, str)})


def exec_with_host_env(argv: list) -> int:
    """`--exec PROGRAM ARGS...` (a shell script or an executable under mpirun): this host's
    values (_apply_host_env), then the program in this process's place. Returns only when it
    cannot be started (127, as a shell says for a program it cannot run)."""
    if not argv:
        sys.stderr.write("record_errors.py: --exec needs a program\n")
        return 2
    _apply_host_env()
    try:
        os.execv(argv[0], argv)
    except OSError as exc:
        sys.stderr.write(f"record_errors.py: cannot run {argv[0]}: {exc.strerror or exc}\n")
    return 127


def _print_stacks_on_request() -> None:
    """SIGUSR1 prints every thread's Python stack on stderr and the program goes on: how the
    entrypoint shows where each rank is (python -m entrypoint: `kill -USR1` the entrypoint).
    faulthandler answers in C, so it works even while the rank is stuck in a call. A program
    that installs its own SIGUSR1 handler replaces this one."""
    import atexit
    import faulthandler

    signals = internals.signal_module()  # the C module: `signal` would import enum, ~2 ms of every rank's start
    # Ignored first: faulthandler keeps what was there before as the handler it puts back (at
    # unregister, and at the interpreter's end), and the default would end the rank.
    signals.signal(signals.SIGUSR1, signals.SIG_IGN)
    faulthandler.register(signals.SIGUSR1, file=sys.stderr, all_threads=True, chain=False)
    # The entrypoint asks only a rank that handles SIGUSR1 (run/processes.signal_ranks_below);
    # at the interpreter's end its handlers go back to the default, which ends the process: a
    # question in that window would turn a rank that succeeded into "killed by signal 10".
    # Registered first, so run last of the exit handlers (a hang in another is still answered).
    atexit.register(_stop_answering)


def _stop_answering() -> None:
    """SIGUSR1 ignored from here to the process's end: the rank cannot answer any more, and must
    not die of the question."""
    import faulthandler

    signals = internals.signal_module()
    faulthandler.unregister(signals.SIGUSR1)  # puts back SIG_IGN (registered over it)
    signals.signal(signals.SIGUSR1, signals.SIG_IGN)  # a program's own handler, too


# Where a rank killed by SIGSEGV, SIGABRT, SIGBUS, SIGFPE or SIGILL leaves its Python stacks, set
# by the launcher that reports such deaths (launch_torchrun.py): crash-<pid>.txt in that folder.
CRASH_DIR_ENV = "BYOC_CRASH_DIR"
_crash_file = None  # open for the life of the rank: faulthandler writes to its descriptor


def build_crash_file_path(folder: str, pid: int) -> str:
    return os.path.join(folder, f"crash-{pid}.txt")


def _record_fatal_signals() -> None:
    """faulthandler writes the rank's Python stacks to its crash file the moment a fatal signal
    arrives, before the process dies: the launcher takes the death's time from the file (its
    own view comes later than the peers', whose "connection closed" errors would lead) and
    where it happened from its text. Without that launcher (one process, mpirun's ranks) the
    stacks go to stderr, where the log and output/failure's last lines have them (mpirun only
    prints that a rank "exited on signal 11"). A program that runs with faulthandler on already
    (PYTHONFAULTHANDLER, -X faulthandler) keeps its own, on stderr."""
    global _crash_file
    import faulthandler  # built in: no import cost

    if faulthandler.is_enabled():
        return
    folder = os.environ.get(CRASH_DIR_ENV)
    if not folder:
        try:
            faulthandler.enable(file=sys.stderr, all_threads=True)
        except (AttributeError, ValueError, OSError):  # a stderr without a descriptor
            pass
        return
    try:
        _crash_file = open(build_crash_file_path(folder, os.getpid()), "w")
    except OSError:
        return
    faulthandler.enable(file=_crash_file, all_threads=True)


# A partial line (a prompt, `print(..., end="")` before a long step) is written after at most
# this long; a whole line is written at once.
PARTIAL_LINE_FLUSH_S = 0.2


# Where no rank wrapper runs the ranks (SageMaker SDK v3's drivers), BYOC_WHOLE_LINES=1 is set
# and the image's byoc-whole-lines.pth calls start_whole_lines in every Python process.
def start_whole_lines() -> None:
    """Make stdout and stderr write each line with one write(2): launchers tag what each write
    delivers (mpirun's `[1,0]<stdout>:`), so a line written in pieces is cut, and glued to
    another rank's line. print() writes its text and its newline as two calls, and the images'
    PYTHONUNBUFFERED=1 passes each straight through; Python's own buffer cuts at 8 KiB.

    Now the text layer keeps the pieces and writes at each newline (line_buffering, not
    write_through): one write per line, or per group of whole lines. A line longer than the text
    layer's 8 KiB chunk, or than what a pipe takes at once (PIPE_BUF, 4 KiB), may still arrive
    in pieces. A partial line is written by a small thread after PARTIAL_LINE_FLUSH_S, and at
    exit; the thread stops first at exit (atexit), so it never writes while the interpreter ends.
    Once per process: the image's .pth file may have started it before this wrapper runs."""
    if getattr(sys, "_byoc_whole_lines", False):
        return
    sys._byoc_whole_lines = True
    streams = []
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True, write_through=False)
            streams.append(stream)
        except (AttributeError, ValueError, OSError):  # replaced, closed or not a text file: leave it
            pass
    if not streams:
        return
    import atexit

    stop = _thread.allocate_lock()
    stopped = _thread.allocate_lock()
    stop.acquire()
    stopped.acquire()

    def flush_partial_lines() -> None:
        try:
            while not stop.acquire(timeout=PARTIAL_LINE_FLUSH_S):
                for stream in streams:
                    try:
                        stream.flush()  # nothing pending: no write at all
                    except (OSError, ValueError):  # closed, or the reader is gone
                        pass
        finally:
            stopped.release()

    def stop_flushing() -> None:
        stop.release()
        stopped.acquire(timeout=5 * PARTIAL_LINE_FLUSH_S)

    if not internals.start_thread(flush_partial_lines):
        _stdlib("threading").Thread(target=flush_partial_lines, daemon=True).start()
    atexit.register(stop_flushing)


def build_restart_note(environ) -> str | None:
    """The line a restarted torchrun rank group logs (once per host: local rank 0). torchrun's
    own log of a restart is at INFO, which it does not print by default."""
    count = environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if count in ("", "0") or environ.get("LOCAL_RANK", "0") != "0":
        return None
    return (f"[entrypoint] restart {count} of {environ.get('TORCHELASTIC_MAX_RESTARTS', '?')}: torchrun started this "
            f"host's ranks again after one failed (BYOC_MAX_RESTARTS)")


def _log_torchrun_restart(environ) -> None:
    note = build_restart_note(environ)
    if note:
        sys.stderr.write(note + "\n")
        sys.stderr.flush()


def _flush_open_files() -> None:
    """Flush every Python file object still open: the interpreter's teardown would have (a file
    the program never closed is flushed when it is freed), and end_without_teardown skips it."""
    base = internals.io_base_type()  # the C base of every file object (io.IOBase's ABC check asks others)
    gc = _stdlib("gc")
    for obj in gc.get_objects():
        if issubclass(type(obj), base):
            try:
                if not obj.closed and obj.writable():
                    obj.flush()
            except Exception:  # noqa: BLE001 - a pipe with no reader, a detached wrapper: nothing to save
                pass


def end_without_teardown(code: int) -> None:
    """End a rank whose program has ended (returned, sys.exit, or an exception already
    recorded) the way the interpreter would, but without tearing its modules down.

    Why: with torch.distributed up, gloo's (and NCCL's) C++ threads can still hold finished work
    objects that refer to Python objects; freeing them while the interpreter tears down aborts
    the process (SIGABRT, "terminate called without an active exception"; pytorch/pytorch#179291),
    so a rank that finished its work fails the job. Seen in 1 of 4 SDK local-mode runs of
    PyTorch's DDP example, and twice in ~900 runs of train/ddp_train in CI.

    What the interpreter does at exit still happens, in its order: wait for the program's
    non-daemon threads, run its atexit handlers (logging, multiprocessing, tempfile, a user's
    own), flush every open file, finalize MPI where mpi4py started it (mpirun calls a rank
    that exits without MPI_Finalize a failure). Only the module teardown is skipped. Used only
    once torch.distributed is loaded: other programs end as Python ends them. torchrun ends
    this way too (launch_torchrun.run_and_end): there the teardown is time on a restart's path.
    Where the interpreter's exit handlers cannot be run from here (byoc_internals.
    run_exit_handlers), the interpreter ends the process its own way (SystemExit), teardown and all."""
    internals.join_non_daemon_threads()  # what Py_Finalize does first
    if not internals.run_exit_handlers():
        raise SystemExit(code)
    mpi = sys.modules.get("mpi4py.MPI")
    try:
        if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
            mpi.Finalize()
    except Exception:  # noqa: BLE001 - ending anyway; mpirun reports a rank that did not finalize
        pass
    _flush_open_files()
    if code == 0 and is_forked_rank() and not _handed_ahead:
        # torch's worker wrapper hands its torchrun the function's return at its end, then
        # waits for torchrun to read it: an exit here would leave torchrun waiting for a
        # return that never comes. Not handed ahead (another torch: _hand_torchrun_the_return):
        # the wrapper's own way, where a stop's close (torchrun's SIGTERM) ends the waiting
        # rank at once at least.
        signals = internals.signal_module()
        for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"):
            signals.signal(getattr(signals, name), signals.SIG_DFL)
        return
    os._exit(code)


_handed_ahead = False  # a forked rank's return is torchrun's already (_become_forked_rank)


def _hand_torchrun_the_return() -> bool:
    """A forked rank, as it starts: put the return torch's worker wrapper would put at its end
    (None: torch.distributed.elastic.multiprocessing.api._wrap, below us on the stack), so the
    rank may end as a started rank does, at any time, in any way. Otherwise torchrun waits for
    every rank's return before it calls the job done: a rank whose program ends with
    os._exit(0) (train/'s scripts do, to skip a teardown that can abort: script.py), or whose
    library calls exit(0), would leave torchrun waiting for ever; and a torchrun closing its
    ranks on a stop never reads it, so the wrapper's own wait at its end would hold a rank that
    finished until torchrun's SIGKILL 30 s later, past the grace period (tests/multihost/
    test_jobs.py: 137 where torchrun's 1 is due). With every return in, torchrun waits for the
    ranks' exits instead (torch.multiprocessing's join), which tells a failure as before. The
    queue is a pipe written at once (SimpleQueue): byoc_internals.hand_torchrun_the_return."""
    return internals.hand_torchrun_the_return()


def decide_exit_code(exit_arg) -> int:
    """The exit status Python gives `sys.exit(exit_arg)`: None is 0, an int is itself (the
    kernel keeps its low 8 bits), anything else is printed on stderr and is 1."""
    if exit_arg is None:
        return 0
    if isinstance(exit_arg, int):
        return exit_arg & 0xFF
    try:
        sys.stderr.write(f"{exit_arg}\n")
    except Exception:  # noqa: BLE001
        pass
    return 1


def _start_step_figures() -> None:
    """The job report's step figures (step_figures.py, beside this file), when the entrypoint
    asked for them (BYOC_REPORT_DIR); loaded by path, like this file."""
    if not os.environ.get("BYOC_REPORT_DIR"):
        return
    try:
        import importlib.util

        here = os.path.dirname(os.path.abspath(__file__))
        spec = importlib.util.spec_from_file_location("byoc_rank_figures", os.path.join(here, "step_figures.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.start(os.environ, module)
    except Exception:  # noqa: BLE001 - the report is a bonus: never the rank's failure
        pass


# A rank torchrun forked names itself so (its /proc/<pid>/comm, 15 bytes at most): its command
# line is its torchrun's, and its environment in /proc is torchrun's too (run/processes.py finds
# and labels the ranks by this name).
RANK_COMM_PREFIX = "byoc-rank-"


_forked = False  # this rank is a fork of its torchrun (set as it becomes a rank: _become_forked_rank)


def is_forked_rank() -> bool:
    """Whether this rank is a worker torchrun forked from its own interpreter, torch imported
    (`--run-path --start-method fork`: decide/launchers/torchrun.py), not a program of its own:
    torch's multiprocessing child, until it becomes the main process it stands for
    (_become_main_process), and after that by what it was."""
    if _forked:
        return True
    mp = sys.modules.get("multiprocessing")
    return mp is not None and mp.parent_process() is not None


def _keep_exit_visible_to_torchrun() -> None:
    """torchrun sees a forked rank's end when the pipe multiprocessing gave it closes (its
    sentinel), not when the process exits: a process the rank forks (a DataLoader worker, its
    own multiprocessing child) would hold the pipe open past the rank's death, and torchrun
    would wait for it (for ever, for a child that outlives the rank). Every fork of the rank
    closes it in the child (os.register_at_fork); a program the rank runs closes it at exec
    (subprocess's close_fds). The pipe: byoc_internals.fork_sentinel_fd."""
    fd = internals.fork_sentinel_fd()
    if fd is not None:
        def close_in_child(fd=fd):
            try:
                os.close(fd)
            except OSError:
                pass

        os.register_at_fork(after_in_child=close_in_child)


# Where torchrun's launcher keeps the exit handlers its imports registered (launch_torchrun.py:
# record_import_exit_handlers), in its module, which a forked rank inherits.
IMPORT_EXIT_HANDLERS = "IMPORT_EXIT_HANDLERS"


def _keep_import_exit_handlers() -> None:
    """The exit handlers a started rank has: those its modules register as they are imported
    (logging's shutdown, which flushes and closes the log's handlers; multiprocessing's; torch's
    own), registered again in their order after torchrun's own handlers are cleared. torchrun
    imported those modules, and its launcher kept their registrations; multiprocessing's is
    registered in any case (the rank's own children end at its exit). Where torchrun's cannot be
    cleared, all it had are kept (byoc_internals.clear_exit_handlers), and none registered again."""
    import atexit

    if not internals.clear_exit_handlers():
        return
    launcher = sys.modules.get("record_errors")  # torchrun's launcher's copy of this module
    handlers = list(getattr(launcher, IMPORT_EXIT_HANDLERS, None) or ())
    exit_function = internals.multiprocessing_exit_function()
    if exit_function is not None and not any(func is exit_function for func, _, _ in handlers):
        handlers.insert(0, (exit_function, (), {}))
    for func, args, kwargs in handlers:
        atexit.register(func, *args, **kwargs)


def _become_main_process() -> None:
    """multiprocessing as a program of its own finds it: the main process (`MainProcess`, no
    parent, an authentication key of its own), its start method not yet chosen, so that a
    program's `set_start_method("spawn")` (torch.multiprocessing's too: the same context) works
    as in a started rank, not `RuntimeError: context has already been set`. The main process:
    byoc_internals.become_main_process; the start method forgotten the public way
    (set_start_method(None, force=True) sets no context, as a new process has)."""
    internals.become_main_process()
    mp = sys.modules.get("multiprocessing")
    if mp is not None and "multiprocessing.context" in sys.modules:
        mp.set_start_method(None, force=True)


def _draw_fresh_seeds() -> None:
    """Seeds of its own, as a started process draws them: a fork copies torchrun's generators,
    so every rank of a host, and every attempt, drew the same numbers. Python's `random` draws
    anew at each fork by itself; numpy's and torch's global generators are drawn here, where
    loaded (a started rank seeds them from the system's entropy as it imports them)."""
    for name in ("numpy.random", "torch"):  # each one's seed(): drawn from the system's entropy
        module = sys.modules.get(name)
        if module is not None:
            try:
                module.seed()
            except Exception:  # noqa: BLE001 - another version: its own state stays
                pass


def _read_stdin_as_started() -> None:
    """Standard input on descriptor 0, as a program of its own has it: multiprocessing's child
    closed it and opened /dev/null on a descriptor of its own."""
    old = sys.stdin
    if old is None or old is sys.__stdin__ and not old.closed:
        return
    try:
        sys.stdin = sys.__stdin__ = open(0, "r", closefd=False, encoding=old.encoding, errors=old.errors)
        old.close()
    except (OSError, ValueError, AttributeError):  # no descriptor 0: leave what multiprocessing made
        pass


def _become_forked_rank() -> None:
    """Undo what a forked rank inherits from its torchrun and a program of its own would not
    have: torch's agent's signal handlers (SIGTERM would raise torch's SignalException inside
    the user's code, and be recorded as the rank's own failure, where a started rank just ends),
    torchrun's wait for its return (handed ahead: _hand_torchrun_the_return), its exit
    handlers (only those its imports registered are kept: _keep_import_exit_handlers), its
    standard input (_read_stdin_as_started), its random seeds, multiprocessing's view of it as a child, and the
    faulthandler torch's error record turned on to stderr (the crash file takes it:
    _record_fatal_signals). Then a session of its own, as torchrun gives each rank it starts: a
    stop to torchrun's group (the entrypoint's SIGTERM) reaches the rank once, through torchrun,
    never twice (a user's checkpoint-on-SIGTERM handler run twice). Then the rank's name
    (RANK_COMM_PREFIX). What still differs, and why: docs/reliability.md (forked ranks). Among
    it, torchrun's descriptors (its store's sockets, its pipes: about 25), left open, each
    close-on-exec, so no program the rank runs has them: their owners, torchrun's Python and C++
    objects, live on in the rank, and one freed later (a cycle's collection) closes its number
    again, by then another file's (tried: a ProcessPoolExecutor's and a DataLoader's workers
    failed reading their queues, EBADF)."""
    import faulthandler

    signals = internals.signal_module()
    global _handed_ahead, _forked
    _forked = True
    _keep_import_exit_handlers()
    try:
        os.setsid()
    except OSError:
        pass  # already a group leader: nothing to leave
    _handed_ahead = _hand_torchrun_the_return()
    _keep_exit_visible_to_torchrun()
    _read_stdin_as_started()
    _become_main_process()
    _draw_fresh_seeds()
    for name in ("SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR2"):
        signals.signal(getattr(signals, name), signals.SIG_DFL)
    signals.signal(signals.SIGINT, signals.default_int_handler)
    if not (os.environ.get("PYTHONFAULTHANDLER") or internals.has_x_option("faulthandler")):
        faulthandler.disable()
    try:
        with open("/proc/self/comm", "w") as f:
            f.write((RANK_COMM_PREFIX + _rank())[:15])
    except OSError:
        pass


def _load_program(argv: list):
    """sys.argv and sys.path[0] as `python script.py` or `python -m module` sets them, and the
    call that runs the program; None for `-m` without a module."""
    if argv[0] == "-m":
        if len(argv) < 2:
            return None
        module, args = argv[1], argv[2:]
        sys.argv = [module, *args]
        sys.path[0] = os.getcwd()  # what `python -m` puts first
        return lambda: runpy.run_module(module, run_name="__main__", alter_sys=True)
    script = os.path.abspath(argv[0])
    sys.argv = [argv[0], *argv[1:]]
    sys.path[0] = os.path.dirname(script)  # what `python script.py` puts first
    return lambda: runpy.run_path(script, run_name="__main__")


def main(argv: list) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        sys.stderr.write(__doc__)
        return 2
    if argv[0] == "--exec":
        return exec_with_host_env(argv[1:])
    if is_forked_rank():
        _become_forked_rank()
    _print_stacks_on_request()  # first: until then a SIGUSR1 would end the rank (it is not asked)
    start_whole_lines()
    _apply_host_env()
    _record_fatal_signals()
    _start_step_figures()
    _log_torchrun_restart(os.environ)
    run = _load_program(argv)
    if run is None:
        sys.stderr.write("record_errors.py: -m needs a module name\n")
        return 2
    global _program_end
    try:
        _program_end = run()
        code = 0
    except SystemExit as exc:
        _program_end = exc  # its traceback holds the program's frames, and so its globals
        _record_failing_exit(exc)
        if "torch.distributed" not in sys.modules:
            raise
        code = decide_exit_code(exc.code)
    except KeyboardInterrupt:
        if is_forked_rank():
            # torch's multiprocessing wrapper would take it as a clean end (exit 0), its return
            # handed ahead: die of SIGINT, as a started rank does (after its exit handlers).
            _stdlib("traceback").print_exc()
            sys.stderr.flush()
            internals.run_exit_handlers()  # where it cannot, none run: the rank dies of SIGINT all the same
            _flush_open_files()
            signals = internals.signal_module()
            signals.signal(signals.SIGINT, signals.SIG_DFL)
            os.kill(os.getpid(), signals.SIGINT)
        raise
    except BaseException as exc:  # noqa: BLE001 - recorded, printed, then the job fails
        _program_end = exc
        _record(exc)
        _stdlib("traceback").print_exc()
        sys.stderr.flush()
        figures = sys.modules.get("byoc_rank_figures")
        if figures is not None:
            figures.write_now()  # an MPI abort ends this process before its exit handlers
        _abort_mpi_job()
        code = 1
    if "torch.distributed" in sys.modules:
        end_without_teardown(code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

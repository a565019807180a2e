"""Every reach of rank/ into torch's or CPython's private names, behind one seam (issue 64): the
one module of entrypoint/ that names a private attribute of torch or CPython, walks their frames,
or replaces their functions (tests/entrypoint/rank/test_internals.py holds the rest of
entrypoint/ to that, by the AST).

Each reach is one function below; its docstring says what it reaches, why the public way is not
enough, what it was checked on, and its fallback. Its check runs at first use, in the process
that uses it: that the internal is what this code expects (the attribute is there and callable,
the frame's function and module are torch's and its local has the expected kind, torch's
function is the one defined where expected, with its parameters). A failed check takes the
fallback: the public way, or nothing where there is none, the user's program unchanged either
way; and the rank's log says so in one line on stderr, once per process, naming the internal
(note_fallback). The user's stdout is never written.

Checked on (CHECKED_ON): torch 2.9.1, 2.13.0 and 2.14.1 under CPython 3.11.7, each in a venv
of its own (scripts/check-torch-versions.sh, its result in docs/development.md). The CPython
reaches are the interpreter's, the same under each torch; CPython 3.12 (the GPU and trn1
images') is not checked here.

Named byoc_internals, not internals: run by path (every rank), it is imported by its bare name
beside record_errors, and a user's own module named `internals` must stay the user's.
Standard library only, and nothing imported at load but _thread: this runs in every rank."""

import _thread
import sys

CHECKED_ON = "torch 2.9.1, 2.13.0, 2.14.1 (CPython 3.11)"
LOG_PREFIX = "[entrypoint] "

_noted = set()  # the internals this process's log named already (note_fallback)
_verdicts = {}  # internal -> its check's verdict, made at first use (check_once)


def note_fallback(internal: str, why: str, fallback: str) -> None:
    """One line on stderr, the first time this process falls back from internal: the rank's log
    (its stderr travels with its output to the entrypoint, as record_errors.py's own lines do)."""
    if internal in _noted:
        return
    _noted.add(internal)
    try:
        sys.stderr.write(f"{LOG_PREFIX}{internal} is not what this image checked on {CHECKED_ON}: {why}; "
                         f"{fallback}\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):  # no stderr left: the fallback holds all the same
        pass


def check_once(internal: str, check) -> bool:
    """check()'s verdict on internal, made at its first use and kept (an exception is a no)."""
    verdict = _verdicts.get(internal)
    if verdict is None:
        try:
            verdict = bool(check())
        except Exception:  # noqa: BLE001 - an internal that cannot even be looked at is not there
            verdict = False
        _verdicts[internal] = verdict
    return verdict


def _callable_attribute(owner, name: str) -> bool:
    return owner is not None and callable(getattr(owner, name, None))


# --- threads without the threading module ----------------------------------------------------


def start_thread(fn) -> bool:
    """fn() in a new thread by `_thread.start_new_thread`: the rank's line-flushing thread
    (record_errors.start_whole_lines) and torchrun's child watcher (launch_torchrun.main).
    Why not threading.Thread: importing threading costs every rank's start (tests/entrypoint/
    test_startup_imports.py keeps it out of a rank), and such a thread is no thread of the
    program's (threading.enumerate never lists it, nothing joins it at exit).
    Checked on: torch 2.9.1, 2.13.0, 2.14.1 (CPython 3.11).
    Check: _thread.start_new_thread is callable.
    Fallback: False, nothing started; the caller starts a daemon threading.Thread (public)."""
    internal = "_thread.start_new_thread"
    if not check_once(internal, lambda: _callable_attribute(_thread, "start_new_thread")):
        note_fallback(internal, "not callable", "a daemon threading.Thread instead")
        return False
    _thread.start_new_thread(fn, ())
    return True


def thread_local():
    """A thread-local object, `_thread._local()`: what threading.local is, without importing
    threading (step_figures.start, in every rank that writes step figures).
    Checked on: torch 2.9.1, 2.13.0, 2.14.1 (CPython 3.11).
    Check: _thread._local is a type.
    Fallback: threading.local() (public; a rank under torch has threading loaded already)."""
    internal = "_thread._local"
    if check_once(internal, lambda: isinstance(getattr(_thread, "_local", None), type)):
        return _thread._local()
    note_fallback(internal, "not a type", "threading.local instead")
    import threading

    return threading.local()


# --- the interpreter's own settings and modules ------------------------------------------------


def has_x_option(name: str) -> bool:
    """Whether Python was started with `-X name` (`-X faulthandler`), from `sys._xoptions`.
    Why: no public attribute says so (sys.flags has no faulthandler); record_errors.py leaves a
    program started with it its own faulthandler.
    Checked on: torch 2.9.1, 2.13.0, 2.14.1 (CPython 3.11).
    Check: sys._xoptions is a dict.
    Fallback: the interpreter's own command line, sys.orig_argv (public since 3.10): `-X name`,
    `-Xname`, `-X name=value`."""
    internal = "sys._xoptions"
    if check_once(internal, lambda: isinstance(getattr(sys, "_xoptions", None), dict)):
        return name in sys._xoptions
    note_fallback(internal, "not a dict", "read from sys.orig_argv instead")
    argv = list(getattr(sys, "orig_argv", ()))
    given = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-X"]
    given += [a[2:] for a in argv if a.startswith("-X") and a != "-X"]
    return any(option.split("=", 1)[0] == name for option in given)


SIGNAL_NAMES = ("signal", "getsignal", "SIG_DFL", "SIG_IGN", "default_int_handler", "SIGINT", "SIGTERM", "SIGHUP",
                "SIGQUIT", "SIGUSR1", "SIGUSR2")


def signal_module():
    """The C module `_signal`, with signal's functions and numbers: `signal` itself imports enum,
    about 2 ms of every rank's start (record_errors.py sets a rank's handlers with it).
    Checked on: torch 2.9.1, 2.13.0, 2.14.1 (CPython 3.11).
    Check: _signal has every name of SIGNAL_NAMES.
    Fallback: the public module signal (same functions; its numbers are IntEnums)."""
    internal = "_signal"

    def check() -> bool:
        import _signal

        return all(hasattr(_signal, name) for name in SIGNAL_NAMES)

    if check_once(internal, check):
        import _signal

        return _signal
    note_fallback(internal, "a module without signal's names", "the signal module instead")
    import signal

    return signal


def io_base_type() -> type:
    """`_io._IOBase`, the C base class of every Python file object: record_errors.
    _flush_open_files flushes each one the interpreter would have, with issubclass on every
    object the collector tracks; io.IOBase is an ABC whose check would ask every other class
    about its subclasses.
    Checked on: torch 2.9.1, 2.13.0, 2.14.1 (CPython 3.11).
    Check: _io._IOBase is a type and io.IOBase's base.
    Fallback: io.IOBase (public; the same answer, more slowly)."""
    internal = "_io._IOBase"

    def check() -> bool:
        import _io
        import io

        base = getattr(_io, "_IOBase", None)
        return isinstance(base, type) and issubclass(io.IOBase, base)

    import io

    if check_once(internal, check):
        import _io

        return _io._IOBase
    note_fallback(internal, "not io.IOBase's base", "io.IOBase instead")
    return io.IOBase


# --- the interpreter's ending, without its teardown --------------------------------------------


def join_non_daemon_threads() -> None:
    """What Py_Finalize does first, `threading._shutdown()`: join the program's non-daemon
    threads (record_errors.end_without_teardown ends the process after, without the teardown).
    No public function does exactly this (it also marks the main thread done).
    Checked on: torch 2.9.1, 2.13.0, 2.14.1 (CPython 3.11).
    Check: threading._shutdown is callable.
    Fallback: each non-daemon thread but this one joined, from threading.enumerate (public)."""
    threading = sys.modules.get("threading")
    if threading is None:
        return  # no thread was started through it: none to join
    internal = "threading._shutdown"
    if check_once(internal, lambda: _callable_attribute(threading, "_shutdown")):
        threading._shutdown()
        return
    note_fallback(internal, "not callable", "each non-daemon thread joined from threading.enumerate instead")
    current = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not current and not thread.daemon:
            thread.join()


def run_exit_handlers() -> bool:
    """The atexit handlers, now, as the interpreter runs them at its end: `atexit._run_exitfuncs()`
    (record_errors.end_without_teardown; a forked rank's KeyboardInterrupt, which then dies of
    SIGINT: no ending of the interpreter's would run them). No public function runs them.
    Checked on: torch 2.9.1, 2.13.0, 2.14.1 (CPython 3.11).
    Check: atexit._run_exitfuncs is callable.
    Fallback: False, none run: the caller lets the interpreter end the process its own way."""
    import atexit

    internal = "atexit._run_exitfuncs"
    if check_once(internal, lambda: _callable_attribute(atexit, "_run_exitfuncs")):
        atexit._run_exitfuncs()
        return True
    note_fallback(internal, "not callable", "the interpreter's own ending (with its teardown) instead")
    return False


# --- a rank torchrun forked: what it inherits, undone -----------------------------------------


TORCH_WRAP = ("torch.distributed.elastic.multiprocessing.api", "_wrap", "ret_val_")
FORK_LAUNCH = ("multiprocessing.popen_fork", "_launch", "child_w")


def find_caller_local(where: tuple, has_kind, frame=None):
    """The local where[2] of the nearest frame up the stack running function where[1] of module
    where[0], when has_kind(its value); None when no such frame holds one. From frame, or the
    caller's (`sys._getframe`)."""
    if frame is None:
        getframe = getattr(sys, "_getframe", None)
        frame = getframe(2) if callable(getframe) else None
    module, function, local = where
    while frame is not None:
        if frame.f_code.co_name == function and frame.f_globals.get("__name__") == module:
            value = frame.f_locals.get(local)
            return value if value is not None and has_kind(value) else None
        frame = frame.f_back
    return None


def hand_torchrun_the_return(frame=None) -> bool:
    """A forked rank, as it starts: put None on the queue that torch's worker wrapper
    (torch.distributed.elastic.multiprocessing.api._wrap, below the rank on its stack) holds in
    its local `ret_val_`, the return it would put at its end (record_errors.
    _hand_torchrun_the_return says why). torch gives no public handle on that queue.
    Checked on: torch 2.9.1, 2.13.0, 2.14.1 (CPython 3.11).
    Check: a frame of `_wrap` in that module, its `ret_val_` with a
    callable put (a SimpleQueue).
    Fallback: False, nothing put: the wrapper's own way (the rank's return, at its end).
    frame: where to look from (the tests' stand-in); default the caller's."""
    internal = "torch.distributed.elastic.multiprocessing.api._wrap's local ret_val_"
    queue = find_caller_local(TORCH_WRAP, lambda q: callable(getattr(q, "put", None)), frame)
    if queue is None:
        note_fallback(internal, "no such frame and local on the rank's stack",
                      "the rank's return handed over by torch's wrapper at its end instead")
        return False
    try:
        queue.put(None)
    except Exception:  # noqa: BLE001 - then the wrapper's own way
        return False
    return True


def fork_sentinel_fd(frame=None):
    """The descriptor of the pipe a forked rank holds for torchrun to see its end: the local
    `child_w` of multiprocessing.popen_fork.Popen._launch, below the rank on its stack
    (record_errors._keep_exit_visible_to_torchrun closes it in the rank's own forks).
    multiprocessing gives the child no public handle on it.
    Checked on: torch 2.9.1, 2.13.0, 2.14.1 (CPython 3.11).
    Check: a frame of `_launch` in that module, its `child_w` an int.
    Fallback: None: nothing is closed in the rank's forks (torchrun then waits for a rank's
    child that outlives it, as before this was done).
    frame: where to look from (the tests' stand-in); default the caller's."""
    fd = find_caller_local(FORK_LAUNCH, lambda v: isinstance(v, int) and not isinstance(v, bool), frame)
    if fd is None:
        note_fallback("multiprocessing.popen_fork.Popen._launch's local child_w",
                      "no such frame and local on the stack", "the pipe stays open in the rank's own forks")
    return fd


def clear_exit_handlers() -> bool:
    """Forget every atexit handler the rank inherited from its torchrun: `atexit._clear()`
    (record_errors._keep_import_exit_handlers registers again those a started rank has).
    atexit.unregister needs each function, and nothing public lists them.
    Checked on: torch 2.9.1, 2.13.0, 2.14.1 (CPython 3.11).
    Check: atexit._clear is callable.
    Fallback: False, nothing cleared: the rank keeps all it inherited (its imports' among them),
    and the caller registers none again."""
    import atexit

    internal = "atexit._clear"
    if check_once(internal, lambda: _callable_attribute(atexit, "_clear")):
        atexit._clear()
        return True
    note_fallback(internal, "not callable", "the exit handlers inherited from torchrun are kept")
    return False


def multiprocessing_exit_function():
    """`multiprocessing.util._exit_function`, the exit handler multiprocessing registers at import
    (it ends the process's daemonic children, joins the others): a started rank has it, so the
    forked rank registers it again after clear_exit_handlers. None when multiprocessing.util is
    not loaded. Nothing public names it.
    Checked on: torch 2.9.1, 2.13.0, 2.14.1 (CPython 3.11).
    Check: callable.
    Fallback: None: not registered again (a rank's own children then end by their own exit)."""
    util = sys.modules.get("multiprocessing.util")
    if util is None:
        return None
    internal = "multiprocessing.util._exit_function"
    if check_once(internal, lambda: _callable_attribute(util, "_exit_function")):
        return util._exit_function
    note_fallback(internal, "not callable", "not registered again at the rank's exit")
    return None


def become_main_process() -> bool:
    """multiprocessing's view of a forked rank as its main process: `multiprocessing.process.
    _current_process` a new `_MainProcess` (no parent, an authentication key of its own) and
    `_parent_process` None, as in a program of its own (record_errors._become_main_process).
    No public function makes a process its own main process.
    Checked on: torch 2.9.1, 2.13.0, 2.14.1 (CPython 3.11).
    Check: the class _MainProcess (a BaseProcess subclass: the module
    deletes its own name for it), and both module attributes exist.
    Fallback: False, nothing changed: multiprocessing still sees the rank as torchrun's child
    (parent_process() is torchrun's)."""
    process = sys.modules.get("multiprocessing.process")
    if process is None:
        return False
    internal = "multiprocessing.process._current_process"

    def main_type():
        base = getattr(process, "BaseProcess", None)
        found = [t for t in base.__subclasses__() if t.__name__ == "_MainProcess"] if isinstance(base, type) else []
        return found[0] if found else None

    if not check_once(internal, lambda: main_type() is not None and hasattr(process, "_current_process")
                      and hasattr(process, "_parent_process")):
        note_fallback(internal, "no _MainProcess or no _current_process/_parent_process",
                      "multiprocessing still sees the rank as torchrun's child")
        return False
    process._current_process = main_type()()
    process._parent_process = None
    return True


# --- torchrun's own process -------------------------------------------------------------------


def record_exit_handlers(load, handlers: list) -> None:
    """load(), noting in handlers each exit handler registered meanwhile, [(func, args, kwargs)]
    in their order, less what atexit.unregister took back: atexit.register and atexit.unregister
    replaced by noting ones for its duration, then put back, however load() ends
    (launch_torchrun.record_import_exit_handlers says why). Nothing public lists atexit's handlers.
    Checked on: torch 2.9.1, 2.13.0, 2.14.1 (CPython 3.11).
    Check: atexit.register and atexit.unregister are callable.
    Fallback: load() alone, none noted (a forked rank then registers multiprocessing's only)."""
    import atexit

    internal = "atexit.register and atexit.unregister (replaced for a while)"
    if not check_once(internal, lambda: _callable_attribute(atexit, "register") and
                      _callable_attribute(atexit, "unregister")):
        note_fallback(internal, "not callable", "the imports' exit handlers are not noted")
        load()
        return
    register, unregister = atexit.register, atexit.unregister

    def noting_register(func, *args, **kwargs):
        handlers.append((func, args, kwargs))
        return register(func, *args, **kwargs)

    def noting_unregister(func):
        handlers[:] = [h for h in handlers if h[0] != func]
        return unregister(func)

    atexit.register, atexit.unregister = noting_register, noting_unregister
    try:
        load()
    finally:
        atexit.register, atexit.unregister = register, unregister


def import_dynamo() -> bool:
    """Import `torch._dynamo` (launch_torchrun.preload_for_forked_ranks: made once before the
    ranks fork, where each rank and torch's agent would import it later). It has no public name
    to import it by (torch.compile imports it at its first call).
    Checked on: torch 2.9.1, 2.13.0, 2.14.1 (CPython 3.11).
    Check: the import succeeds.
    Fallback: False, not imported ahead (each rank imports it where it needs it)."""
    import importlib

    internal = "torch._dynamo"
    try:
        importlib.import_module(internal)
    except Exception as error:  # noqa: BLE001 - a torch without it (or broken): torch says so where it needs it
        note_fallback(internal, f"its import failed ({type(error).__name__})", "not imported before the ranks fork")
        return False
    return True


# --- the step figures: torch's functions timed where torch defines them ------------------------


def _defined_here(fn, module) -> bool:
    """fn is a plain Python function defined in module (its decorators' functools.wraps keep
    that): wrapping it there reaches every caller that looks it up there."""
    import types

    return isinstance(fn, types.FunctionType) and fn.__module__ == module.__name__


def _first_parameters(fn) -> tuple:
    import inspect

    return tuple(inspect.signature(fn).parameters)


def wrap_collectives(module, names, wrap) -> list:
    """Each of torch.distributed's collectives in names replaced by wrap(it) where it is defined
    (module: torch.distributed.distributed_c10d), and where torch.distributed re-exports it,
    when that is the same function (step_figures.patch_collectives times them as the step's wait).
    torch has no public hook around a collective's call. A function wrapped already (wrap's
    mark __byoc_timed__) is left. Returns the names wrapped.
    Checked on: torch 2.9.1, 2.13.0, 2.14.1 (CPython 3.11).
    Check, for each: a Python function of that module.
    Fallback, for each that is not: left as it is (not counted as wait)."""
    package = sys.modules.get("torch.distributed")
    wrapped = []
    for name in names:
        fn = getattr(module, name, None)
        if getattr(fn, "__byoc_timed__", False):
            continue
        internal = f"{module.__name__}.{name}"
        if not check_once(internal, lambda: _defined_here(fn, module)):
            note_fallback(internal, "not a function defined there", "its time is not counted as wait")
            continue
        replacement = wrap(fn)
        setattr(module, name, replacement)
        if package is not None and getattr(package, name, None) is fn:
            setattr(package, name, replacement)
        wrapped.append(name)
    return wrapped


def wrap_autograd_backward(module, wrap) -> bool:
    """torch.autograd.backward replaced by wrap(it) (step_figures.patch_autograd: a rank's
    backward time, where DDP's all-reduce waits). Tensor.backward calls it by the module's
    attribute, so every backward() passes through. torch has no public hook around a whole
    backward call.
    Checked on: torch 2.9.1, 2.13.0, 2.14.1 (CPython 3.11).
    Check: a Python function of torch.autograd, first parameter `tensors`.
    Fallback: False, left as it is (no backward time in the figures)."""
    fn = getattr(module, "backward", None)
    if getattr(fn, "__byoc_timed__", False):
        return False
    internal = "torch.autograd.backward"
    if not check_once(internal, lambda: _defined_here(fn, module) and _first_parameters(fn)[:1] == ("tensors",)):
        note_fallback(internal, "not the function torch.autograd defines with `tensors` first",
                      "backward time is not measured")
        return False
    module.backward = wrap(fn)
    return True


def wrap_ddp_forward(module, on_forward) -> bool:
    """DistributedDataParallel.forward replaced by one that calls on_forward() first
    (step_figures.patch_ddp: the rank runs DDP, so its backward time holds the gradients'
    all-reduce). A forward hook would be the public way per model, but the rank never sees the
    model; a global module hook would put every module's call of the script on torch's slow path.
    Checked on: torch 2.9.1, 2.13.0, 2.14.1 (CPython 3.11).
    Check: DistributedDataParallel defines forward itself, a Python
    function taking (self, *inputs, **kwargs).
    Fallback: False, left as it is (the rank is not known to run DDP)."""
    ddp = getattr(module, "DistributedDataParallel", None)
    if ddp is None:
        return False
    internal = f"{module.__name__}.DistributedDataParallel.forward"

    def check() -> bool:
        import inspect

        forward = ddp.__dict__.get("forward")
        kinds = [p.kind for p in inspect.signature(forward).parameters.values()] if inspect.isfunction(forward) else []
        return kinds[:1] == [inspect.Parameter.POSITIONAL_OR_KEYWORD] and inspect.Parameter.VAR_POSITIONAL in kinds

    if not check_once(internal, check):
        note_fallback(internal, "not a function of the class taking (self, *inputs, ...)",
                      "DDP's use is not noted in the figures")
        return False
    forward = ddp.forward

    def ddp_forward(self, *args, **kwargs):
        on_forward()
        return forward(self, *args, **kwargs)

    ddp.forward = ddp_forward
    return True


def run_after_exec(spec, then) -> bool:
    """An import hook's step: spec's loader, once it has executed the module, calls then(module);
    the loader object itself stays the module's (module.__loader__, its resources), only its
    exec_module is replaced, on this one loader (step_figures._AfterImport). A wrapping loader
    would be the public way, but the module would then carry it as its __loader__.
    Checked on: torch 2.9.1, 2.13.0, 2.14.1 (CPython 3.11).
    Check: spec.loader has a callable exec_module that can be set.
    Fallback: False, nothing changed: the module imports as it would, and then() is not called
    (the caller lets the normal finders import it)."""
    loader = getattr(spec, "loader", None)
    internal = f"{type(loader).__module__}.{type(loader).__qualname__}.exec_module (replaced on one loader)"
    if not check_once(internal, lambda: _callable_attribute(loader, "exec_module") and hasattr(loader, "__dict__")):
        note_fallback(internal, "no callable exec_module to replace", f"{getattr(spec, 'name', '?')} is not timed")
        return False
    exec_module = loader.exec_module

    def exec_then(module):
        exec_module(module)
        then(module)

    loader.exec_module = exec_then
    return True

"""torch's and CPython's internals behind one seam (entrypoint/rank/byoc_internals.py, issue 64):
for each reach, its check passes against the installed torch and interpreter (the internal is
what the seam expects, and does what the rank needs of it), and where the check fails (the
internal taken away, or a stand-in frame or module) the fallback is taken and the rank's log
names the internal in one line, once, however often it is used. Then the rule that keeps it one
seam: no other module of entrypoint/ reaches into those private names, read from the AST.

scripts/check-torch-versions.sh runs these (with the rest of tests/entrypoint/rank/) under each
torch the seam was checked on."""

import ast
import importlib
import importlib.machinery
import importlib.util
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PACKAGE = REPO / "entrypoint"
RANK = PACKAGE / "rank"
SEAM = "rank/byoc_internals.py"

quick = pytest.mark.quick  # the quick tier (scripts/run-tests.sh --quick): no torch, no host


def load_fresh(name: str = "byoc_internals_under_test"):
    """A copy of the seam of its own: nothing checked, nothing logged yet."""
    spec = importlib.util.spec_from_file_location(name, RANK / "byoc_internals.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def internals():
    return load_fresh()


def assert_named_once(capsys, internal: str) -> str:
    """The log so far is one line, the seam's, naming internal."""
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"[entrypoint] {internal} is not what this image checked on torch "), err
    return lines[0]


def assert_silent(capsys) -> None:
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == "", captured


def read_log(capsys) -> str:
    """The log so far, which a test against the installed torch shows when it fails: a check
    that did not pass names its internal there (scripts/check-torch-versions.sh prints it)."""
    return capsys.readouterr().err


def run_python(code: str, *python_args: str) -> str:
    """code in a Python of its own with the seam imported as a rank imports it (by its bare
    name, its folder first on sys.path); its stdout. It must exit 0 and log nothing."""
    prelude = f"import sys\nsys.path.insert(0, {str(RANK)!r})\nimport byoc_internals as internals\n"
    done = subprocess.run([sys.executable, *python_args, "-c", prelude + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=120, cwd=str(REPO))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "[entrypoint]" not in done.stderr, done.stderr
    return done.stdout


# --- threads without the threading module ----------------------------------------------------


@quick
def test_a_thread_starts_without_importing_threading():
    out = run_python("""
        import _thread
        ran = _thread.allocate_lock()
        ran.acquire()
        print(internals.start_thread(ran.release), ran.acquire(timeout=10), "threading" in sys.modules)
        """)
    assert out.split() == ["True", "True", "False"]


@quick
def test_without_start_new_thread_nothing_starts_and_the_log_names_it_once(internals, capsys, monkeypatch):
    monkeypatch.setattr(internals, "_thread", types.SimpleNamespace(allocate_lock=lambda: None))
    ran = []
    assert internals.start_thread(lambda: ran.append(1)) is False
    assert internals.start_thread(lambda: ran.append(2)) is False
    assert ran == []  # the caller starts a threading.Thread instead (record_errors, launch_torchrun)
    assert_named_once(capsys, "_thread.start_new_thread")


@quick
def test_a_thread_local_is_threading_locals_c_type(internals, capsys):
    import _thread
    import threading

    local = internals.thread_local()
    assert type(local) is _thread._local and threading.local is _thread._local
    assert_silent(capsys)


@quick
def test_without_the_c_thread_local_threading_local_is_used(internals, capsys, monkeypatch):
    import threading

    monkeypatch.setattr(internals, "_thread", types.SimpleNamespace())
    first, second = internals.thread_local(), internals.thread_local()
    assert isinstance(first, threading.local) and first is not second
    assert_named_once(capsys, "_thread._local")


# --- the interpreter's own settings and modules ------------------------------------------------


@quick
def test_an_x_option_is_read_from_sys():
    assert run_python("print(internals.has_x_option('faulthandler'))", "-X", "faulthandler").split() == ["True"]
    assert run_python("print(internals.has_x_option('faulthandler'))").split() == ["False"]


@quick
def test_without_sys_xoptions_the_command_line_is_read(internals, capsys, monkeypatch):
    fake = types.SimpleNamespace(orig_argv=["python3", "-X", "faulthandler", "-Xdev", "record_errors.py"],
                                 stderr=sys.stderr, modules=sys.modules)
    monkeypatch.setattr(internals, "sys", fake)
    assert internals.has_x_option("faulthandler") is True
    assert internals.has_x_option("dev") is True
    assert internals.has_x_option("importtime") is False
    assert_named_once(capsys, "sys._xoptions")


@quick
def test_the_signal_module_is_the_c_module_with_every_name_a_rank_uses(internals, capsys):
    import _signal
    import signal

    assert internals.signal_module() is _signal
    assert all(getattr(_signal, name) == getattr(signal, name) for name in internals.SIGNAL_NAMES if name.startswith("SIG"))
    assert_silent(capsys)


@quick
def test_without_the_c_signal_module_signal_is_used(internals, capsys, monkeypatch):
    import signal

    monkeypatch.setitem(sys.modules, "_signal", types.SimpleNamespace(signal=signal.signal))
    assert internals.signal_module() is signal
    assert internals.signal_module() is signal
    assert_named_once(capsys, "_signal")


@quick
def test_every_file_object_is_an_instance_of_the_io_base(internals, capsys, tmp_path):
    import _io
    import io

    base = internals.io_base_type()
    assert base is _io._IOBase
    with open(tmp_path / "t", "w") as text, open(tmp_path / "b", "wb") as binary:
        assert all(issubclass(type(f), base) for f in (text, binary, io.BytesIO(), io.StringIO(), sys.stderr))
    assert not issubclass(dict, base)
    assert_silent(capsys)


@quick
def test_without_the_c_io_base_io_iobase_is_used(internals, capsys, monkeypatch):
    import io

    monkeypatch.setitem(sys.modules, "_io", types.SimpleNamespace())
    assert internals.io_base_type() is io.IOBase
    assert internals.io_base_type() is io.IOBase
    assert_named_once(capsys, "_io._IOBase")


# --- the interpreter's ending, without its teardown --------------------------------------------


@quick
def test_non_daemon_threads_are_joined_and_exit_handlers_run_once():
    out = run_python("""
        import atexit, os, threading, time
        done = []
        threading.Thread(target=lambda: (time.sleep(0.3), done.append("thread"))).start()
        atexit.register(lambda: print("handler ran", flush=True))
        internals.join_non_daemon_threads()
        print(done, flush=True)
        print(internals.run_exit_handlers(), flush=True)
        """)
    assert out.splitlines() == ["['thread']", "handler ran", "True"]  # not run again at the end


class FakeThread:
    def __init__(self, daemon):
        self.daemon, self.joined = daemon, False

    def join(self):
        self.joined = True


@quick
def test_without_threading_shutdown_each_non_daemon_thread_is_joined(internals, capsys, monkeypatch):
    current, worker, daemon = FakeThread(False), FakeThread(False), FakeThread(True)
    fake = types.SimpleNamespace(current_thread=lambda: current, enumerate=lambda: [current, worker, daemon])
    monkeypatch.setitem(sys.modules, "threading", fake)
    internals.join_non_daemon_threads()
    internals.join_non_daemon_threads()
    assert (current.joined, worker.joined, daemon.joined) == (False, True, False)
    assert_named_once(capsys, "threading._shutdown")


@quick
def test_without_run_exitfuncs_none_run_and_the_interpreter_ends_the_rank(internals, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "atexit", types.SimpleNamespace(register=lambda f: f))
    assert internals.run_exit_handlers() is False
    assert internals.run_exit_handlers() is False
    assert_named_once(capsys, "atexit._run_exitfuncs")


@quick
def test_a_rank_ends_by_systemexit_where_the_exit_handlers_cannot_be_run(monkeypatch):
    """record_errors.end_without_teardown's fallback: the interpreter's own ending, same code."""
    from entrypoint.rank import record_errors

    seam = types.SimpleNamespace(join_non_daemon_threads=lambda: None, run_exit_handlers=lambda: False)
    monkeypatch.setattr(record_errors, "internals", seam)
    with pytest.raises(SystemExit) as ended:
        record_errors.end_without_teardown(3)
    assert ended.value.code == 3


# --- a rank torchrun forked: what it inherits, undone -----------------------------------------


def call_in_frame(module: str, function: str, local: str, value, probe):
    """probe() called from a frame of function(), of a module named module, whose local holds
    value: a stand-in for torch's or multiprocessing's frame below a rank."""
    namespace = {"__name__": module, "probe": probe}
    exec(f"def {function}({local}):\n    return probe()\n", namespace)
    return namespace[function](value)


class Queue:
    def __init__(self):
        self.items = []

    def put(self, item):
        self.items.append(item)


@quick
def test_the_return_is_put_on_the_queue_of_the_frame_below(internals, capsys):
    queue = Queue()
    handed = call_in_frame(*internals.TORCH_WRAP, queue, internals.hand_torchrun_the_return)
    assert handed is True and queue.items == [None]
    assert_silent(capsys)


@quick
def test_without_torchs_wrapper_below_nothing_is_handed_and_the_log_names_it_once(internals, capsys):
    assert internals.hand_torchrun_the_return() is False  # no _wrap on this stack
    not_a_queue = call_in_frame(*internals.TORCH_WRAP, 5, internals.hand_torchrun_the_return)
    elsewhere = call_in_frame("torch.other", "_wrap", "ret_val_", Queue(), internals.hand_torchrun_the_return)
    assert not_a_queue is False and elsewhere is False
    assert_named_once(capsys, "torch.distributed.elastic.multiprocessing.api._wrap's local ret_val_")


@pytest.mark.filterwarnings("ignore:Unable to enable fault handler")  # capsys's stderr has no descriptor
def test_the_return_is_handed_through_torchs_own_worker_wrapper(internals, capsys):
    """The installed torch's _wrap, called as its worker process calls it: the rank (here, fn)
    finds its queue on the stack, before its own return is put there at the end."""
    import faulthandler
    import inspect

    from torch.distributed.elastic.multiprocessing import api

    queue, handed = Queue(), []
    known = {"local_rank": 0, "fn": lambda: handed.append(internals.hand_torchrun_the_return()) or "returned",
             "args": {0: ()}, "envs": {0: {}}, "stdout_redirects": {0: ""}, "stderr_redirects": {0: ""},
             "ret_vals": {0: queue}, "queue_finished_reading_event": types.SimpleNamespace(wait=lambda: None),
             "numa_options": None}
    parameters = inspect.signature(api._wrap).parameters
    unknown = [n for n, p in parameters.items() if n not in known and p.default is inspect.Parameter.empty]
    assert not unknown, f"torch's _wrap takes new parameters: {unknown}"
    was_enabled = faulthandler.is_enabled()
    try:
        api._wrap(**{n: v for n, v in known.items() if n in parameters})
    finally:
        if not was_enabled:
            faulthandler.disable()  # torch's error record turns it on
    log = read_log(capsys)
    assert handed == [True] and queue.items == [None, "returned"] and "[entrypoint]" not in log, log


@quick
def test_a_forked_child_finds_the_pipe_multiprocessing_gave_it():
    out = run_python("""
        import multiprocessing, os, stat
        def child():
            fd = internals.fork_sentinel_fd()
            os._exit(0 if isinstance(fd, int) and stat.S_ISFIFO(os.fstat(fd).st_mode) else 3)
        process = multiprocessing.get_context("fork").Process(target=child)
        process.start()
        process.join()
        print(process.exitcode)
        """)
    assert out.split() == ["0"]


@quick
def test_without_multiprocessings_launch_below_no_pipe_is_found_and_the_log_names_it_once(internals, capsys):
    assert internals.fork_sentinel_fd() is None
    assert call_in_frame(*internals.FORK_LAUNCH, "not a descriptor", internals.fork_sentinel_fd) is None
    assert call_in_frame(*internals.FORK_LAUNCH, 7, internals.fork_sentinel_fd) == 7
    assert_named_once(capsys, "multiprocessing.popen_fork.Popen._launch's local child_w")


@quick
def test_inherited_exit_handlers_are_cleared():
    out = run_python("""
        import atexit
        atexit.register(print, "inherited handler ran")
        print(internals.clear_exit_handlers(), atexit._ncallbacks())
        """)
    assert out.split() == ["True", "0"]


@quick
def test_without_atexit_clear_the_inherited_handlers_are_kept(internals, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "atexit", types.SimpleNamespace(register=lambda f: f))
    assert internals.clear_exit_handlers() is False
    assert internals.clear_exit_handlers() is False
    assert_named_once(capsys, "atexit._clear")


@quick
def test_multiprocessings_exit_handler_is_found(internals, capsys):
    import multiprocessing.util

    assert internals.multiprocessing_exit_function() is multiprocessing.util._exit_function
    assert_silent(capsys)


@quick
def test_without_multiprocessings_exit_handler_none_is_registered_again(internals, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "multiprocessing.util", types.SimpleNamespace())
    assert internals.multiprocessing_exit_function() is None
    assert internals.multiprocessing_exit_function() is None
    assert_named_once(capsys, "multiprocessing.util._exit_function")


@quick
def test_a_forked_child_becomes_its_own_main_process():
    out = run_python("""
        import multiprocessing, os
        def child():
            before = multiprocessing.parent_process() is not None
            became = internals.become_main_process()
            key = multiprocessing.current_process().authkey
            ok = before and became and multiprocessing.parent_process() is None
            ok = ok and multiprocessing.current_process().name == "MainProcess" and key != parent_key
            os._exit(0 if ok else 3)
        parent_key = multiprocessing.current_process().authkey
        process = multiprocessing.get_context("fork").Process(target=child)
        process.start()
        process.join()
        print(process.exitcode)
        """)
    assert out.split() == ["0"]


@quick
def test_without_multiprocessings_main_process_class_nothing_changes(internals, capsys, monkeypatch):
    fake = types.SimpleNamespace(BaseProcess=type("BaseProcess", (), {}), _current_process="torchrun's child")
    monkeypatch.setitem(sys.modules, "multiprocessing.process", fake)
    assert internals.become_main_process() is False
    assert internals.become_main_process() is False
    assert fake._current_process == "torchrun's child"
    assert_named_once(capsys, "multiprocessing.process._current_process")


# --- torchrun's own process -------------------------------------------------------------------


@quick
def test_the_exit_handlers_an_import_registers_are_noted(internals, capsys):
    import atexit

    register, unregister = atexit.register, atexit.unregister

    def kept(*args):
        pass

    def taken_back():
        pass

    def load():
        atexit.register(kept, 1, key=2)
        atexit.register(taken_back)
        atexit.unregister(taken_back)

    handlers = []
    try:
        internals.record_exit_handlers(load, handlers)
    finally:
        atexit.unregister(kept)
    assert handlers == [(kept, (1,), {"key": 2})]
    assert (atexit.register, atexit.unregister) == (register, unregister)
    assert_silent(capsys)


@quick
def test_without_atexit_unregister_the_import_runs_and_nothing_is_noted(internals, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "atexit", types.SimpleNamespace(register=lambda f: f))
    loads, handlers = [], []
    internals.record_exit_handlers(lambda: loads.append(1), handlers)
    internals.record_exit_handlers(lambda: loads.append(2), handlers)
    assert loads == [1, 2] and handlers == []
    assert_named_once(capsys, "atexit.register and atexit.unregister (replaced for a while)")


def test_torch_dynamo_is_imported_ahead(internals, capsys):
    imported = internals.import_dynamo()
    log = read_log(capsys)
    assert imported is True and "torch._dynamo" in sys.modules and "[entrypoint]" not in log, log


@quick
def test_without_torch_dynamo_nothing_is_imported_ahead(internals, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch._dynamo", None)  # an import of it fails at once
    assert internals.import_dynamo() is False
    assert internals.import_dynamo() is False
    assert_named_once(capsys, "torch._dynamo")


# --- the step figures: torch's functions timed where torch defines them ------------------------


def timing(calls: list):
    def wrap(fn):
        def wrapper(*args, **kwargs):
            calls.append(fn.__name__)
            return fn(*args, **kwargs)

        wrapper.__byoc_timed__ = True
        return wrapper

    return wrap


def collectives_names():
    spec = importlib.util.spec_from_file_location("byoc_step_figures_names", RANK / "step_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.COLLECTIVES


def test_torchs_collectives_are_wrapped_where_torch_defines_them(internals, capsys, monkeypatch):
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    names = collectives_names()
    for name in names:  # put back after the test: other tests of this process see torch as it was
        monkeypatch.setattr(c10d, name, getattr(c10d, name))
        monkeypatch.setattr(dist, name, getattr(dist, name))
    originals = {name: getattr(c10d, name) for name in names}
    wrapped = internals.wrap_collectives(c10d, names, timing([]))
    log = read_log(capsys)
    assert wrapped == list(names) and "[entrypoint]" not in log, log
    for name in names:
        assert getattr(c10d, name) is not originals[name] and getattr(dist, name) is getattr(c10d, name)
    assert internals.wrap_collectives(c10d, names, timing([])) == []  # wrapped once


@quick
def test_a_collective_not_defined_where_expected_is_left_and_the_log_names_it_once(internals, capsys):
    module = types.ModuleType("torch.distributed.distributed_c10d")
    exec("def all_reduce(tensor, op=None, group=None, async_op=False):\n    return 'reduced'\n", module.__dict__)
    module.barrier = len  # not a Python function of the module: a re-export, a C function
    calls = []
    assert internals.wrap_collectives(module, ("all_reduce", "barrier"), timing(calls)) == ["all_reduce"]
    assert internals.wrap_collectives(module, ("barrier",), timing(calls)) == []
    assert module.all_reduce(1) == "reduced" and calls == ["all_reduce"] and module.barrier is len
    assert_named_once(capsys, "torch.distributed.distributed_c10d.barrier")


def test_torchs_backward_is_wrapped_and_tensor_backward_goes_through_it(internals, capsys, monkeypatch):
    import torch
    import torch.autograd

    monkeypatch.setattr(torch.autograd, "backward", torch.autograd.backward)
    calls = []
    wrapped = internals.wrap_autograd_backward(torch.autograd, timing(calls))
    log = read_log(capsys)
    assert wrapped is True and "[entrypoint]" not in log, log
    x = torch.ones(2, requires_grad=True)
    (x * 3).sum().backward()
    assert calls == ["backward"] and x.grad.tolist() == [3.0, 3.0]


@quick
def test_a_backward_of_another_shape_is_left_and_the_log_names_it_once(internals, capsys):
    module = types.ModuleType("torch.autograd")
    exec("def backward(outputs, grads=None):\n    return 'done'\n", module.__dict__)
    original = module.backward
    assert internals.wrap_autograd_backward(module, timing([])) is False
    assert internals.wrap_autograd_backward(module, timing([])) is False
    assert module.backward is original
    assert_named_once(capsys, "torch.autograd.backward")


def test_ddps_forward_is_wrapped(internals, capsys, monkeypatch):
    from torch.nn.parallel import distributed

    ddp = distributed.DistributedDataParallel
    monkeypatch.setattr(ddp, "forward", ddp.__dict__["forward"])
    wrapped = internals.wrap_ddp_forward(distributed, lambda: None)
    log = read_log(capsys)
    assert wrapped is True and ddp.forward.__name__ == "ddp_forward" and "[entrypoint]" not in log, log


@quick
def test_a_ddp_forward_of_another_shape_is_left_and_the_log_names_it_once(internals, capsys):
    module = types.ModuleType("torch.nn.parallel.distributed")
    exec("class DistributedDataParallel:\n    def forward(self, batch):\n        return batch\n", module.__dict__)
    original = module.DistributedDataParallel.forward
    assert internals.wrap_ddp_forward(module, lambda: None) is False
    assert internals.wrap_ddp_forward(module, lambda: None) is False
    assert module.DistributedDataParallel.forward is original
    assert_named_once(capsys, "torch.nn.parallel.distributed.DistributedDataParallel.forward")


@quick
def test_a_module_is_patched_once_its_loader_has_run_it(internals, capsys, tmp_path):
    (tmp_path / "byoc_probe_module.py").write_text("value = 1\n")
    spec = importlib.machinery.PathFinder.find_spec("byoc_probe_module", [str(tmp_path)])
    seen = []
    assert internals.run_after_exec(spec, lambda module: seen.append(module.value)) is True
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert seen == [1] and module.__loader__ is spec.loader
    assert_silent(capsys)


def test_torchs_own_modules_have_loaders_the_hook_can_step_after(internals, capsys):
    for name in ("torch.distributed.distributed_c10d", "torch.optim.optimizer", "torch.autograd",
                 "torch.nn.parallel.distributed"):
        parent = importlib.import_module(name.rpartition(".")[0])
        spec = importlib.machinery.PathFinder.find_spec(name, parent.__path__)
        stepped = internals.run_after_exec(spec, lambda module: None)
        log = read_log(capsys)
        assert stepped is True and "[entrypoint]" not in log, (name, log)


@quick
def test_a_loader_without_exec_module_is_left_and_the_log_names_it_once(internals, capsys):
    class OldLoader:  # the load_module() kind
        def load_module(self, name):
            return None

    spec = importlib.machinery.ModuleSpec("torch.autograd", OldLoader())
    assert internals.run_after_exec(spec, lambda module: None) is False
    assert internals.run_after_exec(spec, lambda module: None) is False
    assert_named_once(capsys, f"{__name__}.{OldLoader.__qualname__}.exec_module (replaced on one loader)")


# --- the rule: no other module of entrypoint/ reaches into these private names ------------------

# Modules whose private names are torch's and CPython's internals: the seam's business only.
# _thread itself is CPython's documented low-level API (allocate_lock); its private names and its
# raw threads are the seam's. _signal and _io are the private C modules behind signal and io.
WATCHED = ("torch", "sys", "atexit", "threading", "_thread", "multiprocessing", "_signal", "_io")
PRIVATE_MODULES = ("_signal", "_io")
FRAME_ATTRIBUTES = ("f_locals", "f_back", "f_globals")
IMPORTERS = ("__import__", "import_module", "_stdlib")  # record_errors._stdlib imports a standard module
OURS = "_byoc"  # our own names set on sys (record_errors' whole-lines mark), not CPython's


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and not name.startswith(OURS)


class Reaches:
    """Where one module's code reaches into the WATCHED modules' private names. A name stands for
    such a module or object when an import binds it, or an assignment from one of them:
    `sys.modules.get("threading")`, `sys.modules["torch"]`, `_stdlib("atexit")`,
    `importlib.import_module("torch.x")`, `getattr(torch_thing, ...)`, `torch.x.y`."""

    def __init__(self, tree: ast.Module):
        self.tree, self.roots = tree, {}  # name -> the WATCHED module it stands for
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if self.watched_name(alias.name):
                        self.roots[alias.asname or alias.name.split(".")[0]] = alias.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module and self.watched_name(node.module):
                for alias in node.names:
                    self.roots[alias.asname or alias.name] = node.module.split(".")[0]
        grown = True
        while grown:  # assignments from watched values, until no new name
            grown = False
            for node in ast.walk(tree):
                if isinstance(node, ast.Assign) and self.root_of(node.value):
                    for target in node.targets:
                        if isinstance(target, ast.Name) and target.id not in self.roots:
                            self.roots[target.id], grown = self.root_of(node.value), True

    @staticmethod
    def watched_name(dotted: str) -> bool:
        return dotted.split(".")[0] in WATCHED

    def named_module(self, call: ast.Call) -> str | None:
        """The watched module a call names by a string: an import, sys.modules.get."""
        func = call.func
        fname = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        by_import = fname in IMPORTERS
        by_sys_modules = fname == "get" and isinstance(func, ast.Attribute) and self.is_sys_modules(func.value)
        if (by_import or by_sys_modules) and call.args and isinstance(call.args[0], ast.Constant) \
                and isinstance(call.args[0].value, str) and self.watched_name(call.args[0].value):
            return call.args[0].value
        return None

    def is_sys_modules(self, node) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "modules" and self.root_of(node.value) == "sys"

    def root_of(self, node) -> str | None:
        """The WATCHED module node stands for (or an object of), None when none."""
        if isinstance(node, ast.Name):
            return self.roots.get(node.id)
        if isinstance(node, ast.Attribute):
            return self.root_of(node.value)
        if isinstance(node, ast.Call):
            named = self.named_module(node)
            if named:
                return named.split(".")[0]
            if isinstance(node.func, ast.Name) and node.func.id == "getattr" and node.args:
                return self.root_of(node.args[0])
            return None  # what a call returns is a value of its own (a Thread, a frame: read below)
        if isinstance(node, ast.Subscript) and self.is_sys_modules(node.value) and isinstance(node.slice, ast.Constant) \
                and isinstance(node.slice.value, str) and self.watched_name(node.slice.value):
            return node.slice.value.split(".")[0]
        return None

    def find(self) -> list[str]:
        found = []
        for node in ast.walk(self.tree):
            found += [f"{getattr(node, 'lineno', '?')}: {what}" for what in self.reaches_of(node)]
        return sorted(set(found))

    def reaches_of(self, node) -> list[str]:
        out = []
        if isinstance(node, ast.Attribute):
            root = self.root_of(node.value)
            if root and (is_private(node.attr) or node.attr == "start_new_thread"):
                out.append(f"{root}'s .{node.attr}")
            if node.attr in FRAME_ATTRIBUTES:
                out.append(f"a frame's .{node.attr}")
        for target in assigned(node):
            if isinstance(target, ast.Attribute):
                root = self.root_of(target.value)
                if root and root != "sys":  # sys.argv, sys.stdin: public and the program's to set
                    out.append(f"{root}'s .{target.attr} replaced")
                if target.attr == "exec_module":
                    out.append("a loader's exec_module replaced")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args and self.root_of(node.args[0]):
            root, named = self.root_of(node.args[0]), node.args[1:2]
            if node.func.id in ("setattr", "delattr") and root != "sys":
                out.append(f"{root}'s attribute replaced ({node.func.id})")
            if node.func.id in ("getattr", "hasattr", "setattr", "delattr") and named and \
                    isinstance(named[0], ast.Constant) and isinstance(named[0].value, str) and is_private(named[0].value):
                out.append(f"{root}'s .{named[0].value}")
        modules = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        if isinstance(node, ast.Call) and self.named_module(node):
            modules.append(self.named_module(node))
        for module in modules:
            parts = module.split(".")
            if parts[0] in PRIVATE_MODULES or (parts[0] in WATCHED and any(is_private(p) for p in parts[1:])):
                out.append(f"private module {module}")
        return out


def assigned(node) -> list:
    """The targets node assigns or deletes, tuples unpacked (`a.x, a.y = f, g`)."""
    targets = list(node.targets) if isinstance(node, (ast.Assign, ast.Delete)) else \
        [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
    flat = []
    while targets:
        target = targets.pop()
        if isinstance(target, (ast.Tuple, ast.List)):
            targets += target.elts
        else:
            flat.append(target)
    return flat


def base_name(node) -> str | None:
    """The name an expression reads from: `module` of `module.x.y` and `getattr(module, "x")`."""
    while True:
        if isinstance(node, ast.Attribute):
            node = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" and node.args:
            node = node.args[0]
        else:
            return node.id if isinstance(node, ast.Name) else None


def find_handed_in_changes(tree: ast.Module) -> list[str]:
    """In rank/: attributes set on what a function was handed (a torch module given to a patch),
    or on what it read from it (`ddp = module.DistributedDataParallel`), but on self or cls: such a
    change is the seam's (wrap_collectives, wrap_autograd_backward, wrap_ddp_forward)."""
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        args = function.args
        handed = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs} - {"self", "cls"}
        grown = True
        while grown:  # what is read from the handed is handed too
            grown = False
            for node in ast.walk(function):
                if isinstance(node, ast.Assign) and base_name(node.value) in handed:
                    for target in assigned(node):
                        if isinstance(target, ast.Name) and target.id not in handed:
                            handed.add(target.id)
                            grown = True
        for node in ast.walk(function):
            changed = [t.value for t in assigned(node) if isinstance(t, ast.Attribute)]
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr"):
                changed += node.args[:1]
            found += [f"{node.lineno}: {c.id} (handed to {getattr(function, 'name', 'a lambda')})"
                      for c in changed if isinstance(c, ast.Name) and c.id in handed]
    return sorted(set(found))


def entrypoint_modules() -> dict[str, ast.Module]:
    return {str(p.relative_to(PACKAGE)): ast.parse(p.read_text(), str(p)) for p in sorted(PACKAGE.rglob("*.py"))}


@quick
def test_the_rule_tells_each_kind_of_reach_on_a_sample():
    sample = ast.parse(textwrap.dedent("""
        import sys, atexit, _thread, _signal
        import torch._dynamo
        from multiprocessing import util
        frame = sys._getframe(1)
        frame.f_locals["ret_val_"].put(None)
        atexit._clear()
        _thread.start_new_thread(f, ())
        threading = sys.modules.get("threading")
        threading._shutdown()
        _stdlib("atexit")._run_exitfuncs()
        util._exit_function
        torch.autograd.backward = timed
        setattr(sys.modules["torch.distributed"], "all_reduce", timed)
        spec.loader.exec_module = after
        importlib.import_module("torch._dynamo")
        sys.argv = ["x"]
        sys._byoc_whole_lines = True
        _thread.allocate_lock()
        getattr(sys, "_getframe")(0)
        self._write()
        mp = sys.modules.get("multiprocessing")
        mp.parent_process()
        """))
    lines = sorted({int(r.split(":")[0]) for r in Reaches(sample).find()})
    assert lines == [2, 3, 5, 6, 7, 8, 10, 11, 12, 13, 14, 15, 16, 20], Reaches(sample).find()
    handed = ast.parse("def patch(module, name):\n    module.backward = 1\n    setattr(module, name, 2)\n"
                       "def ok(self):\n    self.x = 1\n    local = f()\n    local.y = 2\n"
                       "def patch_ddp(module):\n    ddp = getattr(module, 'DDP', None)\n    ddp.forward = 3\n")
    assert find_handed_in_changes(handed) == ["10: ddp (handed to patch_ddp)", "2: module (handed to patch)",
                                              "3: module (handed to patch)"]


@quick
def test_only_the_seam_reaches_into_torchs_and_cpythons_private_names():
    modules = entrypoint_modules()
    outside = {name: Reaches(tree).find() for name, tree in modules.items() if name != SEAM}
    outside = {name: found for name, found in outside.items() if found}
    assert not outside, outside
    handed = {name: find_handed_in_changes(tree) for name, tree in modules.items()
              if name.startswith("rank/") and name != SEAM}
    handed = {name: found for name, found in handed.items() if found}
    assert not handed, handed
    # The reader sees the seam's own reaches: every kind is there, and only there.
    inside = " ".join(Reaches(modules[SEAM]).find())
    for kind in ("sys's ._getframe", "a frame's .f_locals", "atexit's ._clear", "threading's ._shutdown",
                 "_thread's .start_new_thread", "atexit's .register replaced", "a loader's exec_module replaced",
                 "private module _signal", "private module _io"):
        assert kind in inside, (kind, inside)


@quick
def test_every_reach_says_what_it_was_checked_on_and_its_fallback():
    """Each public function of the seam says in its docstring what it was checked on (the torch
    versions of CHECKED_ON, scripts/check-torch-versions.sh) and its fallback."""
    tree = ast.parse((RANK / "byoc_internals.py").read_text())
    helpers = {"note_fallback", "check_once", "find_caller_local"}
    reaches = [n for n in tree.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")
               and n.name not in helpers]
    assert len(reaches) >= 15, [n.name for n in reaches]
    checked_on = f"Checked on: {load_fresh().CHECKED_ON}."
    missing = [n.name for n in reaches if checked_on not in " ".join((ast.get_docstring(n) or "").split())
               or "Fallback" not in (ast.get_docstring(n) or "")]
    assert not missing, missing

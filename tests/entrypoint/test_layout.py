"""The shape ARCHITECTURE.md promises, held by tests: a folder per part with few flat modules,
short functions, one writer of output/, one module that switches on the role, the job port's
words in its protocol module and the rank's copy only (and the same words in both), and the
layers: no import circle, no import up the layers."""

from __future__ import annotations

import ast
import fnmatch
import io
import os
import re
import tokenize
from pathlib import Path
import pytest

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "entrypoint"
MAX_FLAT_MODULES = 8
MAX_FUNCTION_LINES = 60
PROTOCOL_WORDS = ("BYOC-ROOT-CAUSE", "BYOC-HOST-DONE", "BYOC-SIGNED", "BYOC_JOB_REPORT_KEY", "BYOC_JOB_PORT_KEY", "BYOC_JOB_PORTS")
PROTOCOL_FILES = {"hosts/job_port.py", "rank/record_errors.py"}
# The modules that decide by role: the plan's record (decide/launch_plan.py) and the launcher
# families (decide/launchers/, each its own roles). roles/choose.py asks the family, by its
# registry; decide/plan.py reads the record's role sets.
ROLE_MODULES = ("decide/launch_plan.py", "decide/launchers/")  # a new family's module needs no line here
# read -> decide -> act, bottom first: a module imports only from its own layer or one below it.
# rank/ runs inside every rank, by path, on the standard library: it imports no other room.
# Then what every room shares (the errors, the log, the settings record, the host's loop), the
# reads (job/), the pure decisions (decide/), the words of an ending and the job report's
# measures (outcome/, jobreport/), the transports between hosts (hosts/), what acts on this
# host (run/, sdk_v3/), each launch family's role above it (roles/), the orchestrator that
# drives a role's lifecycle (orchestrate.py), and the order of things (cli.py).
LAYERS = (
    ("rank/",),
    ("errors.py", "log.py", "settings.py", "loop/"),
    ("job/",),
    ("decide/",),
    ("outcome/", "jobreport/"),
    ("hosts/",),
    ("run/", "sdk_v3/"),
    ("roles/",),
    ("orchestrate.py",),
    ("cli.py", "__main__.py", "__init__.py"),
)


def modules() -> dict[str, ast.Module]:
    return {str(p.relative_to(PACKAGE)): ast.parse(p.read_text(), str(p)) for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str, tree: ast.Module) -> set[str]:
    """The entrypoint modules (paths as in modules()) that module `name` imports anywhere: at
    module level, inside a function (a lazy import is still a dependency) and under
    TYPE_CHECKING (a type's home is a dependency too). A rank/ module's bare `import x` of a
    sibling (it runs by path, its folder first on sys.path) counts as rank/<x>.py."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        else:
            continue
        for dotted in names:
            if name.startswith("rank/") and "." not in dotted and (PACKAGE / "rank" / f"{dotted}.py").exists():
                found.add(f"rank/{dotted}.py")
            elif dotted.startswith("entrypoint."):
                path = dotted.removeprefix("entrypoint.").replace(".", "/")
                if (PACKAGE / f"{path}.py").exists():
                    found.add(f"{path}.py")
                elif (PACKAGE / path / "__init__.py").exists() and not any(
                        n.startswith(f"{dotted}.") and (PACKAGE / f"{n.removeprefix('entrypoint.').replace('.', '/')}.py").exists()
                        for n in names):
                    found.add(f"{path}/__init__.py")  # `from entrypoint.hosts import ssh` names hosts/ssh.py instead
    found.discard(name)
    return found


def import_graph() -> dict[str, set[str]]:
    return {name: imports_of(name, tree) for name, tree in modules().items()}


def layer_of(name: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) for room in layer if name == room or name.startswith(room))


def find_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle (a strongly connected set of modules larger than one), by Tarjan's
    algorithm, iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.append(member)
                    if member == node:
                        break
                if len(members) > 1:
                    circles.append(sorted(members))
    return circles


def code_strings(tree: ast.Module) -> list[str]:
    """The string constants of a module but its docstrings (prose may name the words)."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return [n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings]


def test_at_most_eight_modules_sit_directly_in_entrypoint():
    flat = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(flat) <= MAX_FLAT_MODULES, flat


def test_every_folder_of_entrypoint_is_a_package_named_in_the_architecture_document():
    folders = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__")
    architecture = (REPO / "ARCHITECTURE.md").read_text()
    for folder in folders:
        assert (PACKAGE / folder / "__init__.py").exists(), folder
        assert f"`{folder}/`" in architecture, f"ARCHITECTURE.md does not name entrypoint/{folder}/"


def test_no_function_runs_over_sixty_lines():
    long = [f"{name}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for name, tree in modules().items() for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, "\n".join(long)


def test_output_is_written_from_one_place():
    """write_outcome is the one writer of output/success and output/failure, called once:
    by cli.main, after every way the job can end became one Outcome."""
    calls = [(name, node.lineno) for name, tree in modules().items() for node in ast.walk(tree)
             if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "write_outcome"]
    assert [name for name, _ in calls] == ["cli.py"], calls
    writers = [name for name, tree in modules().items() for s in code_strings(tree) if s in ("success", "failure")]
    assert writers == ["job/paths.py", "job/paths.py"], writers  # only the paths' names


def test_the_job_ports_words_live_in_the_protocol_module_and_the_ranks_copy():
    found = {name for name, tree in modules().items()
             for s in code_strings(tree) for word in PROTOCOL_WORDS if word in s}
    assert found == PROTOCOL_FILES, found


def test_the_ranks_copy_of_the_protocol_says_the_same_words_and_signs_the_same_way():
    from entrypoint.hosts import job_port
    from entrypoint.rank import record_errors

    assert record_errors.MARKER == job_port.ROOT_CAUSE
    assert record_errors.SIGNED == job_port.SIGNED
    assert record_errors.JOB_KEY_ENV == job_port.JOB_KEY_ENV
    assert record_errors.JOB_KEY_OLD_ENV == job_port.JOB_KEY_OLD_ENV
    assert record_errors.JOB_PORTS_ENV == job_port.JOB_PORTS_ENV
    key, record = "ab" * 32, job_port.ROOT_CAUSE + '{"time": 1.0}'
    assert record_errors.sign_record(key, record) == job_port.sign_record(key, record)


def test_the_role_is_switched_on_only_in_the_plan_and_its_launcher_families():
    switching = {name for name, tree in modules().items() for node in ast.walk(tree)
                 if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Role"}
    outside = {name for name in switching if not name.startswith(ROLE_MODULES)}
    assert not outside, outside


def test_every_timeout_and_interval_is_in_the_settings_record():
    """No module-level number ending in _S (a time that hides as a constant); the rank's
    modules, which run by path with the standard library only, aside."""
    hidden = [f"{name}: {target.id}" for name, tree in modules().items() if not name.startswith("rank/")
              for node in tree.body if isinstance(node, ast.Assign)
              for target in node.targets if isinstance(target, ast.Name) and target.id.endswith("_S")]
    assert not hidden, hidden


# The modules that may pause with time.sleep, each for a reason no event can replace: the
# process table's own pace (run/processes.py: a gap between two ranks' SIGUSR1, a process group
# that is ending, read from /proc; used before and after the loop runs) and SDK v3's SSH setup,
# a program of its own that runs before the entrypoint (sdk_v3/peer_trust.py). Every other wait
# is the host loop's (loop/), whose waits are on its queue; rank/ runs inside the ranks.
SLEEPERS = {"run/processes.py", "sdk_v3/peer_trust.py"}


def calls_of(tree: ast.Module, attribute: str) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute) and node.func.attr == attribute]


def test_only_the_loop_waits_outside_the_ranks_and_two_named_modules():
    sleeping = {name for name, tree in modules().items() if calls_of(tree, "sleep") and not name.startswith("rank/")}
    assert sleeping <= SLEEPERS, sleeping - SLEEPERS
    assert len(SLEEPERS) <= 2


def test_no_lock_in_the_roles():
    """A role's state is the main thread's (its handlers run on the host loop): nothing to lock."""
    locking = {f"{name}: {node.func.attr}" for name, tree in modules().items() if name.startswith("roles/")
               for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
               and node.func.attr in ("Lock", "RLock", "Condition", "Semaphore", "Event")}
    assert not locking, locking


def test_the_stop_token_is_read_only_by_its_own_module():
    """Waits end on the loop's StopRequested event (loop/), never by polling the token."""
    polling = {name for name, tree in modules().items() if calls_of(tree, "requested")}
    assert polling <= {"run/stop.py"}, polling


def test_no_message_is_dispatched_on_its_text_in_the_transports_and_the_roles():
    """The job port's and the roles' messages are types (hosts/job_port.MESSAGE_KINDS), each
    with one parser: no `startswith` on a protocol word, and at most two startswith at all."""
    calls = [(name, node) for name, tree in modules().items() if name.startswith(("hosts/", "roles/"))
             for node in calls_of(tree, "startswith")]
    assert len(calls) <= 2, [name for name, _ in calls]
    words = [name for name, node in calls for arg in node.args
             if isinstance(arg, ast.Name) and arg.id.isupper() and arg.id not in ("RANK_OWNED_PREFIXES",)]
    assert not words, words


# The modules whose timing numbers are still bare literals: hosts/ is being rewritten (issue
# 44, one loop per host), which takes them into settings.py's fixed group.
BARE_TIMING_NOT_YET: set[str] = set()


def is_timing_name(name: str | None) -> bool:
    """A time by its name: *_s (not a rate, *_per_s), *timeout*, *delay*."""
    return bool(name) and ((name.endswith("_s") and not name.endswith("_per_s")) or "timeout" in name or "delay" in name)


def find_bare_timing_numbers(tree: ast.Module) -> list[str]:
    """Numbers other than 0 written into a wait: a sleep's, wait's or join's argument, a
    timeout keyword (timeout=, *_s=), a timing parameter's default, a timing variable's value."""
    def literal(node) -> bool:
        return any(isinstance(n, ast.Constant) and type(n.value) in (int, float) and n.value != 0
                   for n in ast.walk(node))

    found = []
    for node in ast.walk(tree):
        waits = []
        if isinstance(node, ast.Call):
            called = getattr(node.func, "attr", getattr(node.func, "id", None))
            arithmetic = [a for a in node.args[:1] if isinstance(a, (ast.Constant, ast.BinOp, ast.UnaryOp))]
            waits = [*(arithmetic if called in ("sleep", "wait", "join") else []),
                     *(k.value for k in node.keywords if is_timing_name(k.arg))]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            named = list(zip((a.posonlyargs + a.args)[::-1], a.defaults[::-1])) + list(zip(a.kwonlyargs, a.kw_defaults))
            waits = [default for arg, default in named if default is not None and is_timing_name(arg.arg)]
        elif isinstance(node, ast.Assign):
            names = [getattr(t, "id", getattr(t, "attr", None)) for t in node.targets]
            waits = [node.value] if any(is_timing_name(n) for n in names) else []
        found += [(node.lineno, ast.unparse(w)) for w in waits if literal(w)]
    return [f"{line}: {text}" for line, text in sorted(found)]


def test_no_timing_number_is_a_bare_literal():
    """A sleep, a wait, a join or a timeout takes its number from the settings record
    (settings.py), where its comment says why that value; the rank's modules (standard library
    only) aside."""
    assert find_bare_timing_numbers(ast.parse(
        "time.sleep(0.5)\nt.join(timeout=x + 5)\ndef f(timeout_s=3): pass\ndelay = 0.1\np.wait(2)\n"
        "time.sleep(s.wait_poll_s)\nt.join(timeout=s.thread_join_s)\ndef g(gap_s=0.0): pass\n"
        "cpu_s = 0.0\n','.join(p[:4] for p in parts)\nsamples_per_s = n * 1000.0\n")) == ["1: 0.5", "2: x + 5", "3: 3", "4: 0.1", "5: 2"]
    bare = [f"{name}:{where}" for name, tree in modules().items()
            if not name.startswith("rank/") and name != "settings.py" and name not in BARE_TIMING_NOT_YET
            for where in find_bare_timing_numbers(tree)]
    assert not bare, bare


def test_the_import_reader_sees_lazy_type_only_and_sibling_imports():
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from entrypoint.decide.plan import LaunchPlan\n"
              "from entrypoint.hosts import ssh\nimport entrypoint.log\n"
              "def f():\n    from entrypoint.outcome.writer import Outcome\n    import record_errors\n")
    assert imports_of("run/x.py", ast.parse(source)) == {"decide/plan.py", "hosts/ssh.py", "log.py", "outcome/writer.py"}
    assert imports_of("rank/x.py", ast.parse(source)) == {"decide/plan.py", "hosts/ssh.py", "log.py", "outcome/writer.py",
                                                          "rank/record_errors.py"}


def test_the_circle_finder_finds_a_circle_and_only_a_circle():
    assert find_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_circles({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a", "c"}}) == []


def test_every_module_of_entrypoint_is_in_a_layer():
    unplaced = []
    for name in modules():
        try:
            layer_of(name)
        except StopIteration:
            unplaced.append(name)
    assert not unplaced, unplaced


def test_entrypoint_has_no_import_circle():
    assert find_circles(import_graph()) == []


def test_no_import_runs_up_the_layers():
    """read -> decide -> act (LAYERS): a value type a lower layer needs lives in that layer or
    below, never where it was first used."""
    upward = [f"{name} -> {target}" for name, targets in import_graph().items() for target in sorted(targets)
              if layer_of(target) > layer_of(name)]
    assert not upward, "\n".join(upward)


def test_the_ranks_modules_load_on_the_standard_library_alone():
    """rank/ runs inside every rank, by path, under whatever Python the user's code has: what it
    imports when it loads is the standard library or a sibling (torch only inside the functions
    that run under torch: the deep health check's ranks, launch_torchrun's main)."""
    import sys

    loaded = {(name, alias.name if isinstance(node, ast.Import) else node.module)
              for name, tree in modules().items() if name.startswith("rank/")
              for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
              for alias in node.names}
    assert loaded, "no import read"
    outside = {(name, module) for name, module in loaded if module.split(".")[0] not in sys.stdlib_module_names}
    assert outside == set(), outside


def count_parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    args = node.args
    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg] if a]
    return len(names) - (names[:1] in (["self"], ["cls"]))


def test_the_failure_words_take_at_most_six_parameters():
    """How a step ended travels as one record (outcome/records.StepEnding), not as a dozen keywords."""
    assert count_parameters(ast.parse("def f(self, a, *b, c=1, **d): pass").body[0]) == 4
    long = [f"{name}:{node.lineno} {node.name} ({count_parameters(node)})" for name, tree in modules().items()
            if name.startswith("outcome/") for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and count_parameters(node) > 6]
    assert not long, long


def test_in_each_room_no_module_is_named_as_another_with_more_on_the_end():
    """A name says one thing: not `live` beside `live_view` and `live_loop`, nor `sample` beside
    `sampler` (now a folder, jobreport/live/, whose modules say what each does)."""
    clashes = []
    for folder in sorted(p for p in PACKAGE.rglob("*") if p.is_dir() and p.name != "__pycache__"):
        names = sorted(p.stem if p.suffix == ".py" else p.name for p in folder.iterdir()
                       if not p.name.startswith(("_", ".")) and (p.suffix == ".py" or p.is_dir()))
        clashes += [f"{folder.relative_to(PACKAGE)}/: {a}, {b}" for a in names for b in names
                    if a != b and b.startswith(a)]
    assert not clashes, clashes


# --- the paths comments name --------------------------------------------------------------------

# Where the comments and docstrings read are: a path they name (`jobreport/live/`,
# `outcome/writer.py`, `roles/choose.choose_role`) must exist in the repository.
COMMENTED = ("entrypoint", "train", "scripts", "docker", "tests", "benchmarks", "jobs", "localcluster")
COMMENTED_FILES = ("pyproject.toml", "Dockerfile.gpu", "Dockerfile.trn1", "buildspec.yml")
# What looks like one of our paths and is not: other projects' files (SageMaker's toolkit and
# SDK, torch, the user's script) and TensorBoard tags.
NOT_OURS = {"scripts/environment.py", "job/stragglers", "job/phases", "sm_train.sh", "mpi_driver.py",
            "torchrun_driver.py", "templates.py", "setup.py", "train.py", "entrypoint.py", "entry.py", "version.py",
            "json.py", "socket.py", "subprocess.py", "t.py", "train_digits.py", "script.py", "bin/python"}
# Stale names in what issue 44's rewrite replaces (roles/, hosts/, run/, rank/) and in
# settings.py, which another change rewrites: (file, name). The rewrite removes each; one that
# is gone must leave this list too.
KNOWN_STALE: set[tuple[str, str]] = set()  # (file, the path it names) a rewrite in progress has yet to fix
NAMED_PATH = re.compile(r"(?<![\w./~$-])(?:[\w-][\w.-]*/)+[\w.*-]*")
NAMED_FILE = re.compile(r"(?<![\w./~$-])[\w-]+\.(?:py|sh)\b(?![\w/])")
FILE_SUFFIXES = {"py", "sh", "md", "toml", "json", "yml", "yaml", "txt", "cfg", "env", "html"}


def repo_tree() -> tuple[set[str], set[str]]:
    """(files, folders) of the repository, as paths from its root; hidden ones and caches aside."""
    files, folders = set(), set()
    for root, dirs, names in os.walk(REPO):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
        here = Path(root).relative_to(REPO).as_posix()
        if here != ".":
            folders.add(here)
        files.update(f"{here}/{n}" if here != "." else n for n in names)
    return files, folders


def comment_lines(path: Path) -> list[tuple[int, str]]:
    """(line, text) of a file's comments, and of its docstrings when it is Python."""
    source = path.read_text(errors="replace")
    if path.suffix != ".py":
        return [(i, line[line.index("#"):]) for i, line in enumerate(source.splitlines(), 1) if "#" in line]
    found = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(source).readline)
             if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            text = first.value.value if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) else None
            if isinstance(text, str):
                found += [(first.lineno + i, line) for i, line in enumerate(text.splitlines())]
    return found


def decide_named_path_exists(name: str, files: set[str], folders: set[str]) -> bool:
    """Whether a path a comment names is in the repository, whatever folder it is named from
    (`live/loop.py`, `jobreport/live/loop.py`, `entrypoint/jobreport/live/loop.py`): a file, a
    folder, a glob of files, or a module and one of its names (`run/supervise.Supervisor.on_signal`)."""
    def ends(paths, tail):
        return any(p == tail or p.endswith("/" + tail) for p in paths)

    if name.endswith("/"):
        return ends(folders, name.rstrip("/"))
    if "*" in name:
        return any(fnmatch.fnmatch(p, f"*{name}") for p in files)
    if ends(files, name) or ends(files, f"{name}.py") or ends(folders, name):
        return True
    where, _, last = name.rpartition("/")
    module, dot, rest = last.partition(".")
    if not dot or rest.split(".")[0] in FILE_SUFFIXES:
        return False
    module = f"{where}/{module}" if where else module
    return ends(files, f"{module}.py") or ends(folders, module)


def find_stale_names() -> set[tuple[str, str, int]]:
    """(file, name, line) of every path a comment names that is not in the repository. A name
    with a folder is ours when it starts at one of our folders' names (`output/data/` is the
    job's). A bare file name (`writer.py`) must be one of its own room's files, or of a room
    that is not a Python package (docker/, scripts/), or, named from outside every package, of
    entrypoint/: a package's comment names another package's module with its folder."""
    files, folders = repo_tree()
    ours = {f.split("/")[0] for f in folders} | {f.rsplit("/", 1)[-1] for f in folders if "/" in f}
    plain = tuple(f"{room}/" for room in folders if "/" not in room and f"{room}/__init__.py" not in files)
    read = sorted(p for room in COMMENTED for p in (REPO / room).rglob("*") if p.is_file()
                  if p.suffix in (".py", ".sh", ".env", ".toml", ".yml") or p.name.startswith("Dockerfile")
                  if not any(part.startswith((".", "__pycache__")) for part in p.relative_to(REPO).parts))
    stale = set()
    for path in read + [REPO / f for f in COMMENTED_FILES]:
        file = path.relative_to(REPO).as_posix()
        room = file.split("/")[0] + "/"
        rooms = (room,) + plain + (("entrypoint/",) if room + "__init__.py" not in files else ())
        for line, text in comment_lines(path):
            for match in NAMED_PATH.finditer(text):
                name = match.group(0).rstrip(".,:;")
                if name.split("/")[0] in ours and name not in NOT_OURS \
                        and not decide_named_path_exists(name, files, folders):
                    stale.add((file, name, line))
            for match in NAMED_FILE.finditer(text):
                name = match.group(0)
                if name not in NOT_OURS and not any(f.rsplit("/", 1)[-1] == name for f in files
                                                    if f.startswith(rooms)):
                    stale.add((file, name, line))
    return stale


def test_the_path_reader_knows_files_folders_globs_and_a_modules_names():
    files, folders = {"entrypoint/outcome/writer.py", "tests/localmode/test_v3_jobs.py"}, \
        {"entrypoint", "entrypoint/outcome", "tests", "tests/localmode"}
    for name in ("outcome/writer.py", "entrypoint/outcome/writer.py", "outcome/", "entrypoint/outcome",
                 "outcome/writer.write_outcome", "tests/localmode/test_v3_*.py"):
        assert decide_named_path_exists(name, files, folders), name
    for name in ("outcome.py", "outcome/writer.md", "report/", "run/roles.py", "outcome/writer.py.bak",
                 "tests/localmode/test_v2_*.py", "utcome/writer.py"):
        assert not decide_named_path_exists(name, files, folders), name


def test_every_path_a_comment_names_exists():
    """A comment that names a module that is gone sends its reader nowhere. KNOWN_STALE holds
    those that issue 44's rewrite removes, and shrinks."""
    stale = find_stale_names()
    new = sorted(f"{file}:{line}: {name}" for file, name, line in stale if (file, name) not in KNOWN_STALE)
    assert not new, "comments name paths that do not exist (another project's file: NOT_OURS):\n" + "\n".join(new)
    fixed = KNOWN_STALE - {(file, name) for file, name, _ in stale}
    assert not fixed, f"no longer stale, take them out of KNOWN_STALE: {sorted(fixed)}"

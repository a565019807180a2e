"""The shape ARCHITECTURE.md promises, held by tests: a folder per part with few flat modules,
short functions, one writer of output/, one module that switches on the role, the job port's
words in its protocol module and the rank's copy only (and the same words in both)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "entrypoint"
MAX_FLAT_MODULES = 8
MAX_FUNCTION_LINES = 60
PROTOCOL_WORDS = ("BYOC-ROOT-CAUSE", "BYOC-HOST-DONE", "BYOC-SIGNED", "BYOC_JOB_REPORT_KEY", "BYOC_JOB_PORT_KEY", "BYOC_JOB_PORTS")
PROTOCOL_FILES = {"hosts/job_port.py", "rank/record_errors.py"}
# The modules that decide or choose by role: the plan's decisions and run/roles.py, which
# chooses this host's role object once.
ROLE_MODULES = {"decide/plan.py", "decide/topology.py", "decide/distribution.py", "roles/choose.py"}


def modules() -> dict[str, ast.Module]:
    return {str(p.relative_to(PACKAGE)): ast.parse(p.read_text(), str(p)) for p in sorted(PACKAGE.rglob("*.py"))}


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
    assert record_errors.sign_report(key, record) == job_port.sign_record(key, record)


def test_the_role_is_switched_on_in_one_module_besides_the_plans_decisions():
    switching = {name for name, tree in modules().items() for node in ast.walk(tree)
                 if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Role"}
    assert switching <= ROLE_MODULES, switching - ROLE_MODULES


def test_every_timeout_and_interval_is_in_the_settings_record():
    """No module-level number ending in _S outside decide/settings.py (a time that hides as a
    constant); the rank's modules, which run by path with the standard library only, aside."""
    hidden = [f"{name}: {target.id}" for name, tree in modules().items()
              if name != "decide/settings.py" and not name.startswith("rank/")
              for node in tree.body if isinstance(node, ast.Assign)
              for target in node.targets if isinstance(target, ast.Name) and target.id.endswith("_S")]
    assert not hidden, hidden

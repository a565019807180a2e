"""The docs' settings tables say what the code does: every setting a job sets is in
docs/using.md's table, every BYOC_* variable a table of the docs names is a setting of
entrypoint/settings.py's table (SETTINGS) or one read elsewhere (OTHERS), and each default the
docs give, in a table or as "`NAME` (default N", is the default the code has."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from entrypoint.decide.settings import describe_default
from entrypoint.settings import SETTINGS

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MAIN_TABLE = REPO / "docs" / "using.md"
TABLE_HEAD = re.compile(r"^\|\s*(variable|setting)\s*\|\s*default\s*\|")
NAME = re.compile(r"`(BYOC_[A-Z0-9_]+)`")
# "`NAME` (default 600", "`NAME`, default 1 s", "`NAME` (90 s", "`NAME`, 300 s": a default in prose.
PROSE_DEFAULT = re.compile(r"`(BYOC_[A-Z0-9_]+)`(?:,|\s\()\s?(?:default\s)?([0-9]+(?:\.[0-9]+)?)\b")
BY_ENV = {row.env: row for row in SETTINGS}
OLD_NAMES = {row.old_env for row in SETTINGS if row.old_env}


def read_collective_timeout_default() -> str:
    """train/ddp_train.py's DEFAULT_COLLECTIVE_TIMEOUT (a timedelta of minutes), read without
    importing torch."""
    tree = ast.parse((REPO / "train" / "ddp_train.py").read_text())
    value = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                 and getattr(node.targets[0], "id", "") == "DEFAULT_COLLECTIVE_TIMEOUT")
    minutes = next(k.value.value for k in value.keywords if k.arg == "minutes")
    return f"{minutes} min"


# The settings whose default is the using module's own (the row's none_means says it): the two agree.
MODULE_DEFAULTS = {
    "BYOC_RUNTIME_DIR": lambda: importlib.import_module("entrypoint.run.runtime_dirs").RUNTIME_BASE,
    "BYOC_COMPILE_CACHE_DIR": lambda: importlib.import_module("entrypoint.decide.compile_cache").LOCAL_FOLDER,
    "BYOC_COLLECTIVE_TIMEOUT_S": read_collective_timeout_default,  # train/ddp_train.py
    "BYOC_COLLECTIVE_TIMEOUT_MIN": read_collective_timeout_default,
}
OTHERS: dict = {}  # a BYOC_* a table names that is no row: none (every one a job sets is a row)
ALIASES = {"BYOC_COLLECTIVE_TIMEOUT_MIN"}  # train/ddp_train.py: the same timeout in minutes


def find_settings_rows(markdown: str) -> list[tuple[list[str], list[str], list[str]]]:
    """Each row of each `| variable | default | …` table: (its names, the names it gives as
    `(or …)`, its defaults, one a name)."""
    rows, inside = [], False
    for line in markdown.splitlines():
        if TABLE_HEAD.match(line):
            inside = True
            continue
        if not line.startswith("|"):
            inside = False
        if not inside or re.match(r"^\|[\s:|-]+\|$", line):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        aliases = [n for part in re.findall(r"\(or ([^)]*)\)", cells[0]) for n in NAME.findall(part)]
        names = NAME.findall(re.sub(r"\(or [^)]*\)", "", cells[0]))
        defaults = [d.strip() for d in cells[1].replace("`", "").split(", ")] if names else []
        rows.append((names, aliases, defaults))
    return rows


def agrees(documented: str, code: str) -> bool:
    """The docs' default is the code's, or the code's with a word after it: "0 (off)"."""
    return documented == code or documented.startswith(code + " (")


def every_row():
    return [(doc.name, names, aliases, defaults) for doc in DOCUMENTS
            for names, aliases, defaults in find_settings_rows(doc.read_text()) if names]


def test_the_tables_are_found():
    found = {doc for doc, *_ in every_row()}
    assert {"using.md", "multi-host.md", "compile-cache.md"} <= found, found


@pytest.mark.parametrize("doc, names, aliases, defaults", every_row(), ids=lambda v: v if isinstance(v, str) else None)
def test_each_documented_default_is_the_codes(doc, names, aliases, defaults):
    assert len(defaults) == len(names), f"{doc}: one default a name: {names} {defaults}"
    for name, documented in zip(names, defaults):
        if name in BY_ENV:
            code = describe_default(BY_ENV[name])
        else:
            assert name in OTHERS, f"{doc}: {name} is neither in entrypoint/settings.py's SETTINGS nor read elsewhere"
            code = OTHERS[name]()
        assert agrees(documented, code), f"{doc}: {name}: the docs say {documented!r}, the code {code!r}"
    assert set(aliases) <= ALIASES | OLD_NAMES, aliases


def test_every_setting_is_in_the_main_table():
    documented = {name for names, aliases, _ in find_settings_rows(MAIN_TABLE.read_text()) for name in names + aliases}
    settings = {row.env for row in SETTINGS if row.env.startswith("BYOC_")}
    assert settings - documented == set(), f"not in {MAIN_TABLE.name}'s settings table"
    old = {name for name in OLD_NAMES if name not in MAIN_TABLE.read_text()}
    assert old == set(), "an old name not mentioned"


def test_each_default_said_in_prose_is_the_codes():
    said = [(doc.name, name, value) for doc in DOCUMENTS
            for name, value in PROSE_DEFAULT.findall(doc.read_text()) if name in BY_ENV]
    assert len(said) >= 10, said  # the pattern still finds them
    wrong = [(doc, name, value, describe_default(BY_ENV[name])) for doc, name, value in said
             if value != describe_default(BY_ENV[name]).split(" ")[0]]  # "30" of "30 min"
    assert wrong == [], wrong


@pytest.mark.parametrize("name", sorted(MODULE_DEFAULTS))
def test_a_default_the_module_keeps_is_the_one_the_table_says(name):
    assert describe_default(BY_ENV[name]) == MODULE_DEFAULTS[name](), name


def test_the_reader_of_the_tables():
    markdown = ("| variable | default | what |\n|---|---|---|\n| `BYOC_A`, `BYOC_B` (or `BYOC_C`) | `1`, 0 (off) | x |\n"
                "| `BYOC_D` | 2 | y |\n\n| variable | samples/s |\n|---|---|\n| `BYOC_E` | 3 |\n")
    assert find_settings_rows(markdown) == [(["BYOC_A", "BYOC_B"], ["BYOC_C"], ["1", "0 (off)"]), (["BYOC_D"], [], ["2"])]
    assert agrees("0 (off)", "0") and not agrees("00", "0") and not agrees("90", "9")


# --- the code's reads agree with the table ---------------------------------------------------

# The BYOC_* variables the entrypoint sets for the processes it starts (and reads back there, or
# in train/): no job sets them, so they are no rows of SETTINGS. The test below finds every BYOC_* the code of entrypoint/ and
# train/ names in one of the two (SETTINGS, or here with the module that sets it).
PROCESS_ENV = {
    "BYOC_ATTEMPT": "the attempt a process belongs to, from 1 (decide/restarts.py)",
    "BYOC_CRASH_DIR": "where a rank killed by a fatal signal leaves its stacks (rank/launch_torchrun.py)",
    "BYOC_HOST_ENV_FILE": "each MPI host's own SM_* values, applied by the rank wrapper (roles/mpi.py)",
    "BYOC_JOB_PORTS": "every host's job port, where a rank sends its root cause (decide/plan.py; a job's own "
                      "value is kept, for a harness that runs the ranks itself)",
    "BYOC_JOB_PORT_KEY": "the job's key the ranks sign their root causes with (decide/plan.py)",
    "BYOC_JOB_REPORT_KEY": "the same key's old name, set for one release",
    "BYOC_JOB_NCCL_PROTO": "SDK v3's NCCL protocol choice, handed to its driver (sdk_v3/nccl_proto.py)",
    "BYOC_NUM_WORKERS": "the parameter server's worker count (decide/plan.py)",
    "BYOC_PS_ROLE": "a parameter-server process's role (decide/plan.py)",
    "BYOC_PS_SERVERS": "the parameter servers' addresses (decide/plan.py)",
    "BYOC_WORKER_RANK": "a parameter-server worker's rank (decide/plan.py)",
    "BYOC_REPORT_DIR": "where a rank writes its step figures for the job report (decide/job_report.py)",
    "BYOC_SDK_V3_RUN": "which program runs a v3 job: set by the image's bash-env.sh",
    "BYOC_SDK_V3_COMMAND": "the command v3 gave PID 1, kept for its own drivers (job/v3_definition.py)",
}
BYOC_NAME = re.compile(r"^BYOC_[A-Z0-9_]+$")


def find_byoc_names_in_code(folders=("entrypoint", "train")) -> dict[str, set[str]]:
    """Every BYOC_* name the code of these folders spells as a string of its own (an environment
    read, a key it sets), docstrings aside: name -> the files."""
    found: dict[str, set[str]] = {}
    for folder in folders:
        for path in sorted((REPO / folder).rglob("*.py")):
            tree = ast.parse(path.read_text())
            docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                          if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                          and node.body and isinstance(node.body[0], ast.Expr)
                          and isinstance(node.body[0].value, ast.Constant)}
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and BYOC_NAME.match(node.value) \
                        and id(node) not in docstrings:
                    found.setdefault(node.value, set()).add(str(path.relative_to(REPO)))
    return found


def test_every_byoc_name_the_code_reads_is_a_setting_or_one_the_entrypoint_sets_for_its_processes():
    found = find_byoc_names_in_code()
    assert {"BYOC_GRACE_PERIOD_S", "BYOC_ATTEMPT", "BYOC_PS_ROLE"} <= set(found), sorted(found)  # the finder finds
    unknown = {name: sorted(files) for name, files in found.items()
               if name not in BY_ENV and name not in OLD_NAMES and name not in PROCESS_ENV}
    assert unknown == {}, "read outside entrypoint/settings.py's SETTINGS (and not PROCESS_ENV)"
    assert set(PROCESS_ENV) & (set(BY_ENV) | OLD_NAMES) == set()


def test_no_table_of_the_docs_offers_a_name_the_entrypoint_sets_itself():
    offered = {name for _, names, aliases, _ in every_row() for name in names + aliases}
    assert offered & set(PROCESS_ENV) == set()


def test_the_settings_are_read_once_by_the_table_not_by_name():
    """No module but the table's reads a setting's environment variable by its name: each takes
    the value the table parsed (LaunchSettings), or its row (parse_setting_row)."""
    reads = []
    for path in sorted((REPO / "entrypoint").rglob("*.py")) + sorted((REPO / "train").rglob("*.py")):
        if path.name == "settings.py" and path.parent.name == "entrypoint":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "getenv") \
                    and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value in BY_ENV:
                reads.append(f"{path.relative_to(REPO)}:{node.lineno} {node.args[0].value}")
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value in BY_ENV:
                reads.append(f"{path.relative_to(REPO)}:{node.lineno} {node.slice.value}")
    assert reads == []


def test_every_duration_is_bounded_so_no_deadline_or_timer_overflows():
    """Every time setting has a finite upper bound of at most MAX_DURATION: a deadline built
    from one is a float a clock and the kernel hold (1e10 s once passed, then crashed the end)."""
    from entrypoint.settings import MAX_DURATION

    durations = [row for row in SETTINGS if row.kind is float and row.env.endswith(("_S", "_MIN"))
                 and row.field != "capacity_ends_at"]
    assert len(durations) >= 12, [row.env for row in durations]
    unbounded = [row.env for row in durations if row.high is None or row.high * (60 if row.env.endswith("_MIN") else 1)
                 > MAX_DURATION]
    assert unbounded == []

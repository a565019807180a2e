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

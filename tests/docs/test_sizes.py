"""The documents stay short enough to read for one task (issue 23): README.md, for users, at
most 150 lines; each document in docs/ at most 300, and at most 40 KB (issue 64: a limit on
lines alone let one line grow to 4,265 characters). They read as prose: no line over 400
characters outside a code block; a table cell's long text is a paragraph under the table.
History belongs in git, not in them."""

from pathlib import Path

import pytest

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

REPO = Path(__file__).resolve().parents[2]
LIMITS = {REPO / "README.md": 150, **{doc: 300 for doc in sorted((REPO / "docs").glob("*.md"))}}
PROSE = [*LIMITS, REPO / "ARCHITECTURE.md"]
MAX_BYTES = 40_000
MAX_LINE = 400


def find_long_lines(markdown: str, limit: int = MAX_LINE) -> list[int]:
    """The numbers (from 1) of the lines longer than limit characters outside ``` blocks."""
    long, in_code = [], False
    for number, line in enumerate(markdown.splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
        elif not in_code and len(line) > limit:
            long.append(number)
    return long


@pytest.mark.parametrize("document", list(LIMITS), ids=lambda p: str(p.relative_to(REPO)))
def test_each_document_fits_its_line_limit(document):
    lines = len(document.read_text().splitlines())
    assert lines <= LIMITS[document], f"{document.relative_to(REPO)}: {lines} lines, at most {LIMITS[document]}"


@pytest.mark.parametrize("document", PROSE, ids=lambda p: str(p.relative_to(REPO)))
def test_each_document_is_prose_under_its_size_and_line_length(document):
    text = document.read_text()
    assert len(text.encode()) <= MAX_BYTES, f"{document.relative_to(REPO)}: {len(text.encode())} bytes"
    assert find_long_lines(text) == [], f"{document.relative_to(REPO)}: lines over {MAX_LINE} characters"


def test_a_long_line_is_found_just_over_the_limit_and_never_in_a_code_block():
    text = "\n".join(["x" * 400, "y" * 401, "```", "z" * 5000, "```", "w" * 401])
    assert find_long_lines(text) == [2, 6]


def test_the_docs_index_links_every_document():
    """docs/README.md is the index: each document of docs/ is one link away from it."""
    index = (REPO / "docs" / "README.md").read_text()
    missing = [doc.name for doc in LIMITS if doc.parent.name == "docs" and doc.name != "README.md"
               and f"]({doc.name})" not in index]  # fmt: skip
    assert not missing, f"docs/README.md does not link: {missing}"


def test_the_readme_test_command_is_what_ci_runs():
    """.ci/run runs the README's test command, so what CI checks is what users are told to run."""
    ci = (REPO / ".ci" / "run").read_text()
    readme = (REPO / "README.md").read_text()
    assert "bash scripts/run-tests.sh" in readme and "bash scripts/run-main-job.sh" in readme
    assert "exec bash scripts/run-tests.sh" in ci

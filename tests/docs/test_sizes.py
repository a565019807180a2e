"""The documents stay short enough to read for one task (issue 23): README.md, for users, at
most 150 lines; each document in docs/ at most 300. History belongs in git, not in them."""

from pathlib import Path

import pytest

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

REPO = Path(__file__).resolve().parents[2]
LIMITS = {REPO / "README.md": 150, **{doc: 300 for doc in sorted((REPO / "docs").glob("*.md"))}}


@pytest.mark.parametrize("document", list(LIMITS), ids=lambda p: str(p.relative_to(REPO)))
def test_each_document_fits_its_line_limit(document):
    lines = len(document.read_text().splitlines())
    assert lines <= LIMITS[document], f"{document.relative_to(REPO)}: {lines} lines, at most {LIMITS[document]}"


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

"""Every relative link in README.md and docs/ leads somewhere: the file exists, and an anchor
(`#section`) names a heading of that file, as GitHub makes them (lower case, punctuation
dropped, spaces to hyphens, a repeated heading numbered)."""

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~)")


def build_anchors(markdown: str) -> set[str]:
    """GitHub's anchors for a document's headings (code blocks skipped)."""
    anchors, seen, fenced = set(), {}, False
    for line in markdown.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if fenced or not match:
            continue
        text = re.sub(r"`([^`]*)`", r"\1", match.group(1))
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def find_links(markdown: str) -> list[str]:
    links, fenced = [], False
    for line in markdown.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            links += LINK.findall(re.sub(r"`[^`]*`", "", line))
    return links


def test_build_anchors_follows_githubs_rule():
    doc = "# The two commands\n## `BYOC_MAX_RESTARTS`: restarts (in place)\n## Notes\n## Notes\n```\n# not a heading\n```\n"
    assert build_anchors(doc) == {"the-two-commands", "byoc_max_restarts-restarts-in-place", "notes", "notes-1"}


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(document):
    text = document.read_text()
    broken = []
    for target in find_links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...: not ours to check here
            continue
        path, _, anchor = target.partition("#")
        dest = (document.parent / path).resolve() if path else document
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in build_anchors(dest.read_text()):
            broken.append(f"{target}: no heading makes #{anchor}")
    assert not broken, f"{document.relative_to(REPO)}: " + "; ".join(broken)


def test_every_document_is_reachable_from_the_readme():
    """README.md links each document of docs/, directly or through one it links."""
    reached, queue = set(), [REPO / "README.md"]
    while queue:
        doc = queue.pop()
        if doc in reached or not doc.exists() or doc.suffix != ".md":
            continue
        reached.add(doc)
        for target in find_links(doc.read_text()):
            path = target.partition("#")[0]
            if path and not re.match(r"^[a-z][a-z0-9+.-]*:", path):
                queue.append((doc.parent / path).resolve())
    missing = [str(p.relative_to(REPO)) for p in DOCUMENTS if p not in reached]
    assert not missing, f"not reachable from README.md: {missing}"

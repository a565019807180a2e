"""The forked-rank test files, which run on this machine and again inside the built image
(tests/images/test_in_image.py). Both run the same Python in CI and on a fresh root (Debian's
3.11.2, the image's; torch at the same pin) and nothing in them skips in the image, so a
session that runs their in-image copy leaves their copy here out: one run, where it ships
(233 s of CPU a run, issue 63). Run alone (`pytest tests/entrypoint/rank/...`), or where the
in-image copy is not selected or cannot run (not root), the copy here runs."""

from __future__ import annotations

# Forked ranks stay the default only while these pass in the image too (issue 62): the
# image's own torch, Python and runtime.
FORKED_RANK_TESTS = (
    "tests/entrypoint/rank/test_forked_like_started.py",
    "tests/entrypoint/rank/test_forked_ranks.py",
)
IN_IMAGE_TEST = "tests/images/test_in_image.py::test_entrypoint_tests_pass_inside_the_image"


def decide_in_image_param(test_file: str) -> str:
    """The in-image test's node id for one file (its parameter is the file's stem)."""
    return f"{IN_IMAGE_TEST}[{test_file.rsplit('/', 1)[-1].removesuffix('.py')}]"


def decide_host_copies_left_out(nodeids: list[str], can_run_in_image: bool) -> set[str]:
    """Of the selected node ids, the forked-rank tests whose file's in-image copy is selected
    too: these are left out here."""
    if not can_run_in_image:
        return set()
    selected = set(nodeids)
    files = {f for f in FORKED_RANK_TESTS if decide_in_image_param(f) in selected}
    return {n for n in nodeids if n.split("::", 1)[0] in files}

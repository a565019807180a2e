"""The suite's parallel run (pytest-xdist, `scripts/run-tests.sh`): which tests never run beside
each other, and which start first.

- tests/localmode/ runs SageMaker local mode: its containers are the hosts algo-1, algo-2, ...
  on the one Docker network both SDKs fix for every local-mode job (`sagemaker-local`), so two
  such jobs at once would resolve each other's hosts. Its tests are one work unit: one worker
  runs them all, in turn; the other workers share the rest test by test.
- tests/multihost/ is one work unit too: one 2- or 3-host job at a time (below).
- A module whose tests share a module- or class-scoped fixture is one work unit: the fixture
  is made once, not once on each worker.
- The work unit with the most tests starts first (xdist's order), then the tests marked `slow`,
  then the rest: a slow test begun last would leave the other workers idle at the end.
- The forked-rank test files run once a session: inside the image where that copy runs
  (decide_host_copies_left_out).
- Each worker's processes get a TMPDIR of their own (worker_tmpdir): Open MPI's session folder.
- Hypothesis judges no test by its speed (HYPOTHESIS_PROFILE): beside 3 other workers on 2
  cores, the time an input takes to make says nothing about the code under test.

A run without workers (`-n 0`) keeps the usual order."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

try:
    from hypothesis import HealthCheck, settings
except ImportError:  # in the image, the tests run with the packages they were given
    settings = None

# The suite's hypothesis settings (a test's own @settings keeps them where it says nothing):
# no deadline and no too-slow health check, both measures of wall time (seen in CI: "Input
# generation is slow" for a list of 60 short strings, in the image beside the other workers).
HYPOTHESIS_PROFILE = "byoc-suite"
if settings is not None:
    settings.register_profile(HYPOTHESIS_PROFILE, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile(HYPOTHESIS_PROFILE)

# Emulated hosts' jobs run one at a time as well: their stops and restarts race each other's
# load on 2 cores (seen beside the other workers: a stop's exit code 143 where 3 was kept).
SERIAL_FOLDERS = {"tests/localmode/": "sagemaker-local", "tests/multihost/": "emulated-hosts"}

# The forked-rank test files run on this machine and again inside the built image
# (tests/images/test_in_image.py). Both run the same Python in CI and on a fresh root (Debian's
# 3.11.2, the image's; torch at the same pin) and nothing in them skips in the image, so a
# session that runs their in-image copy leaves their copy here out: one run, where it ships
# (233 s of CPU a run, issue 63). Run alone (`pytest tests/entrypoint/rank/...`), or where the
# in-image copy is not selected or cannot run (not root), the copy here runs.
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


# A module- or class-scoped fixture is made once per worker that runs one of its tests: a
# module whose tests share one (a whole training run, a 256-host report) is one work unit.
SHARED_FIXTURE = re.compile(r"@pytest\.fixture\([^)]*scope=[\"'](module|class)[\"']")


def find_shared_fixture_modules(root: Path) -> frozenset[str]:
    """The test modules under root/tests (as node ids name them) with a shared fixture."""
    return frozenset(str(path.relative_to(root)) for path in sorted((root / "tests").rglob("test_*.py"))
                     if SHARED_FIXTURE.search(path.read_text(encoding="utf-8", errors="replace")))


def decide_work_unit(nodeid: str, shared_fixture_modules: frozenset[str] = frozenset()) -> str:
    """The work unit a test belongs to: its serial folder's name, its module where the module's
    tests share a fixture, or the test alone."""
    for folder, unit in SERIAL_FOLDERS.items():
        if nodeid.startswith(folder):
            return unit
    module = nodeid.split("::", 1)[0]
    return module if module in shared_fixture_modules else nodeid


@pytest.hookimpl(optionalhook=True)  # xdist's hook: unknown where xdist is absent
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """xdist's load-by-scope scheduler with decide_work_unit's units. Imported here: where the
    suite runs without xdist (inside the image, tests/images/test_in_image.py) it is absent."""
    if config.getoption("dist") not in ("load", "loadgroup"):
        return None  # another --dist asked for on purpose: xdist's own
    from xdist.scheduler import LoadScopeScheduling

    shared = find_shared_fixture_modules(Path(config.rootpath))

    class SerialFoldersScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return decide_work_unit(nodeid, shared)

    return SerialFoldersScheduling(config, log)


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected what they do
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The forked-rank tests run once a session: inside the image where that copy is selected
    and can run (root: tests/images/conftest.py), else here (decide_host_copies_left_out). Under
    workers, the slow tests first."""
    left_out = decide_host_copies_left_out([item.nodeid for item in items], os.geteuid() == 0)
    if left_out:
        config.hook.pytest_deselected(items=[item for item in items if item.nodeid in left_out])
        items[:] = [item for item in items if item.nodeid not in left_out]
    if os.environ.get("PYTEST_XDIST_WORKER"):  # every worker orders alike: xdist checks that
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def environ_as_the_test_found_it():
    """Each test leaves os.environ as it found it. torch writes it as it runs: inductor's
    cache_dir() sets TORCHINDUCTOR_CACHE_DIR, which an in-process Adam step reaches (seen in CI:
    tests/train's checkpoint writer ran first on a worker, and every job that worker started after
    it got that folder, which the entrypoint rightly keeps as the job's own)."""
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="session", autouse=True)
def worker_tmpdir():
    """Under workers, each worker's processes get a TMPDIR of their own. Open MPI makes its
    session folder there (ompi.<host>.<uid>), and two mpiruns on this machine making /tmp's at
    once race: `mkdir … File exists`, orte_init failed (seen beside the other workers). A short
    path: Open MPI's sockets live under it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        yield None
        return
    folder = tempfile.mkdtemp(prefix=f"byoc-{worker}-", dir="/tmp")
    before = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = folder
    try:
        yield folder
    finally:
        if before is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = before
        shutil.rmtree(folder, ignore_errors=True)

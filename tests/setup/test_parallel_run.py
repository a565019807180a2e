"""The suite's parallel run (issue 63): what its workers share is shared on purpose.

- Every test that runs SageMaker local mode lives in tests/localmode/, and one worker runs that
  folder's tests, in turn (tests/conftest.py).
- The CPU image is built once per run, however many workers ask for it at once
  (tests/support/docker.py's lock and record)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import decide_work_unit
from support.docker import decide_build_stamp

pytestmark = pytest.mark.quick
REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
# What starts a local-mode job: the harnesses' runners, and the README's main job (whose
# stand-in run, tests/setup/test_main_job_order.py, starts nothing).
LOCAL_MODE_CALLS = re.compile(r"\b(run_v2_job|run_v3_job|start_v3_hosts)\(|\"run-main-job\.sh\"\)")


def test_every_module_that_runs_local_mode_is_in_the_serial_folder():
    modules = [p for p in sorted(TESTS.rglob("test_*.py"))
               if LOCAL_MODE_CALLS.search(p.read_text()) and "STAND_IN" not in p.read_text()]
    assert len(modules) >= 6, modules  # the v2 and v3 jobs, failures, compile cache, image, main job
    outside = [str(p.relative_to(REPO)) for p in modules if not str(p).startswith(str(TESTS / "localmode"))]
    assert outside == []


def test_a_local_mode_or_multihost_test_is_one_unit_with_its_folder_and_any_other_test_is_its_own():
    assert decide_work_unit("tests/localmode/test_sdk_v2.py::test_a[x]") == "sagemaker-local"
    assert decide_work_unit("tests/localmode/test_v3_jobs.py::test_b") == "sagemaker-local"
    assert decide_work_unit("tests/multihost/test_jobs.py::test_c") == "emulated-hosts"
    assert decide_work_unit("tests/cluster/test_x.py::test_e") == "tests/cluster/test_x.py::test_e"
    assert decide_work_unit("tests/localmodel/test_x.py::test_d") == "tests/localmodel/test_x.py::test_d"


def _write_suite(root: Path) -> None:
    shutil.copy(TESTS / "conftest.py", root / "conftest.py")
    (root / "pytest.ini").write_text("[pytest]\naddopts = --import-mode=importlib\nmarkers =\n    slow: slow\n")
    for folder in ("tests/localmode", "tests/other"):
        (root / folder).mkdir(parents=True)
        for name in "abcd":
            (root / folder / f"test_{name}.py").write_text(textwrap.dedent(f"""\
                import os
                import pytest

                @pytest.mark.slow
                def test_slow_{name}():
                    with open({str(root / "log")!r}, "a") as log:
                        log.write(__file__.split("/")[-2] + " slow " + os.environ["PYTEST_XDIST_WORKER"] + "\\n")

                def test_{name}():
                    with open({str(root / "log")!r}, "a") as log:
                        log.write(__file__.split("/")[-2] + " quick " + os.environ["PYTEST_XDIST_WORKER"] + "\\n")
                """))


def test_one_worker_runs_the_serial_folder_and_the_slow_tests_start_first(tmp_path):
    _write_suite(tmp_path)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "3"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    lines = [line.split() for line in (tmp_path / "log").read_text().splitlines()]
    assert len(lines) == 16
    assert len({worker for folder, _, worker in lines if folder == "localmode"}) == 1
    # Each worker's own order: every slow test before any quick one.
    for worker in {w for _, _, w in lines}:
        kinds = [kind for _, kind, w in lines if w == worker]
        assert kinds == sorted(kinds, key=lambda k: k != "slow"), (worker, kinds)


def test_a_build_is_marked_for_its_run_only():
    assert decide_build_stamp("byoc-training:cpu-local", {}) is None  # no workers: no record
    stamp = decide_build_stamp("t:1", {"PYTEST_XDIST_TESTRUNUID": "abc"})
    assert stamp == "abc t:1" and stamp != decide_build_stamp("t:1", {"PYTEST_XDIST_TESTRUNUID": "abd"})
    assert decide_build_stamp("t:2", {"PYTEST_XDIST_TESTRUNUID": "abc"}) != stamp


BUILDER = """\
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from support import docker
docker.BUILD_STATE = Path(sys.argv[2])
def build(tag, env, timeout_s):
    with open(Path(sys.argv[2]) / "builds", "a") as log:
        log.write(tag + "\\n")
docker._build_image_now = build
docker.run_build_image(sys.argv[3])
"""


def _build_at_once(tmp_path: Path, run_id: str, tags: list[str]) -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTEST_XDIST_TESTRUNUID": run_id}
    procs = [subprocess.Popen([sys.executable, "-c", BUILDER, str(TESTS), str(tmp_path), tag], env=env)
             for tag in tags]
    assert [p.wait(timeout=120) for p in procs] == [0] * len(tags)


def test_workers_asking_at_once_build_each_image_once_a_run(tmp_path):
    _build_at_once(tmp_path, "run1", ["img:a"] * 4 + ["img:b"] * 2)
    assert sorted((tmp_path / "builds").read_text().split()) == ["img:a", "img:b"]
    # The next run builds again (Docker's cache makes that seconds when the tree is unchanged),
    # and its record holds its own builds only.
    _build_at_once(tmp_path, "run2", ["img:a"] * 3)
    assert sorted((tmp_path / "builds").read_text().split()) == ["img:a", "img:a", "img:b"]
    assert (tmp_path / "built-this-run").read_text().split("\n")[:-1] == ["run2 img:a"]


def test_each_worker_has_its_own_entrypoint_ports_and_a_run_without_workers_the_default():
    from support.ports import PORTS_PER_WORKER, decide_master_port

    assert decide_master_port({}) == decide_master_port({"PYTEST_XDIST_WORKER": "gw0"}) == 7777
    ports = [decide_master_port({"PYTEST_XDIST_WORKER": f"gw{n}"}) for n in range(8)]
    assert len(set(ports)) == 8 and all(b - a == PORTS_PER_WORKER >= 3 for a, b in zip(ports, ports[1:]))


def test_the_forked_rank_tests_run_once_a_session_in_the_image_where_that_copy_runs():
    from conftest import FORKED_RANK_TESTS, decide_host_copies_left_out, decide_in_image_param

    like, forked = FORKED_RANK_TESTS
    here = [f"{like}::test_a[x]", f"{like}::test_b", f"{forked}::test_c", "tests/entrypoint/rank/test_rank_exit.py::t"]
    in_image = [decide_in_image_param(like), decide_in_image_param(forked)]
    assert in_image[0].endswith("test_entrypoint_tests_pass_inside_the_image[test_forked_like_started]")
    assert decide_host_copies_left_out(here + in_image, True) == set(here[:3])
    assert decide_host_copies_left_out(here + in_image[:1], True) == set(here[:2])  # only that file's copy runs there
    assert decide_host_copies_left_out(here, True) == set()  # no in-image copy selected: every test here runs
    assert decide_host_copies_left_out(here + in_image, False) == set()  # not root: the image's copy cannot run


@pytest.mark.skipif(os.geteuid() != 0, reason="the image's copy runs as root only (tests/images/conftest.py): "
                    "as another user both copies are kept, which the test above checks")
def test_a_whole_session_leaves_the_forked_rank_copies_here_out_and_keeps_them_in_the_image():
    """The real hook (tests/conftest.py), on a collection of both folders."""
    from conftest import FORKED_RANK_TESTS

    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           *FORKED_RANK_TESTS, "tests/images/test_in_image.py"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    collected = [line for line in done.stdout.splitlines() if "::" in line]
    assert [line for line in collected if line.startswith(FORKED_RANK_TESTS)] == []
    assert "tests/images/test_in_image.py::test_entrypoint_tests_pass_inside_the_image[test_forked_ranks]" in collected
    alone = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                            FORKED_RANK_TESTS[1]], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert len([line for line in alone.stdout.splitlines() if line.startswith(FORKED_RANK_TESTS[1])]) >= 10


def test_a_module_whose_tests_share_a_fixture_is_one_unit(tmp_path):
    """Its module- or class-scoped fixture is made once, on the one worker that runs them all."""
    from conftest import find_shared_fixture_modules

    (tmp_path / "tests" / "a").mkdir(parents=True)
    (tmp_path / "tests" / "a" / "test_shared.py").write_text('@pytest.fixture(scope="module")\ndef big(): ...\n')
    (tmp_path / "tests" / "a" / "test_class.py").write_text("@pytest.fixture(autouse=True, scope='class')\n")
    (tmp_path / "tests" / "a" / "test_own.py").write_text("@pytest.fixture\ndef small(): ...\n# scope=\"module\"\n")
    shared = find_shared_fixture_modules(tmp_path)
    assert shared == {"tests/a/test_shared.py", "tests/a/test_class.py"}
    assert decide_work_unit("tests/a/test_shared.py::test_x[1]", shared) == "tests/a/test_shared.py"
    assert decide_work_unit("tests/a/test_own.py::test_y", shared) == "tests/a/test_own.py::test_y"
    assert decide_work_unit("tests/localmode/test_v3_jobs.py::t", shared | {"tests/localmode/test_v3_jobs.py"}) == \
        "sagemaker-local"
    assert "tests/train/test_resume.py" in find_shared_fixture_modules(REPO)  # its uninterrupted run


def test_two_workers_mpiruns_make_their_session_folders_apart(tmp_path):
    """Each worker's TMPDIR (tests/conftest.py worker_tmpdir), where Open MPI makes its session
    folder: two workers' mpiruns never race to make the same one (seen: `mkdir /tmp/ompi.<host>.0:
    File exists`, orte_init failed)."""
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = --import-mode=importlib\nmarkers =\n    slow: slow\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_tmp.py").write_text(textwrap.dedent(f"""\
        import os, subprocess, sys

        def test_one():
            seen = subprocess.run([sys.executable, "-c", "import tempfile; print(tempfile.gettempdir())"],
                                  capture_output=True, text=True, check=True).stdout.strip()
            with open({str(tmp_path / "log")!r}, "a") as log:
                log.write(os.environ["PYTEST_XDIST_WORKER"] + " " + seen + "\\n")

        def test_two():
            test_one()
        """))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "tests"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    seen = dict(line.split() for line in (tmp_path / "log").read_text().splitlines())
    assert sorted(seen) == ["gw0", "gw1"] and len(set(seen.values())) == 2, seen
    assert all(Path(folder).name.startswith(f"byoc-{worker}-") for worker, folder in seen.items()), seen
    assert not any(Path(folder).exists() for folder in seen.values())  # removed with the session


def test_hypothesis_judges_no_test_by_its_speed():
    """The suite's profile (tests/conftest.py): a test's own @settings keeps it where it says
    nothing of deadline or health checks (CI saw "Input generation is slow" under load)."""
    from hypothesis import HealthCheck, settings

    assert settings.default.deadline is None and HealthCheck.too_slow in settings.default.suppress_health_check
    own = settings(max_examples=5)
    assert own.deadline is None and HealthCheck.too_slow in own.suppress_health_check


def test_what_one_test_writes_to_os_environ_no_later_test_inherits(tmp_path):
    """tests/conftest.py's environ_as_the_test_found_it: the second test, in the same process,
    finds neither the variable the first one set nor lost the one it removed."""
    (tmp_path / "test_order.py").write_text(textwrap.dedent("""\
        import os

        def test_first_writes():
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = "/tmp/torchinductor_root"
            del os.environ["BYOC_KEPT"]

        def test_second_reads():
            assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ and os.environ["BYOC_KEPT"] == "yes"
        """))
    env = {**os.environ, "PYTHONPATH": str(REPO / "tests"), "BYOC_KEPT": "yes"}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
                           "-n", "0", "test_order.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and "2 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]


def test_two_image_builds_of_one_checkout_take_docker_build_local_in_turn(tmp_path):
    """scripts/lib/build-local.sh: a build holds docker/build-local/ from the moment it writes it
    until it ends, so a second build of the same checkout waits (seen: the main job's build and
    a stage build, side by side in a fresh root, wrote one pip.conf together, `find-links`
    twice, and pip refused it). Here the first 'build' keeps the folder until the second has
    started and asked for it, and finds it as it wrote it; the second writes only after."""
    (tmp_path / "scripts" / "lib").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "lib" / "build-local.sh", tmp_path / "scripts" / "lib" / "build-local.sh")
    (tmp_path / "docker" / "build-local").mkdir(parents=True)
    (tmp_path / "wheels-here").mkdir()
    (tmp_path / "wheels-here" / "torch-2.13.0+cpu-cp311-none-any.whl").write_bytes(b"wheel")
    marks = tmp_path / "marks"
    marks.mkdir()
    build = textwrap.dedent(f"""\
        set -euo pipefail
        source {tmp_path}/scripts/lib/build-local.sh
        touch {marks}/$1-asks
        write_build_local 'torch-*.whl'
        touch {marks}/$1-wrote
        if [ "$1" = first ]; then
            while [ ! -e {marks}/second-asks ]; do sleep 0.01; done
            sleep 0.5  # the second build's turn, were the folder not held
            [ ! -e {marks}/second-wrote ] || exit 3
        fi
        cat {tmp_path}/docker/build-local/pip.conf
        """)
    env = dict(os.environ, PIP_FIND_LINKS=str(tmp_path / "wheels-here"), PIP_CERT="")
    first = subprocess.Popen(["bash", "-c", build, "build", "first"], env=env, stdout=subprocess.PIPE, text=True)
    while not (marks / "first-wrote").exists():
        assert first.poll() is None, first.communicate()
        time.sleep(0.01)
    second = subprocess.Popen(["bash", "-c", build, "build", "second"], env=env, stdout=subprocess.PIPE, text=True)
    out_first, _ = first.communicate(timeout=300)
    out_second, _ = second.communicate(timeout=300)
    assert (first.returncode, second.returncode) == (0, 0), (out_first, out_second)
    for out in (out_first, out_second):
        assert out.count("find-links = /opt/byoc-build-local/wheels") == 1, out
    assert (marks / "second-wrote").stat().st_mtime >= (marks / "first-wrote").stat().st_mtime

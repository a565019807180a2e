"""Source archives (`sourcedir.tar.gz`) extract safely on every Python the images ship.

These tests also run inside the built image with its own Python (tests/images/
test_in_image.py): Debian's 3.11.2 has no `extractall(filter=...)`."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entrypoint.job.archive import UnsafeArchiveError, decide_unsafe_member, extract_tar
from support.jobtree import failure_text, run_entrypoint, write_tree

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick


def _member(name: str, kind=tarfile.REGTYPE, linkname: str = "", mode: int = 0o644) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.mode = mode
    return info


def _archive(path: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            info.size = len(data) if info.isfile() else 0
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return path


@pytest.mark.parametrize(
    "member,links,reason",
    [
        (_member("train.py"), (), None),
        (_member("pkg/sub/mod.py"), (), None),
        (_member("./pkg", tarfile.DIRTYPE), (), None),
        (_member("pkg/current", tarfile.SYMTYPE, "../data/v1"), (), None),
        (_member("hard", tarfile.LNKTYPE, "pkg/mod.py"), (), None),
        (_member("/etc/cron.d/x"), (), "an absolute path"),
        (_member("../escape.py"), (), "a '..' component"),
        (_member("pkg/../../escape.py"), (), "a '..' component"),
        (_member("out", tarfile.SYMTYPE, "/etc"), (), "a link to the absolute path /etc"),
        (_member("pkg/out", tarfile.SYMTYPE, "../../x"), (), "a link out of the archive (../../x)"),
        (_member("hard", tarfile.LNKTYPE, "../x"), (), "a link out of the archive (../x)"),
        (_member("out/passwd"), ("out",), "a path through the link out"),
        (_member("dev", tarfile.CHRTYPE), (), "a special file (device, FIFO or other)"),
        (_member("fifo", tarfile.FIFOTYPE), (), "a special file (device, FIFO or other)"),
        (_member("./", tarfile.SYMTYPE, "a"), (), "no name (it would replace the destination itself)"),
    ],
)
def test_member_decisions(member, links, reason):
    assert decide_unsafe_member(member, frozenset(links)) == reason


_segment = st.sampled_from(["a", "b", "..", ".", ""])


@settings(max_examples=300, deadline=None)
@given(st.lists(_segment, min_size=1, max_size=5), st.lists(_segment, min_size=1, max_size=5), st.booleans())
def test_an_accepted_link_never_points_out_of_the_destination(name_parts, target_parts, symbolic):
    import posixpath

    name, target = "/".join(name_parts), "/".join(target_parts)
    member = _member(name, tarfile.SYMTYPE if symbolic else tarfile.LNKTYPE, target)
    if decide_unsafe_member(member, frozenset()) is None:
        base = posixpath.dirname(posixpath.normpath("/dest/" + name)) if symbolic else "/dest"
        resolved = posixpath.normpath(posixpath.join(base, target))
        assert resolved == "/dest" or resolved.startswith("/dest/")


def test_extracts_files_folders_and_inner_links_with_safe_modes(tmp_path):
    archive = _archive(tmp_path / "src.tar.gz", [
        (_member("pkg", tarfile.DIRTYPE, mode=0o777), b""),
        (_member("pkg/mod.py", mode=0o6777), b"X = 1\n"),
        (_member("link.py", tarfile.SYMTYPE, "pkg/mod.py"), b""),
    ])
    dest = tmp_path / "code"
    dest.mkdir()
    extract_tar(str(archive), str(dest))
    assert (dest / "pkg/mod.py").read_text() == "X = 1\n"
    assert (dest / "link.py").read_text() == "X = 1\n"
    assert (dest / "pkg/mod.py").stat().st_mode & 0o7777 == 0o755  # no setuid/setgid/sticky, no g/o write
    assert (dest / "pkg").stat().st_mode & 0o777 == 0o755


def test_a_destination_not_made_yet_is_made_as_tarfile_makes_it(tmp_path):
    """The room is measured on the disk it will be made on (test_main_job extracts model.tar.gz
    into a new folder: statvfs of the folder itself raised FileNotFoundError)."""
    archive = _archive(tmp_path / "model.tar.gz", [(_member("model.pt"), b"weights")])
    extract_tar(str(archive), str(tmp_path / "new" / "model"))
    assert (tmp_path / "new" / "model" / "model.pt").read_bytes() == b"weights"


@pytest.mark.parametrize("bad", [
    [(_member("../evil.py"), b"x")],
    [(_member("out", tarfile.SYMTYPE, "/tmp"), b""), (_member("out/evil.py"), b"x")],
    [(_member("dev", tarfile.BLKTYPE), b"")],
])
def test_an_unsafe_archive_writes_nothing(tmp_path, bad):
    archive = _archive(tmp_path / "src.tar.gz", [(_member("ok.py"), b"pass\n"), *bad])
    dest = tmp_path / "code"
    dest.mkdir()
    with pytest.raises(UnsafeArchiveError, match="is refused"):
        extract_tar(str(archive), str(dest))
    assert list(dest.iterdir()) == []


def test_an_unsafe_submit_directory_ends_the_job_with_one_clear_line(tmp_path):
    archive = _archive(tmp_path / "sourcedir.tar.gz", [
        (_member("train.py"), b"print('never')\n"), (_member("../../etc/evil"), b"x")])
    root = write_tree(tmp_path / "ml", program="train.py",
                      hyperparameters={"sagemaker_submit_directory": str(archive)})
    done = run_entrypoint(root)
    assert done.returncode == 2, done.stderr
    reason = failure_text(root)
    assert reason.startswith("The training job definition is invalid: could not fetch "
                             f"sagemaker_submit_directory {archive}: ")
    assert "member '../../etc/evil' is refused: a '..' component" in reason
    assert "Traceback" not in reason
    assert not (root / "code/train.py").exists()


def test_nothing_else_in_the_repository_extracts_tar_archives_itself():
    """tarfile's extract()/extractall() with filter= fails on Debian 12's Python 3.11.2 (a fresh
    machine's, and the CPU image's), and without it is unsafe: everything extracts through
    entrypoint.job.archive.extract_tar (the tests' harnesses too)."""
    import re
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    calls = re.compile(r"\.extractall\(|\.extract\(")
    offenders = []
    for folder in ("entrypoint", "train", "localcluster", "tests", "benchmarks", "scripts", "docker"):
        for path in (repo / folder).rglob("*.py"):
            if path == repo / "entrypoint" / "job" / "archive.py":
                continue
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if calls.search(line) and not line.lstrip().startswith("#") and "`" not in line:  # prose
                    offenders.append(f"{path.relative_to(repo)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)

"""The torch.compile cache's folder as the last attempt (or anyone) left it (run/compile_cache.py,
docs/compile-cache.md "Safety"): nothing is written, moved or removed through a symbolic link at
any level (the cache folder itself, a folder in it, an entry's name, the staging folder, the
archives' folder, the archive's temporary name), and a folder torch cannot write (under a file,
read-only, a link) never reaches the ranks: they get a private folder. A full folder during a
restore is said to be full. Through CacheKeeper (the code path the entrypoint runs) and through
the real entrypoint."""

from __future__ import annotations

import gzip
import io
import json
import os
import socket
import subprocess
import tarfile
import tempfile

import pytest

from entrypoint.decide.compile_cache import CompileCache, decide_folder_env
from entrypoint.run import compile_cache as keep
from support.jobtree import run_entrypoint, write_tree

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")

# What torch does with the folders it is given: make them, write in them. Each rank records
# what it got, and whether the restored entry is there.
USE_FOLDER = r"""
import json, os
names = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
got = [os.environ.get(n) for n in names]
rank = os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("RANK") or "0"
for folder in got:
    if folder:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"written-by-{rank}"), "w") as f:
            f.write("x")
restored = bool(got[0]) and os.path.isfile(os.path.join(got[0], "fxgraph", "ab", "entry"))
json.dump({"env": got, "restored": restored}, open(os.path.join(os.environ["SM_MODEL_DIR"], f"env-{rank}.json"), "w"))
"""


def write_archive_bytes(path, members: dict[str, bytes], stamp: dict | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in {keep.STAMP_NAME: json.dumps(stamp or keep.probe_stamp()).encode(), **members}.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1_000_000
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(gzip.compress(buffer.getvalue()))


def snapshot(folder) -> dict:
    """Every path under folder (links as links) and what each file holds."""
    found = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, folder)
            found[rel] = ("link", os.readlink(path)) if os.path.islink(path) else \
                ("dir",) if os.path.isdir(path) else ("file", open(path, "rb").read())
    return found


def make_cache(tmp_path) -> CompileCache:
    ckpt = tmp_path / "ckpt" / "byoc-compile-cache"
    return CompileCache(str(tmp_path / "local"), str(ckpt), str(ckpt / "host-0.tar.gz"), 1 << 20, 0.0)


def outside(tmp_path):
    """A folder outside the cache with a file of its own: it must stay exactly as it is."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "mine").write_bytes(b"mine")
    return folder


MEMBERS = {"fxgraph/ab/entry": b"graph", "fxgraph/ab/x": b"kernel", "other/y": b"other"}
STAGING = f"{keep.STAGING_PREFIX}{os.uname().nodename}-{os.getpid()}"
PROBE = f"{keep.PROBE_PREFIX}{os.uname().nodename}-{os.getpid()}"


def place_link(local, out, level: str) -> None:
    """A symbolic link at one level of the cache folder, to the outside folder (or its file)."""
    local.mkdir(exist_ok=True)
    where = {"a folder in it": "fxgraph", "a folder deeper": "fxgraph/ab", "an entry's name": "fxgraph/ab/x",
             "an entry's name, dangling": "fxgraph/ab/x", "the staging folder": STAGING,
             "the write check's file": PROBE}[level]
    (local / where).parent.mkdir(parents=True, exist_ok=True)
    target = out / "mine" if level in ("an entry's name", "the write check's file") else \
        out / "new" if level == "an entry's name, dangling" else out
    os.symlink(target, local / where)


@pytest.mark.parametrize("level", ["a folder in it", "a folder deeper", "an entry's name", "an entry's name, dangling",
                                  "the staging folder", "the write check's file"])
def test_a_restore_never_writes_through_a_link_in_the_cache_folder(tmp_path, level):
    out = outside(tmp_path)
    before = snapshot(out)
    cache = make_cache(tmp_path)
    write_archive_bytes(tmp_path / "ckpt/byoc-compile-cache/host-0.tar.gz", MEMBERS)
    place_link(tmp_path / "local", out, level)
    k = keep.CacheKeeper(cache)
    k.start()
    k.end(5)
    assert snapshot(out) == before, k.lines
    assert k.folder == cache.folder  # the folder itself is fine: the ranks get it
    assert (tmp_path / "local/other/y").read_bytes() == b"other"  # what no link is in the way of is restored
    if level in ("a folder in it", "a folder deeper", "an entry's name", "an entry's name, dangling"):
        assert os.path.islink(tmp_path / "local" / {"a folder in it": "fxgraph", "a folder deeper": "fxgraph/ab"}.get(
            level, "fxgraph/ab/x"))  # left as it is
    if level in ("a folder in it", "a folder deeper"):
        assert "2 of them not put in place: a symbolic link or a file in the way" in k.lines[0]
        with tarfile.open(cache.archive) as tar:  # nothing read through the link into the archive
            assert tar.getnames() == [keep.STAMP_NAME, "other/y"]
    if level == "the staging folder":
        assert not os.path.lexists(tmp_path / "local" / STAGING)
    assert any("restored 3 file(s)" in line for line in k.lines)


def test_the_cache_folder_itself_a_link_is_not_used_the_ranks_get_a_private_folder(tmp_path, monkeypatch):
    out = outside(tmp_path)
    before = snapshot(out)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    cache = make_cache(tmp_path)
    write_archive_bytes(tmp_path / "ckpt/byoc-compile-cache/host-0.tar.gz", MEMBERS)
    os.symlink(out, tmp_path / "local")
    k = keep.CacheKeeper(cache)
    k.start()
    private = k.folder
    assert private.startswith(str(tmp_path / keep.PRIVATE_PREFIX)) and os.path.isdir(private)
    assert f"{tmp_path / 'local'} is a symbolic link: the ranks use a private folder instead" in k.lines[0]
    assert sorted(e[0] for e in keep.load_entries(private)) == ["fxgraph/ab/entry", "fxgraph/ab/x", "other/y"]
    k.end(5)
    assert snapshot(out) == before and os.readlink(tmp_path / "local") == str(out)
    assert not os.path.exists(private)  # removed at the end
    assert run_eviction_through_a_link_removes_nothing(tmp_path, out)


def run_eviction_through_a_link_removes_nothing(tmp_path, out) -> bool:
    """The bound evicts the oldest entries: never a file behind a link (here the cache folder
    is a link, then a folder in it is)."""
    before = snapshot(out)
    keep.run_eviction(str(tmp_path / "local"), [("mine", 4, 0.0)], 0)
    real = tmp_path / "real"
    real.mkdir()
    os.symlink(out, real / "ab")
    keep.run_eviction(str(real), [("ab/mine", 4, 0.0)], 0)
    return snapshot(out) == before


@pytest.mark.parametrize("level", ["the archives' folder", "the archive's temporary name", "the archive's name"])
def test_writing_the_archive_never_writes_through_a_link(tmp_path, level):
    out = outside(tmp_path)
    before = snapshot(out)
    cache = make_cache(tmp_path)
    (tmp_path / "local/fxgraph/ab").mkdir(parents=True)
    (tmp_path / "local/fxgraph/ab/entry").write_bytes(b"graph")
    archives = tmp_path / "ckpt/byoc-compile-cache"
    if level == "the archives' folder":
        archives.parent.mkdir()
        os.symlink(out, archives)
    else:
        archives.mkdir(parents=True)
        name = f".host-0.tar.gz.{os.getpid()}.tmp" if level == "the archive's temporary name" else "host-0.tar.gz"
        os.symlink(out / "mine", archives / name)
    k = keep.CacheKeeper(cache)
    k.start()
    k.end(5)
    assert snapshot(out) == before, k.lines
    if level == "the archives' folder":
        assert "not written" in k.lines[-1] and os.path.islink(archives)
    else:
        with tarfile.open(cache.archive) as tar:
            assert tar.getnames() == [keep.STAMP_NAME, "fxgraph/ab/entry"]
        assert not os.path.islink(cache.archive) and os.listdir(archives) == ["host-0.tar.gz"]


@pytest.mark.parametrize("what", ["a file", "under a file", "a link to a file"])
def test_a_folder_torch_could_not_write_is_replaced_by_a_private_one(tmp_path, monkeypatch, what):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / "file").write_bytes(b"x")
    folder = {"a file": tmp_path / "file", "under a file": tmp_path / "file" / "cache",
              "a link to a file": tmp_path / "link"}[what]
    if what == "a link to a file":
        os.symlink(tmp_path / "file", folder)
    k = keep.CacheKeeper(CompileCache(str(folder), None, None, 1 << 20, 0.0))
    k.start()
    assert k.folder != str(folder) and os.path.isdir(k.folder) and k.cache.folder == k.folder
    assert "the ranks use a private folder instead" in k.lines[0]
    k.close()
    assert not os.path.exists(k.folder) and (tmp_path / "file").read_bytes() == b"x"


def test_without_any_usable_folder_the_ranks_get_torchs_default(tmp_path, monkeypatch):
    (tmp_path / "file").write_bytes(b"x")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "file" / "tmp"))  # no private folder either
    k = keep.CacheKeeper(CompileCache(str(tmp_path / "file" / "cache"), None, None, 1 << 20, 0.0))
    k.start()
    assert k.folder is None and "the ranks get torch's own default folder, nothing is kept" in k.lines[0]
    k.end(5)  # nothing to walk, nothing to write
    assert len(k.lines) == 1


def test_the_environment_follows_the_folder_and_leaves_the_jobs_own_values():
    ours = {"TORCHINDUCTOR_CACHE_DIR": "/c", "TRITON_CACHE_DIR": "/c/triton", "OTHER": "1"}
    assert decide_folder_env(ours, "/c", "/tmp/p") == {"TORCHINDUCTOR_CACHE_DIR": "/tmp/p",
                                                       "TRITON_CACHE_DIR": "/tmp/p/triton", "OTHER": "1"}
    assert decide_folder_env(ours, "/c", None) == {"OTHER": "1"}
    own_triton = {"TORCHINDUCTOR_CACHE_DIR": "/c", "TRITON_CACHE_DIR": "/fsx/triton"}
    assert decide_folder_env(own_triton, "/c", None) == {"TRITON_CACHE_DIR": "/fsx/triton"}


# --- through the entrypoint ---------------------------------------------------------------------------


def run_job(tmp_path, folder, ckpt: bool = False, members=MEMBERS, **kwargs):
    root = write_tree(tmp_path / "ml", script=USE_FOLDER, **kwargs)
    if ckpt:
        (root / "input/config/checkpointconfig.json").write_text(json.dumps({"LocalPath": str(tmp_path / "ckpt"),
                                                                             "S3Path": "s3://bucket/ckpt"}))
        write_archive_bytes(tmp_path / "ckpt/byoc-compile-cache/host-0.tar.gz", members)
    (tmp_path / "tmp").mkdir(exist_ok=True)
    done = run_entrypoint(root, timeout=300, BYOC_COMPILE_CACHE_DIR=str(folder), BYOC_RUNTIME_DIR=str(tmp_path / "run"),
                          BYOC_REPORT="0", TMPDIR=str(tmp_path / "tmp"))
    return root, done


def got(root, rank: int = 0) -> dict:
    return json.loads((root / f"model/env-{rank}.json").read_text())


def test_the_issues_case_an_archive_is_not_written_through_a_folder_linked_outside(tmp_path):
    """The host-local folder as an earlier attempt left it: fxgraph a link to a folder outside.
    A well-stamped archive's fxgraph/ab/x goes nowhere; the job runs."""
    out = outside(tmp_path)
    before = snapshot(out)
    (tmp_path / "local").mkdir()
    os.symlink(out, tmp_path / "local" / "fxgraph")
    root, done = run_job(tmp_path, tmp_path / "local", ckpt=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert snapshot(out) == before
    assert "2 of them not put in place: a symbolic link or a file in the way" in done.stderr
    assert got(root)["env"][0] == str(tmp_path / "local") and (tmp_path / "local/other/y").is_file()


@pytest.mark.parametrize("what", ["under a regular file", "a link to a folder outside"])
def test_an_unusable_folder_never_reaches_the_ranks(tmp_path, what):
    out = outside(tmp_path)
    before = snapshot(out)
    (tmp_path / "file").write_bytes(b"x")
    folder = tmp_path / "file" / "cache" if what == "under a regular file" else tmp_path / "local"
    if what != "under a regular file":
        os.symlink(out, folder)
    root, done = run_job(tmp_path, folder, ckpt=True)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = got(root)
    private = seen["env"][0]
    assert private.startswith(str(tmp_path / "tmp" / keep.PRIVATE_PREFIX)) and seen["env"][1] == private + "/triton"
    assert seen["restored"]  # the archive, restored into the private folder
    assert f"the ranks use a private folder instead, {private}, removed at the end" in done.stderr
    assert not os.path.exists(private) and snapshot(out) == before
    with tarfile.open(tmp_path / "ckpt/byoc-compile-cache/host-0.tar.gz") as tar:  # written from it
        assert "written-by-0" in tar.getnames()


def test_an_mpi_jobs_ranks_get_the_private_folder_too(tmp_path):
    """Under mpirun a rank takes this host's values from the host's environment file
    (roles/mpi.write_host_env), written from the role's plan: the private folder, not the plan's."""
    host = socket.gethostname()  # mpirun starts the ranks here without SSH
    (tmp_path / "file").write_bytes(b"x")
    root, done = run_job(tmp_path, tmp_path / "file" / "cache", hosts=(host,), current_host=host,
                         hyperparameters={"sagemaker_mpi_enabled": True,
                                          "sagemaker_mpi_num_of_processes_per_host": 2})
    assert done.returncode == 0, done.stderr[-3000:]
    first, second = got(root, 0), got(root, 1)
    assert first["env"] == second["env"] and first["env"][0].startswith(str(tmp_path / "tmp" / keep.PRIVATE_PREFIX))


@pytest.fixture
def tmpfs(tmp_path):
    mounted = []

    def mount(name: str, options: str):
        folder = tmp_path / name
        folder.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], check=True)
        mounted.append(folder)
        return folder

    yield mount
    for folder in mounted:
        subprocess.run(["umount", "-l", str(folder)], check=True)


@needs_root
@pytest.mark.parametrize("existing", [True, False])
def test_a_read_only_folder_never_reaches_the_ranks(tmp_path, tmpfs, existing):
    mount = tmpfs("ro", "size=1m")
    if existing:
        (mount / "cache").mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
    root, done = run_job(tmp_path, mount / "cache", ckpt=True)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = got(root)
    assert seen["env"][0].startswith(str(tmp_path / "tmp" / keep.PRIVATE_PREFIX)) and seen["restored"]
    assert f"{mount / 'cache'} cannot be {'written' if existing else 'made'} (Read-only file system)" in done.stderr


@needs_root
def test_a_full_folder_during_a_restore_is_said_to_be_full_not_the_archive_corrupt(tmp_path, tmpfs):
    mount = tmpfs("small", "size=64k")
    root, done = run_job(tmp_path, mount, ckpt=True, members={"fxgraph/ab/entry": os.urandom(300_000)})
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stderr.splitlines() if "host-0.tar.gz not" in line)
    assert "could not be written (No space left on device)" in line and "corrupt" not in line
    assert not [n for n in os.listdir(mount) if n.startswith(keep.STAGING_PREFIX)]
    assert not got(root)["restored"]

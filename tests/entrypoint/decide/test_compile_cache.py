"""torch.compile's caches kept between jobs and restarts (decide/compile_cache.py,
run/compile_cache.py, docs/compile-cache.md). Warm or cold is read from Inductor's own counters
(torch._dynamo.utils.counters["inductor"]["fxgraph_cache_hit"/"_miss"]), which each rank of a
tiny compiled model writes into the model folder; never from wall time."""

from __future__ import annotations

import gzip
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import time

import pytest

from entrypoint.decide.compile_cache import LOCAL_FOLDER, CompileCache, decide_compile_cache
from entrypoint.decide.settings import parse_launch_settings
from entrypoint.errors import JobDefinitionError
from entrypoint.job.config import CheckpointConfig
from entrypoint.run import compile_cache as keep
from support.jobs import CPU, make_job, plan_for
from support.jobtree import PYTHON, run_entrypoint, write_tree

CKPT = CheckpointConfig(local_path="/opt/ml/checkpoints", s3_uri="s3://bucket/run-1/checkpoints")
TORCH = {"sagemaker_torch_distributed_enabled": True}
MPI_2 = {"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2}

# A tiny model: compiling it is a few seconds of Inductor's C++ (the time is mostly torch's own
# start-up). Each rank writes its counters as counters-<attempt>-<rank>.json.
COMPILED = r"""
import json, os, sys
import torch
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
loss = torch.compile(model)(torch.ones(4, 8)).sum()
loss.backward()
from torch._dynamo.utils import counters
model_dir = os.environ["SM_MODEL_DIR"]
rank = os.environ.get("RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or "0"
attempt = str(len([n for n in os.listdir(model_dir) if n.startswith(f"started-{rank}-")]))
open(os.path.join(model_dir, f"started-{rank}-{attempt}"), "w").close()
with open(os.path.join(model_dir, f"counters-{attempt}-{rank}.json"), "w") as f:
    json.dump({"inductor": dict(counters["inductor"]), "dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR")}, f)
if os.environ.get("FAIL_FIRST") and attempt == "0" and rank == "0":
    sys.exit(3)
"""

SHOW_ENV = ("import json, os\nnames = ('TORCHINDUCTOR_CACHE_DIR', 'TRITON_CACHE_DIR')\n"
            "json.dump([os.environ.get(n) for n in names], open(os.environ['SM_MODEL_DIR'] + '/env.json', 'w'))\n")


def counters(root, attempt: int = 0, rank: int = 0) -> dict:
    return json.loads((root / "model" / f"counters-{attempt}-{rank}.json").read_text())


def hits_and_misses(found: dict) -> tuple[int, int]:
    inductor = found["inductor"]
    return inductor.get("fxgraph_cache_hit", 0), inductor.get("fxgraph_cache_miss", 0)


def with_checkpoint(root, local_path) -> None:
    (root / "input/config/checkpointconfig.json").write_text(json.dumps({"LocalPath": str(local_path),
                                                                         "S3Path": "s3://bucket/ckpt"}))


def job_tree(tmp_path, name: str, ckpt=None, **kwargs):
    root = write_tree(tmp_path / name, script=COMPILED, **kwargs)
    if ckpt is not None:
        with_checkpoint(root, ckpt)
    return root


def run_job(root, local_folder, timeout: float = 600, **env):
    done = run_entrypoint(root, timeout=timeout, BYOC_COMPILE_CACHE_DIR=str(local_folder),
                          BYOC_RUNTIME_DIR=str(root.parent / f"run-{root.name}"), BYOC_REPORT="0", **env)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


# --- the plan (pure) ---------------------------------------------------------------------------

def cache_notes(plan) -> list[str]:
    return [n for n in plan.notes if n.startswith("torch.compile cache")]


def test_with_a_checkpoint_folder_each_host_keeps_one_archive_there_and_the_plan_says_so():
    plan = plan_for(make_job(hosts=("algo-1", "algo-2"), current="algo-2", hps=TORCH, checkpoint=CKPT), CPU)
    env = plan.env_dict
    assert (env["TORCHINDUCTOR_CACHE_DIR"], env["TRITON_CACHE_DIR"]) == (LOCAL_FOLDER, LOCAL_FOLDER + "/triton")
    assert plan.compile_cache == CompileCache(LOCAL_FOLDER, "/opt/ml/checkpoints/byoc-compile-cache",
                                              "/opt/ml/checkpoints/byoc-compile-cache/host-1.tar.gz", 1024 << 20, 600.0)
    [note] = cache_notes(plan)
    assert "host-1.tar.gz in the checkpoint folder" in note and "at most 1024 MB" in note


def test_without_a_checkpoint_folder_the_cache_is_host_local_and_no_archive_is_kept():
    plan = plan_for(make_job(environ={"BYOC_COMPILE_CACHE_DIR": "/scratch/cc"}), CPU)
    assert plan.compile_cache == CompileCache("/scratch/cc", None, None, 1024 << 20, 0.0)
    assert plan.env_dict["TORCHINDUCTOR_CACHE_DIR"] == "/scratch/cc"
    [note] = cache_notes(plan)
    assert "on this host only (restarts in place reuse it)" in note


def test_the_jobs_own_inductor_folder_is_never_overridden_nor_archived():
    plan = plan_for(make_job(checkpoint=CKPT, environ={"TORCHINDUCTOR_CACHE_DIR": "/fsx/inductor"}), CPU)
    assert plan.compile_cache is None
    assert "TORCHINDUCTOR_CACHE_DIR" not in plan.env_dict and "TRITON_CACHE_DIR" not in plan.env_dict
    assert cache_notes(plan) == ["torch.compile cache: the job's own, TORCHINDUCTOR_CACHE_DIR=/fsx/inductor (not "
                                 "archived by the launcher)"]


def test_the_jobs_own_triton_folder_is_kept_and_named():
    plan = plan_for(make_job(checkpoint=CKPT, environ={"TRITON_CACHE_DIR": "/fsx/triton"}), CPU)
    assert "TRITON_CACHE_DIR" not in plan.env_dict and plan.compile_cache is not None
    assert "TRITON_CACHE_DIR=/fsx/triton (the job's own)" in cache_notes(plan)[0]


def test_inductors_precompiled_header_is_off_unless_the_job_sets_it():
    """torch builds the header (150 MB) outside the kept folder in every new container, even
    when every kernel is a cache hit (docs/compile-cache.md)."""
    for checkpoint in (CKPT, None):
        plan = plan_for(make_job(checkpoint=checkpoint), CPU)
        assert plan.env_dict["TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS"] == "0"
        assert "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS=0: no precompiled header" in cache_notes(plan)[0]
    own = plan_for(make_job(checkpoint=CKPT, environ={"TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS": "1"}), CPU)
    assert "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS" not in own.env_dict
    assert "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS=1 (the job's own)" in cache_notes(own)[0]
    off = plan_for(make_job(checkpoint=CKPT, environ={"BYOC_COMPILE_CACHE": "0"}), CPU)
    assert "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS" not in off.env_dict


def test_off_means_no_setting_and_no_keeping():
    plan = plan_for(make_job(checkpoint=CKPT, environ={"BYOC_COMPILE_CACHE": "0"}), CPU)
    assert plan.compile_cache is None and "TORCHINDUCTOR_CACHE_DIR" not in plan.env_dict
    assert "off (BYOC_COMPILE_CACHE=0)" in cache_notes(plan)[0]


@pytest.mark.parametrize("name, value", [("BYOC_COMPILE_CACHE_MAX_MB", "0"), ("BYOC_COMPILE_CACHE_MAX_MB", "nan"),
                                         ("BYOC_COMPILE_CACHE_MAX_MB", "1.5"), ("BYOC_COMPILE_CACHE", "maybe"),
                                         ("BYOC_COMPILE_CACHE_SAVE_EVERY_S", "-1"),
                                         ("BYOC_COMPILE_CACHE_SAVE_EVERY_S", "inf\ud800")])
def test_a_bad_setting_is_a_bad_job_definition(name, value):
    with pytest.raises(JobDefinitionError, match=name):
        parse_launch_settings({name: value})


def test_the_settings_edges():
    assert parse_launch_settings({"BYOC_COMPILE_CACHE_MAX_MB": "1"}).compile_cache_max_mb == 1
    assert parse_launch_settings({"BYOC_COMPILE_CACHE_SAVE_EVERY_S": "0"}).compile_cache_save_every_s == 0.0
    cache, _, _ = decide_compile_cache({}, CKPT, 0, True, 3, 0.0)
    assert cache.max_bytes == 3 << 20 and "every" not in decide_compile_cache({}, CKPT, 0, True, 3, 0.0)[2][0]


# --- the folder, the bound and the archive (real files, no torch) ------------------------------

def fill(folder, sizes: dict[str, int], start: float = 1_000_000.0) -> None:
    """Files of the given sizes, the first the oldest (a second apart)."""
    for i, (name, size) in enumerate(sizes.items()):
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * size)
        os.utime(path, (start + i, start + i))


@pytest.mark.parametrize("bound, kept", [(299, ["c/3.so", "b/2.so"]), (300, ["c/3.so", "b/2.so", "a/1.so"]),
                                         (301, ["c/3.so", "b/2.so", "a/1.so"]), (99, []), (100, ["c/3.so"])])
def test_the_bound_evicts_the_oldest_first_just_under_at_and_over_it(tmp_path, bound, kept):
    fill(tmp_path, {"a/1.so": 100, "b/2.so": 100, "c/3.so": 100})
    survivors, removed = keep.run_eviction(str(tmp_path), keep.load_entries(str(tmp_path)), bound)
    assert len(removed) == 3 - len(kept) and [e[0] for e in sorted(survivors, key=lambda e: -e[2])] == kept
    assert [e[0] for e in sorted(keep.load_entries(str(tmp_path)), key=lambda e: -e[2])] == kept


def test_temporary_files_torch_is_writing_are_not_entries(tmp_path):
    fill(tmp_path, {"fxgraph/ab/entry": 10, "fxgraph/ab/.123.456.tmp": 10, "x.tmp": 10, ".byoc-restore-1/y": 10,
                    "triton/0/tmp.pid_12_34/k.so": 10})
    assert [e[0] for e in keep.load_entries(str(tmp_path))] == ["fxgraph/ab/entry"]


def make_cache(tmp_path, host: int = 0, max_bytes: int = 1 << 20) -> CompileCache:
    ckpt = tmp_path / "ckpt" / "byoc-compile-cache"
    return CompileCache(str(tmp_path / f"local-{host}"), str(ckpt), str(ckpt / f"host-{host}.tar.gz"), max_bytes, 0.0)


def keeper(cache) -> keep.CacheKeeper:
    return keep.CacheKeeper(cache)


def test_an_archive_round_trip_restores_the_entries_with_their_ages(tmp_path):
    cache = make_cache(tmp_path)
    fill(tmp_path / "local-0", {"fxgraph/ab/entry": 10, "tj/ctj.main.so": 20, "locks/ctj.lock": 0})
    first = keeper(cache)
    first.start()
    first.end(5)
    assert any("host-0.tar.gz written (the end): 2 file(s)" in line for line in first.lines)
    again = make_cache(tmp_path, host=0)._replace(folder=str(tmp_path / "fresh"))
    second = keeper(again)
    second.start()
    second.end(5)
    assert sorted(e[0] for e in keep.load_entries(again.folder)) == ["fxgraph/ab/entry", "tj/ctj.main.so"]
    assert os.path.getmtime(tmp_path / "fresh/tj/ctj.main.so") == 1_000_001
    assert "restored 2 file(s)" in second.lines[0]


def write_archive_bytes(path, members: dict[str, bytes], stamp: dict | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        items = ({keep.STAMP_NAME: json.dumps(stamp).encode()} if stamp is not None else {}) | members
        for name, data in items.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(gzip.compress(buffer.getvalue()))


def restored_names(cache) -> list[str]:
    return sorted(e[0] for e in keep.load_entries(cache.folder))


def test_an_archive_from_another_torch_is_not_used(tmp_path):
    cache = make_cache(tmp_path)
    other = {**keep.probe_stamp(), "torch.__version__": "1.13.0"}
    write_archive_bytes(tmp_path / "ckpt/byoc-compile-cache/host-0.tar.gz", {"fxgraph/ab/entry": b"old"}, other)
    k = keeper(cache)
    k.start()
    assert restored_names(cache) == []
    assert "not used: made by torch.__version__ '1.13.0'" in k.lines[0] and "a cold start" in k.lines[0]


def test_an_archive_without_a_stamp_is_not_used(tmp_path):
    cache = make_cache(tmp_path)
    write_archive_bytes(tmp_path / "ckpt/byoc-compile-cache/host-0.tar.gz", {"fxgraph/ab/entry": b"x"}, None)
    k = keeper(cache)
    k.start()
    assert restored_names(cache) == [] and "no stamp" in k.lines[0]


@pytest.mark.parametrize("damage", ["truncated", "flipped", "empty", "not gzip", "fifo"])
def test_a_corrupt_or_truncated_archive_is_a_note_and_a_cold_start_never_a_crash_or_a_hang(tmp_path, damage):
    cache = make_cache(tmp_path)
    archive = tmp_path / "ckpt/byoc-compile-cache/host-0.tar.gz"
    members = {f"fxgraph/e{i}/entry": os.urandom(4000) for i in range(20)}
    write_archive_bytes(archive, members, keep.probe_stamp())
    data = archive.read_bytes()
    if damage == "truncated":
        archive.write_bytes(data[: len(data) * 2 // 3])
    elif damage == "flipped":  # a damaged byte: only gzip's CRC at the end of the stream tells
        archive.write_bytes(data[:-12] + bytes([data[-12] ^ 0xFF]) + data[-11:])
    elif damage == "empty":
        archive.write_bytes(b"")
    elif damage == "not gzip":
        archive.write_bytes("\x00\udcff\ud800 not an archive".encode("utf-8", "surrogatepass"))
    else:
        archive.unlink()
        os.mkfifo(archive)
    k = keeper(cache)
    k.start()
    assert restored_names(cache) == []  # nothing of it, not even the members read before the damage
    assert "host-0.tar.gz" in k.lines[0] and "not used" in k.lines[0]
    assert not [n for n in os.listdir(cache.folder) if n.startswith(keep.STAGING_PREFIX)]


def test_a_hostile_member_name_stays_inside_the_folder(tmp_path):
    cache = make_cache(tmp_path)
    write_archive_bytes(tmp_path / "ckpt/byoc-compile-cache/host-0.tar.gz",
                        {"../escaped": b"x", "/abs": b"x", "ok/\x1b[2J\u202e": b"x", "fine/entry": b"y"},
                        keep.probe_stamp())
    keeper(cache).start()
    assert restored_names(cache) == ["fine/entry", "ok/\x1b[2J\u202e"]
    assert not (tmp_path / "escaped").exists()


def count_walks(monkeypatch, folder) -> list:
    """Each walk of the cache folder (os.fwalk: never through a link; the archive's own reads
    are not walks)."""
    walks, walk = [], os.fwalk

    def counting(top, *args, **kwargs):
        if os.fspath(top) == folder:
            walks.append(top)
        return walk(top, *args, **kwargs)

    monkeypatch.setattr(keep.os, "fwalk", counting)
    return walks


def test_a_job_on_a_new_instance_walks_the_cache_folder_once(tmp_path, monkeypatch):
    """Restoring says what the folder holds; the end walks it once for the bound, the log and
    the archive."""
    cache = make_cache(tmp_path)._replace(max_bytes=200)
    for host in (0, 1):  # each archive within the bound, both together over it
        write_archive_bytes(tmp_path / f"ckpt/byoc-compile-cache/host-{host}.tar.gz", {f"ab/c{host}.so": b"x" * 150},
                            keep.probe_stamp())
    walks = count_walks(monkeypatch, cache.folder)
    k = keeper(cache)
    k.start()
    assert walks == [] and "1 oldest file(s), 0.0 MB, evicted" in k.lines[2]  # the bound, unwalked
    assert restored_names(cache) == ["ab/c0.so"]
    (tmp_path / "local-0/fxgraph/b").mkdir(parents=True)
    (tmp_path / "local-0/fxgraph/b/e").write_bytes(b"new")
    walks.clear()
    k.end(5)
    assert walks == [cache.folder]
    assert "0 FX graph entries at the start, 1 compiled by this job" in k.lines[-2]
    assert "written (the end): 2 file(s)" in k.lines[-1]


def test_a_folder_a_restart_left_is_walked_once_at_the_start_and_once_at_the_end(tmp_path, monkeypatch):
    cache = make_cache(tmp_path)
    fill(tmp_path / "local-0", {"fxgraph/a/e": 10})
    walks = count_walks(monkeypatch, cache.folder)
    k = keeper(cache)
    k.start()
    k.end(5)
    assert walks == [cache.folder, cache.folder]
    assert "holds 1 file(s)" in k.lines[-3] and "written (the end): 1 file(s)" in k.lines[-1]


def test_a_warm_job_that_compiled_nothing_does_not_write_its_archive_again(tmp_path):
    """SageMaker uploads every file written in the checkpoint folder: the same archive again is
    an upload for nothing. torch's lock files, never archived, do not count as a change."""
    cache = make_cache(tmp_path)
    archive = tmp_path / "ckpt/byoc-compile-cache/host-0.tar.gz"
    write_archive_bytes(archive, {"fxgraph/a/e": b"x", "ab/cab.main.so": b"yy"}, keep.probe_stamp())
    before = archive.stat()
    k = keeper(cache)
    k.start()
    fill(tmp_path / "local-0", {"locks/cab.lock": 0})  # a rank loaded the kernel
    k.end(5)
    assert (archive.stat().st_ino, archive.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert k.lines[-1].endswith("holds the folder's entries already: not written again")
    again = keeper(cache._replace(folder=str(tmp_path / "next")))
    again.start()
    fill(tmp_path / "next", {"fxgraph/b/e": 5})  # this job compiled a graph
    again.end(5)
    assert "written (the end): 3 file(s)" in again.lines[-1]


def test_another_hosts_archive_or_a_damaged_own_one_is_written_back_as_this_hosts(tmp_path):
    cache = make_cache(tmp_path, host=1)
    write_archive_bytes(tmp_path / "ckpt/byoc-compile-cache/host-0.tar.gz", {"fxgraph/a/e": b"x"}, keep.probe_stamp())
    write_archive_bytes(tmp_path / "ckpt/byoc-compile-cache/host-1.tar.gz", {"../out": b"x"}, keep.probe_stamp())
    k = keeper(cache)
    k.start()
    k.end(5)
    with tarfile.open(cache.archive) as tar:
        assert tar.getnames() == [keep.STAMP_NAME, "fxgraph/a/e"]


def test_the_other_hosts_archives_are_merged_and_this_hosts_own_is_written(tmp_path):
    cache = make_cache(tmp_path, host=1)
    write_archive_bytes(tmp_path / "ckpt/byoc-compile-cache/host-0.tar.gz", {"fxgraph/a/e": b"from 0"},
                        keep.probe_stamp())
    k = keeper(cache)
    k.start()
    (tmp_path / "local-1/fxgraph/b").mkdir(parents=True)
    (tmp_path / "local-1/fxgraph/b/e").write_bytes(b"new")
    k.end(5)
    with tarfile.open(cache.archive) as tar:
        assert tar.getnames() == [keep.STAMP_NAME, "fxgraph/b/e", "fxgraph/a/e"]
    assert any("1 FX graph entry at the start, 1 compiled by this job" in line for line in k.lines)


def test_a_kernel_torch_is_still_building_is_left_out_of_the_archive(tmp_path):
    import fcntl

    cache = make_cache(tmp_path)
    fill(tmp_path / "local-0", {"ab/cbuilding.main.so": 10, "cd/cdone.main.so": 10, "locks/cbuilding.lock": 0})
    with open(tmp_path / "local-0/locks/cbuilding.lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as torch's FileLock holds it while gcc writes the .so
        written, _ = keep.write_archive(cache, {}, keep.load_entries(cache.folder))
    assert [e[0] for e in written] == ["cd/cdone.main.so"]
    with tarfile.open(cache.archive) as tar:
        assert tar.getnames() == [keep.STAMP_NAME, "cd/cdone.main.so"]


def test_a_stop_writes_the_archive_while_the_ranks_still_run(tmp_path):
    cache = make_cache(tmp_path)
    fill(tmp_path / "local-0", {"fxgraph/ab/entry": 10})
    k = keep.CacheKeeper(cache)
    k.start()
    k.note_stop()
    for _ in range(500):
        if os.path.exists(cache.archive):
            break
        time.sleep(0.01)
    assert os.path.exists(cache.archive) and any("written (a stop)" in line for line in k.lines)
    k.end(5)
    assert not any("written (the end)" in line for line in k.lines)  # nothing changed since


def test_the_runs_loop_asks_for_the_periodic_archive_while_the_ranks_run(tmp_path):
    """BYOC_COMPILE_CACHE_SAVE_EVERY_S: the run's loop keeps the keeper's deadline (due_at) and
    asks for the write (save_when_due); the keeper's thread has no timer of its own. The rank
    here ends only once the archive is there: it would wait for good without the periodic one."""
    from entrypoint.decide.specs import ProcessSpec
    from entrypoint.run.stop import Stop
    from entrypoint.run.supervise import OutputCollector, RunHooks, run_processes

    cache = make_cache(tmp_path)._replace(save_every_s=0.2)
    fill(tmp_path / "local-0", {"fxgraph/ab/entry": 10})
    k = keep.CacheKeeper(cache)
    k.start()
    assert k.due_at() is not None
    rank = ("import os, select, sys, time\n"
            "failsafe = time.monotonic() + 600\n"  # not a measure: a run that never asks ends failed
            f"while not os.path.exists({cache.archive!r}):\n"
            "    select.select([], [], [], 0.01)\n"
            "    if time.monotonic() > failsafe: sys.exit(3)\n")
    run = run_processes((ProcessSpec("rank", (sys.executable, "-c", rank)),), dict(os.environ), str(tmp_path),
                        OutputCollector(), Stop(), RunHooks(periodic=k))
    assert run.exit_code == 0 and any("written (periodic)" in line for line in k.lines), k.lines
    k.end(5)
    assert keep.CacheKeeper(make_cache(tmp_path)).due_at() is None  # no thread, no deadline


def test_two_hosts_on_a_shared_folder_write_their_archives_at_once(tmp_path):
    """Two processes (two hosts' entrypoints on one shared checkpoint folder), each writing its
    own archive many times: every archive read back at any moment is whole."""
    code = ("import sys, os; sys.path.insert(0, sys.argv[1]); from entrypoint.run import compile_cache as k; "
            "from entrypoint.decide.compile_cache import CompileCache; h = int(sys.argv[2]); d = sys.argv[3]; "
            "c = CompileCache(os.path.join(d, f'local-{h}'), os.path.join(d, 'shared'), "
            "os.path.join(d, 'shared', f'host-{h}.tar.gz'), 1 << 30, 0.0); os.makedirs(c.folder + '/fxgraph/x'); "
            "open(c.folder + '/fxgraph/x/e', 'wb').write(os.urandom(200000)); "
            "[k.write_archive(c, {'h': str(h)}, k.load_entries(c.folder)) for _ in range(30)]")
    repo = str(keep.__file__).rsplit("/entrypoint/", 1)[0]
    writers = [subprocess.Popen([sys.executable, "-c", code, repo, str(h), str(tmp_path)]) for h in (0, 1)]
    reads = 0
    while any(w.poll() is None for w in writers):
        for h in (0, 1):
            try:
                with tarfile.open(tmp_path / "shared" / f"host-{h}.tar.gz") as tar:
                    assert tar.getnames() == [keep.STAMP_NAME, "fxgraph/x/e"]
                    reads += 1
            except FileNotFoundError:
                pass
    assert [w.wait() for w in writers] == [0, 0] and reads > 0
    assert not [n for n in os.listdir(tmp_path / "shared") if n.endswith(".tmp")]


# --- whole jobs with torch.compile (Inductor's C++ on CPU) ------------------------------------

@pytest.mark.slow
def test_a_second_job_with_the_restored_checkpoint_folder_is_warm_and_a_cache_from_another_torch_is_not(tmp_path):
    ckpt = tmp_path / "checkpoints"
    first = job_tree(tmp_path, "job1", ckpt)
    run_job(first, tmp_path / "host-local-1")
    assert hits_and_misses(counters(first)) == (0, 2)  # cold: forward and backward compiled
    assert (ckpt / "byoc-compile-cache" / "host-0.tar.gz").is_file()
    # A new instance: an empty host-local folder and temporary folder, the checkpoint folder
    # back from S3.
    second = job_tree(tmp_path, "job2", ckpt)
    (tmp_path / "tmp-2").mkdir()
    done = run_job(second, tmp_path / "host-local-2", TMPDIR=str(tmp_path / "tmp-2"))
    assert hits_and_misses(counters(second)) == (2, 0)
    # No C++ at all on a hit: Inductor's precompiled header (<tempdir>/torchinductor_<user>/
    # precompiled_headers) would be built here, outside the kept folder, hit or not.
    assert not list((tmp_path / "tmp-2").rglob("*.gch"))
    assert counters(second)["dir"] == str(tmp_path / "host-local-2")
    assert "torch.compile cache: restored" in done.stderr and "0 compiled by this job" in done.stderr
    # torch's own keying, beneath our stamp: the same folder, as seen by another torch (its
    # source hash, torch_key(), differs), gives no hit.
    probe = ("import torch._inductor.codecache as c; c.torch_key = lambda: b'another torch'; "
             "exec(open('code/train.py').read())")
    (second / "code" / "other_torch.py").write_text(probe)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "host-local-2"), "SM_MODEL_DIR": str(tmp_path),
           "RANK": "9"}
    subprocess.run([PYTHON, "code/other_torch.py"], cwd=second, env=env, check=True, timeout=600)
    assert hits_and_misses(json.loads((tmp_path / "counters-0-9.json").read_text())) == (0, 2)


@pytest.mark.slow
def test_a_restart_in_place_is_warm_with_two_ranks_compiling_into_one_folder_at_once(tmp_path):
    """mpirun with 2 ranks on one host, no checkpoint folder: both compile into the host-local
    folder at once (cold), rank 0 then fails, the entrypoint restarts the job in place: warm."""
    host = socket.gethostname()  # mpirun starts the ranks here without SSH
    root = job_tree(tmp_path, "job", hyperparameters=MPI_2, hosts=(host,), current_host=host)
    run_job(root, tmp_path / "host-local", FAIL_FIRST="1", BYOC_MAX_RESTARTS="1")
    first = [hits_and_misses(counters(root, 0, r)) for r in (0, 1)]
    assert sum(m for _, m in first) >= 2 and all(h + m == 2 for h, m in first)  # both compiled, at once
    assert [hits_and_misses(counters(root, 1, r)) for r in (0, 1)] == [(2, 0), (2, 0)]
    assert counters(root, 1, 0)["dir"] == str(tmp_path / "host-local")  # ours, not torch's default
    assert not (tmp_path / "checkpoints").exists()


def test_the_jobs_own_inductor_folder_is_what_the_ranks_get_and_nothing_is_archived(tmp_path):
    root = write_tree(tmp_path / "job", script=SHOW_ENV)
    with_checkpoint(root, tmp_path / "checkpoints")
    (tmp_path / "own" / "fxgraph").mkdir(parents=True)
    (tmp_path / "own" / "fxgraph" / "entry").write_bytes(b"x")
    run_job(root, tmp_path / "host-local", TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "own"))
    assert json.loads((root / "model/env.json").read_text()) == [str(tmp_path / "own"), None]
    assert not (tmp_path / "checkpoints" / "byoc-compile-cache").exists()
    assert not (tmp_path / "host-local").exists()


def test_the_ranks_get_the_host_local_folder(tmp_path):
    root = write_tree(tmp_path / "job", script=SHOW_ENV)
    run_job(root, tmp_path / "host-local")
    local = str(tmp_path / "host-local")
    assert json.loads((root / "model/env.json").read_text()) == [local, local + "/triton"]


def test_the_job_report_and_the_log_say_what_the_cache_held_and_wrote(tmp_path):
    root = write_tree(tmp_path / "job", script=SHOW_ENV)
    with_checkpoint(root, tmp_path / "checkpoints")
    fill(tmp_path / "host-local", {"fxgraph/ab/entry": 1000, "tj/ctj.main.so": 3000})
    done = run_entrypoint(root, timeout=120, BYOC_COMPILE_CACHE_DIR=str(tmp_path / "host-local"),
                          BYOC_RUNTIME_DIR=str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((root / "output/data/report/report.json").read_text())
    assert "compile cache restored" in [p["name"] for p in report["phases"]]
    notes = report["notes"]
    cache_lines = [n for n in notes if n.startswith("algo-1: torch.compile cache:")]
    assert any("holds 2 file(s)" in n for n in cache_lines), notes
    assert any("1 FX graph entry at the start, 0 compiled by this job" in n for n in cache_lines)
    assert any("host-0.tar.gz written (the end): 2 file(s)" in n for n in cache_lines)
    assert "note: torch.compile cache: TORCHINDUCTOR_CACHE_DIR=" in done.stderr  # the plan's


def test_a_stop_while_the_archives_are_restored_ends_the_restore_between_two_archives(tmp_path):
    """The restore reads every host's archive (256 at 256 hosts): a stop posted meanwhile (no
    handler raises any more) ends it at the next archive, said, and the job's start-up stop
    follows (orchestrate.start_compile_cache hands the keeper the loop's stopped)."""
    cache = make_cache(tmp_path)
    for host in range(3):
        write_archive_bytes(tmp_path / f"ckpt/byoc-compile-cache/host-{host}.tar.gz",
                            {f"fxgraph/h{host}/entry": b"x"}, keep.probe_stamp())
    asked = iter([False, True, True])
    k = keeper(cache)
    k.stop_asked = lambda: next(asked)
    k.start()
    k.end(5)
    assert restored_names(cache) == ["fxgraph/h0/entry"]  # this host's first, then the stop
    assert any("2 archive(s) not restored: the job was stopped" in line for line in k.lines), k.lines

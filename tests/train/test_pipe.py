"""Pipe mode gives the same records, and so the same batches, as File mode for the same data."""

from __future__ import annotations

import io
import json
import os
import stat
import struct
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest

from tests.train.train_helpers import job_env, load_saved_state, make_tables, run, torchrun_argv, write_job
from train.batches import build_batch_indices, build_epoch_order
from train.channels import ChannelConfig, ChannelReader, StagingFolderError, build_staging_folder
from train.records import RECORDIO_MAGIC, parse_pipe


def npy_label_first(x, y) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.column_stack([y.astype(np.float32), x]))
    return buffer.getvalue()


def write_npy_channel(folder: Path, shards: int = 3, n: int = 60) -> list[bytes]:
    """The channel's S3 objects, in key order, as files; returned as the bytes Pipe mode streams."""
    x, y = make_tables(n, seed=7)
    folder.mkdir(parents=True)
    blobs = []
    for i, part in enumerate(np.array_split(np.arange(n), shards)):
        blob = npy_label_first(x[part], y[part])
        (folder / f"part-{i:02d}.npy").write_bytes(blob)
        blobs.append(blob)
    return blobs


def feed_fifos(data_dir: Path, channel: str, passes: int, payload: bytes) -> threading.Thread:
    """Play SageMaker: one FIFO per pass, <channel>_<n>, each streamed once."""
    paths = [data_dir / f"{channel}_{n}" for n in range(passes)]
    for path in paths:
        os.mkfifo(path)

    def writer():
        for path in paths:
            with open(path, "wb") as fifo:  # blocks until the training side opens it
                for start in range(0, len(payload), 4096):  # small writes: the reader sees partial data
                    fifo.write(payload[start:start + 4096])

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    return thread


def recordio(payloads: list[bytes]) -> bytes:
    out = b""
    for payload in payloads:
        out += struct.pack("<II", RECORDIO_MAGIC, len(payload)) + payload + b"\0" * ((4 - len(payload) % 4) % 4)
    return out


def test_pipe_gives_the_same_batches_as_file(tmp_path):
    data_dir = tmp_path / "input/data"
    blobs = write_npy_channel(data_dir / "train")
    file_reader = ChannelReader(ChannelConfig("train", "File"), {}, str(data_dir))
    feeder = feed_fifos(data_dir, "train", 2, b"".join(blobs))
    pipe_reader = ChannelReader(ChannelConfig("train", "Pipe"), {}, str(data_dir))
    for epoch in range(2):
        from_file, from_pipe = file_reader.load_pass(), pipe_reader.load_pass()
        np.testing.assert_array_equal(from_file.x, from_pipe.x)
        np.testing.assert_array_equal(from_file.y, from_pipe.y)
        order = build_epoch_order(len(from_file), seed=1, epoch=epoch, shuffle=True)
        for step in range(3):
            for rank in range(2):
                idx = build_batch_indices(order, step, 8, rank, 2)
                np.testing.assert_array_equal(from_file.x[idx], from_pipe.x[idx])
                np.testing.assert_array_equal(from_file.y[idx], from_pipe.y[idx])
    feeder.join(timeout=10)
    assert not feeder.is_alive()


def test_two_ranks_on_a_host_share_each_pass_of_one_fifo(tmp_path):
    data_dir = tmp_path / "input/data"
    blobs = write_npy_channel(data_dir / "train")
    expected = ChannelReader(ChannelConfig("train", "File"), {}, str(data_dir)).load_pass()
    feeder = feed_fifos(data_dir, "train", 2, b"".join(blobs))
    env = {"MASTER_PORT": str(os.getpid())}  # identifies this launch in the staging file name
    readers = [ChannelReader(ChannelConfig("train", "Pipe"), env, str(data_dir), rank, 2) for rank in range(2)]
    results: dict[tuple[int, int], object] = {}
    folder_modes: list[int] = []
    step = threading.Barrier(2, timeout=30)  # stands for the collective training steps of a pass

    def rank_main(rank):
        for n in range(2):
            results[rank, n] = readers[rank].load_pass()
            if rank == 0:
                folder_modes.append(os.lstat(readers[0].staging_folder).st_mode)
            step.wait()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    for key, table in results.items():
        np.testing.assert_array_equal(table.x, expected.x, err_msg=str(key))
    assert len(results) == 4
    # Staged in a private folder of the launch's own, not a folder shared by everyone in /tmp.
    folder = readers[0].staging_folder
    assert readers[1].staging_folder == folder and os.path.dirname(folder) == tempfile.gettempdir()
    assert os.path.basename(folder).startswith(f"byoc-pipe-{os.getuid()}-")
    assert [stat.S_ISDIR(m) and stat.S_IMODE(m) for m in folder_modes] == [0o700, 0o700]
    staged = readers[0]._staged[:]
    assert staged and all(os.path.dirname(p) == folder for p in staged)
    readers[0].release_staging()
    assert not any(os.path.exists(p) for p in staged) and not os.path.exists(folder)  # removed at the end
    feeder.join(timeout=10)


def test_each_launch_user_and_channel_stages_in_a_folder_of_its_own(tmp_path):
    data = str(tmp_path / "input/data")
    root = str(tmp_path / "tmp")
    one = build_staging_folder(data, "train", {"MASTER_PORT": "29500"}, 1000, root)
    assert one == build_staging_folder(data, "train", {"MASTER_PORT": "29500"}, 1000, root)  # every rank of a host
    others = {
        build_staging_folder(data, "train", {"MASTER_PORT": "29501"}, 1000, root),  # another launch
        build_staging_folder(data, "train", {"MASTER_PORT": "29500", "TORCHELASTIC_RESTART_COUNT": "1"}, 1000, root),
        build_staging_folder(data, "train", {"MASTER_PORT": "29500"}, 1001, root),  # another user
        build_staging_folder(data, "validation", {"MASTER_PORT": "29500"}, 1000, root),  # another channel
        build_staging_folder(str(tmp_path / "host-2/input/data"), "train", {"MASTER_PORT": "29500"}, 1000, root),
    }
    assert len(others) == 5 and one not in others
    assert all(os.path.dirname(f) == root and os.path.basename(f).startswith("byoc-pipe-") for f in others | {one})


def prepared(tmp_path, how: str) -> tuple[Path, ChannelReader, ChannelReader]:
    """Something already at the launch's staging folder's path, made by someone else."""
    data_dir = tmp_path / "input/data"
    data_dir.mkdir(parents=True)
    root = tmp_path / "tmp"
    root.mkdir()
    env = {"MASTER_PORT": "29500"}
    readers = [ChannelReader(ChannelConfig("train", "Pipe"), env, str(data_dir), rank, 2, timeout_s=5,
                             staging_root=str(root)) for rank in range(2)]  # fmt: skip
    folder = Path(readers[0].staging_folder)
    target = tmp_path / "elsewhere"
    target.mkdir()
    if how == "link":
        folder.symlink_to(target)
    else:  # a folder others can read, with a planted pass in it
        folder.mkdir(mode=0o755)
        os.chmod(folder, 0o755)
        x, y = make_tables(4, seed=1)
        (folder / "train_0").write_bytes(npy_label_first(x, y))
    return target, readers[0], readers[1]


@pytest.mark.parametrize("how", ["link", "readable-by-others"])
def test_a_staging_folder_someone_else_prepared_is_never_used(tmp_path, how):
    target, rank0, rank1 = prepared(tmp_path, how)
    with pytest.raises(StagingFolderError, match="is not a private folder of this user's"):
        rank0.load_pass()  # before it opens the FIFO: nothing of the channel is written there
    assert os.listdir(target) == []
    with pytest.raises(StagingFolderError, match="set TMPDIR"):
        rank1.load_pass()  # never reads a pass it finds there


@pytest.mark.parametrize("wrap", ["none", "recordio"])
def test_csv_and_recordio_streams(wrap):
    x, y = make_tables(10, seed=3)
    csv = "\n".join(",".join([str(int(label))] + [repr(float(v)) for v in row]) for row, label in zip(x, y))
    half = csv.encode().split(b"\n")
    first, second = b"\n".join(half[:5]) + b"\n", b"\n".join(half[5:]) + b"\n"
    if wrap == "recordio":
        stream, wrapper = recordio([first, second]), "RecordIO"
    else:
        stream, wrapper = first + second, "None"
    table = parse_pipe(io.BytesIO(stream), "test", wrapper)
    np.testing.assert_array_equal(table.y, y)
    np.testing.assert_allclose(table.x, x)


def test_recordio_carries_npz_objects():
    x, y = make_tables(12, seed=4)
    blobs = []
    for part in (slice(0, 5), slice(5, 12)):
        buffer = io.BytesIO()
        np.savez(buffer, x=x[part], y=y[part])
        blobs.append(buffer.getvalue())
    table = parse_pipe(io.BytesIO(recordio(blobs)), "test", "RecordIO")
    np.testing.assert_array_equal(table.x, x)


def test_npz_stream_without_wrapper_is_a_clear_error():
    buffer = io.BytesIO()
    np.savez(buffer, x=np.zeros((2, 2)), y=np.zeros(2))
    buffer.seek(0)
    with pytest.raises(ValueError, match="cannot be streamed"):
        parse_pipe(buffer, "chan", "None")


@pytest.mark.slow
def test_training_in_pipe_mode_equals_file_mode(tmp_path):
    """End to end: 2 ranks under torchrun, one FIFO per epoch, same final weights bit for bit."""
    args = ["--epochs", "3", "--batch_size", "8", "--hidden_sizes", "[16]", "--log_every", "3",
            "--checkpoint_every", "0"]
    file_root = write_job(tmp_path / "file")
    run(torchrun_argv(2, "train.ddp_train", args), job_env(file_root))

    pipe_root = write_job(tmp_path / "pipe", input_config={
        "train": {"TrainingInputMode": "Pipe", "S3DistributionType": "FullyReplicated"},
        "validation": {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated"}})
    train_dir = pipe_root / "input/data/train"
    stream = b""
    for shard in sorted(train_dir.iterdir()):  # Pipe mode cannot stream .npz: send label-first .npy
        with np.load(shard) as archive:
            stream += npy_label_first(archive["x"], archive["y"])
        shard.unlink()
    train_dir.rmdir()
    feeder = feed_fifos(pipe_root / "input/data", "train", 3, stream)
    out = run(torchrun_argv(2, "train.ddp_train", args), job_env(pipe_root)).stdout
    feeder.join(timeout=10)
    assert "[result]" in out
    file_state, pipe_state = load_saved_state(file_root), load_saved_state(pipe_root)
    for name in file_state:
        assert np.array_equal(file_state[name].numpy(), pipe_state[name].numpy()), name
    assert json.loads((pipe_root / "input/config/inputdataconfig.json").read_text())["train"]["TrainingInputMode"] == "Pipe"

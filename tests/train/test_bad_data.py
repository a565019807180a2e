"""A truncated or corrupt shard in a channel: one clear error naming the file and what it
should be (not numpy's `BadZipFile: File is not a zip file`), through the training scripts'
loading path, and as the rank's failure reason in output/failure."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from support.jobtree import failure_text, run_entrypoint, write_tree  # noqa: E402
from tests.train.train_helpers import make_tables, npz_bytes  # noqa: E402

from train.channels import ChannelConfig, ChannelReader  # noqa: E402
from train.records import DataFileError, load_table_file, parse_pipe  # noqa: E402

X, Y = make_tables(40, features=5)
NPZ = npz_bytes(X, Y)


def npy_bytes() -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.column_stack([Y, X]).astype(np.float64))
    return buffer.getvalue()


NPY = npy_bytes()
WHAT = {".npz": "not a readable .npz shard (a NumPy zip archive of arrays 'x' and 'y')",
        ".npy": "not a readable .npy shard (a NumPy 2-D array: label, features...)",
        ".csv": "not a readable CSV shard (UTF-8 text of numbers: label, features...)"}


def assert_names_the_file(err: BaseException, path: Path, suffix: str) -> None:
    message = str(err)
    assert isinstance(err, DataFileError) and isinstance(err, ValueError)  # callers that catch ValueError still do
    assert message.startswith(f"{path}: truncated or corrupt, {WHAT[suffix]} (")
    assert "\n" not in message and "pickled" not in message


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(suffix=st.sampled_from([".npz", ".npy"]), data=st.data())
def test_a_shard_cut_anywhere_is_an_error_naming_it(tmp_path, suffix, data):
    whole = NPZ if suffix == ".npz" else NPY
    cut = data.draw(st.integers(0, len(whole) - 1))
    path = tmp_path / f"part-0{suffix}"
    path.write_bytes(whole[:cut])
    with pytest.raises(DataFileError) as err:
        load_table_file(str(path))
    assert_names_the_file(err.value, path, suffix)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(suffix=st.sampled_from([".npz", ".npy"]), data=st.data())
def test_a_damaged_byte_either_still_loads_or_is_an_error_naming_the_file(tmp_path, suffix, data):
    damaged = bytearray(NPZ if suffix == ".npz" else NPY)
    at = data.draw(st.integers(0, len(damaged) - 1))
    damaged[at] ^= data.draw(st.integers(1, 255))
    path = tmp_path / f"part-0{suffix}"
    path.write_bytes(bytes(damaged))
    try:
        table = load_table_file(str(path))
    except DataFileError as err:
        if "truncated or corrupt" in str(err):
            assert_names_the_file(err, path, suffix)
        else:  # a damaged member name reads as a missing array: "an .npz shard needs arrays 'x' and 'y', found ['x']"
            assert str(err).startswith(f"{path}: an .npz shard needs arrays 'x' and 'y', found ") and "\n" not in str(err)
    except ValueError as err:  # read, but not a table: our own messages name the file too
        assert str(err).startswith(f"{path}: ")
    else:
        assert len(table) == len(Y)  # a flipped feature or label value is data, not damage


@pytest.mark.parametrize("name, data, detail", [
    ("garbage.npz", b"not numpy at all " * 4, "it starts with neither a zip nor an .npy header"),
    ("empty.npz", b"", "EOFError"),
    ("zip.npy", NPZ, "it is a zip archive (.npz), not a single array"),
    # one damaged digit of the header's shape: numpy alone loads 0 (or 10) rows of 40, silently
    ("shape-digit.npy", NPY.replace(b"(40, 6)", b"( 0, 6)"), "shape (0, 6) (0 bytes), and 1920 more bytes follow it"),
    ("fewer-rows.npy", NPY.replace(b"(40, 6)", b"(10, 6)"), "shape (10, 6) (480 bytes), and 1440 more bytes follow it"),
    ("latin1.csv", "1,2.5\n0,é\n".encode("latin-1"), "UnicodeDecodeError"),
])  # fmt: skip
def test_each_kind_of_shard_names_itself_and_the_format(tmp_path, name, data, detail):
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(DataFileError) as err:
        load_table_file(str(path))
    assert_names_the_file(err.value, path, path.suffix)
    assert detail in str(err.value)


def test_a_truncated_stream_in_pipe_mode_names_the_fifo():
    with pytest.raises(DataFileError) as err:
        parse_pipe(io.BytesIO(NPY + NPY[: len(NPY) - 7]), "/opt/ml/input/data/train_0", "None")
    assert str(err.value).startswith("/opt/ml/input/data/train_0: truncated or corrupt, not a readable .npy shard")


def test_the_training_scripts_reader_names_the_truncated_shard_among_good_ones(tmp_path):
    channel = tmp_path / "input/data/train"
    channel.mkdir(parents=True)
    (channel / "part-0.npz").write_bytes(NPZ)
    (channel / "part-1.npz").write_bytes(NPZ[: len(NPZ) // 2])
    (channel / "part-2.npz").write_bytes(NPZ)
    reader = ChannelReader(ChannelConfig("train", "File", "FullyReplicated", "None"), {}, str(tmp_path / "input/data"))
    with pytest.raises(DataFileError) as err:
        reader.load_pass()
    assert_names_the_file(err.value, channel / "part-1.npz", ".npz")
    assert "BadZipFile: File is not a zip file" in str(err.value)


def test_the_ranks_failure_reason_in_output_failure_names_the_shard(tmp_path):
    """The shipped DDP script, run by the entrypoint as a user's entry point would run it: the
    root cause that record_errors writes for the rank carries the file and what is wrong."""
    script = "import runpy\nrunpy.run_module('train.ddp_train', run_name='__main__')\n"
    # Not train.py: the code folder comes first on sys.path and would shadow our train package.
    root = write_tree(tmp_path, script=script, program="run_ddp.py", hyperparameters={"epochs": 1},
                      channel_files={"train": {"part-0.npz": NPZ, "part-1.npz": NPZ[: len(NPZ) // 2]}})
    done = run_entrypoint(root, timeout=180, OMP_NUM_THREADS="1")
    assert done.returncode != 0, done.stdout[-2000:]
    report = failure_text(root)
    shard = root / "input/data/train/part-1.npz"
    assert f"DataFileError: {shard}: truncated or corrupt, not a readable .npz shard" in report, report
    assert "File is not a zip file" in report


def test_a_read_error_of_the_storage_is_not_called_a_corrupt_file():
    """EIO from a FastFile mount is the storage failing, not the file's format."""
    import errno

    from train.records import build_data_file_error

    err = build_data_file_error("/opt/ml/input/data/train/part-0.npz", ".npz", OSError(errno.EIO, "Input/output error"))
    assert str(err).startswith("/opt/ml/input/data/train/part-0.npz: could not be read (OSError: Input/output error)")
    assert "corrupt" not in str(err)
    parse_error = build_data_file_error("/x.npy", ".npy", OSError("Failed to interpret file as a pickle"))
    assert "truncated or corrupt" in str(parse_error)  # numpy's own OSError, no errno: the format


def test_a_damaged_zip_directory_that_makes_zipfile_seek_before_the_start_is_corrupt_not_a_read_error(tmp_path):
    """One flipped byte of the central directory's offset: zipfile seeks to a negative offset
    and the OS says EINVAL, an errno, but the bytes are at fault (CI's hypothesis run found it
    reported as "could not be read")."""
    damaged = bytearray(NPZ)
    end = NPZ.rindex(b"PK\x05\x06")  # end of central directory; the directory's offset is at +16
    damaged[end + 16 + 3] ^= 0x80
    path = tmp_path / "part-0.npz"
    path.write_bytes(bytes(damaged))
    with pytest.raises(DataFileError) as err:
        load_table_file(str(path))
    assert_names_the_file(err.value, path, ".npz")


def test_a_member_flagged_encrypted_by_a_damaged_byte_is_an_error_naming_the_file(tmp_path):
    """A fresh root's hypothesis run found it: one flipped bit of the central directory's flags
    marks `y.npy` encrypted, and zipfile raised RuntimeError ("password required"), not a
    DataFileError naming the shard."""
    damaged = bytearray(NPZ)
    entry = damaged.index(b"PK\x01\x02")  # the first central directory entry
    damaged[entry + 8] |= 0x01  # its general purpose flags: bit 0, encrypted
    path = tmp_path / "part-0.npz"
    path.write_bytes(bytes(damaged))
    with pytest.raises(DataFileError) as err:
        load_table_file(str(path))
    assert_names_the_file(err.value, path, ".npz")

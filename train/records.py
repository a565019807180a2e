"""Parsing training records: .npz / .npy shards and CSV, from files or from a byte stream.

The layout (documented in docs/training.md):
  .npz       arrays `x` (features, N x ...) and `y` (integer labels, N)
  .npy, CSV  a 2-D table, label in the first column, features after it (the convention of
             SageMaker's built-in algorithms); CSV without a header.
A Pipe-mode stream is the channel's objects one after the other: .npy arrays read back to
back, or CSV text, or (RecordWrapperType RecordIO) any of these each wrapped in RecordIO.
"""

from __future__ import annotations

import errno
import io
import os
import struct
import tokenize
import zipfile
import zlib
from dataclasses import dataclass
from typing import BinaryIO, Iterator

import numpy as np

NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGIC = b"PK\x03\x04"
RECORDIO_MAGIC = 0xCED7230A
SUFFIXES = (".npz", ".npy", ".csv")


# What each kind of channel file must be, for the message when one cannot be read.
FORMATS = {
    ".npz": ".npz shard (a NumPy zip archive of arrays 'x' and 'y')",
    ".npy": ".npy shard (a NumPy 2-D array: label, features...)",
    ".csv": "CSV shard (UTF-8 text of numbers: label, features...)",
}
# What numpy, zipfile and zlib raise on a file that is cut short or damaged: none of them
# names the file ("BadZipFile: File is not a zip file", "cannot reshape array of size ...").
# A damaged .npy header can also fail numpy's header parser (tokenize), a damaged zip
# directory the zip reader (struct, an unsupported method, an impossible offset).
# RuntimeError: zipfile's "File ... is encrypted, password required" for a member whose
# encrypted flag bit a damaged byte set (numpy never writes an encrypted member).
_DAMAGE = (zipfile.BadZipFile, zlib.error, EOFError, ValueError, KeyError, UnicodeDecodeError, SyntaxError,
           tokenize.TokenError, struct.error, NotImplementedError, OverflowError, OSError, RuntimeError)
_NOT_DAMAGE = (FileNotFoundError, PermissionError, IsADirectoryError)  # these name the file already
# An OSError with one of these is the storage or the path failing (a FastFile/FSx mount, a
# network disk, a link loop, no file descriptors left), not the file's format. Any other errno
# comes from the file's own bytes: a damaged zip directory has zipfile seek to a negative
# offset (EINVAL).
STORAGE_ERRNOS = frozenset(getattr(errno, name) for name in (
    "EIO", "ENXIO", "ENODEV", "ETIMEDOUT", "ESTALE", "ENOTCONN", "ECONNRESET", "ECONNABORTED", "EREMOTEIO",
    "EHOSTDOWN", "EHOSTUNREACH", "ENETDOWN", "ENETUNREACH", "ENOLINK", "ECOMM", "EAGAIN", "EINTR",
    "ELOOP", "ENOTDIR", "ENAMETOOLONG", "EMFILE", "ENFILE", "ENOMEM") if hasattr(errno, name))


class DataFileError(ValueError):
    """A channel file that cannot be read as what its name says it is; the message names it."""


def build_data_file_error(source: str, suffix: str, err: BaseException) -> DataFileError:
    detail = str(err).strip().splitlines()[0] if str(err).strip() else ""
    if "pickled" in detail:  # numpy's last guess, and its advice to unpickle it, would mislead
        detail = "it starts with neither a zip nor an .npy header"
    if isinstance(err, OSError) and err.errno in STORAGE_ERRNOS:  # the storage failed, not the file's format
        return DataFileError(f"{source}: could not be read ({type(err).__name__}: {err.strerror or detail}); "
                             f"expected a {FORMATS[suffix]}")
    return DataFileError(f"{source}: truncated or corrupt, not a readable {FORMATS[suffix]} "
                         f"({type(err).__name__}{': ' + detail if detail else ''})")


@dataclass(frozen=True)
class Table:
    x: np.ndarray  # float32, N x features
    y: np.ndarray  # int64, N

    def __len__(self) -> int:
        return len(self.y)


def build_table(x: np.ndarray, y: np.ndarray, source: str) -> Table:
    if x.ndim < 2 or y.ndim != 1 or len(x) != len(y):
        raise ValueError(f"{source}: expected x of shape (N, ...) and y of shape (N,), got {x.shape} and {y.shape}")
    if len(y) and not np.all(np.equal(np.mod(y, 1), 0)):
        raise ValueError(f"{source}: labels must be integers")
    return Table(np.ascontiguousarray(x, dtype=np.float32), np.ascontiguousarray(y, dtype=np.int64))


def parse_label_first(table: np.ndarray, source: str) -> Table:
    if table.ndim != 2 or table.shape[1] < 2:
        raise ValueError(f"{source}: expected a 2-D table (label, features...), got shape {table.shape}")
    return build_table(table[:, 1:], table[:, 0], source)


def concat_tables(tables: list[Table], source: str) -> Table:
    if not tables:
        raise ValueError(f"{source}: no records")
    shapes = {t.x.shape[1:] for t in tables}
    if len(shapes) > 1:
        raise ValueError(f"{source}: feature shapes differ between shards: {sorted(shapes)}")
    return Table(np.concatenate([t.x for t in tables]), np.concatenate([t.y for t in tables]))


def parse_npz(data: BinaryIO | str, source: str) -> Table:
    try:
        with np.load(data, allow_pickle=False) as archive:
            if not isinstance(archive, np.lib.npyio.NpzFile):
                raise ValueError("it holds a single .npy array, not a zip archive of arrays")
            if "x" not in archive or "y" not in archive:
                raise DataFileError(f"{source}: an .npz shard needs arrays 'x' and 'y', found {sorted(archive.files)}")
            x, y = archive["x"], archive["y"]
    except (DataFileError, *_NOT_DAMAGE):
        raise
    except _DAMAGE as err:
        raise build_data_file_error(source, ".npz", err) from err
    return build_table(x, y, source)


def parse_csv_text(text: str, source: str) -> Table:
    rows = [line for line in text.splitlines() if line.strip()]
    if not rows:
        return Table(np.zeros((0, 1), np.float32), np.zeros((0,), np.int64))
    try:
        table = np.loadtxt(io.StringIO("\n".join(rows)), delimiter=",", dtype=np.float64, ndmin=2)
    except ValueError as err:
        raise ValueError(f"{source}: not a numeric CSV without header: {err}") from None
    return parse_label_first(table, source)


def load_npy_whole(path: str) -> np.ndarray:
    """The array in an .npy file, which must hold exactly what its header declares. numpy reads
    as many bytes as the header's shape says and ignores the rest: one damaged digit of the
    shape, `(40, 6)` read as `( 0, 6)`, would load an empty table without a word."""
    with open(path, "rb") as f:
        if f.read(len(ZIP_MAGIC)) == ZIP_MAGIC:
            raise ValueError("it is a zip archive (.npz), not a single array")
        f.seek(0)
        array = np.lib.format.read_array(f, allow_pickle=False)
        declared_end = f.tell()
        size = os.fstat(f.fileno()).st_size
    if size != declared_end:
        raise ValueError(f"its header declares a {array.dtype} array of shape {array.shape} ({array.nbytes} bytes), "
                         f"and {size - declared_end} more bytes follow it")
    return array


def load_table_file(path: str) -> Table:
    """One shard; a damaged one is a DataFileError naming it and the format it should have."""
    if path.endswith(".npz"):
        return parse_npz(path, path)
    if path.endswith(".npy"):
        try:
            table = load_npy_whole(path)
        except _NOT_DAMAGE:
            raise
        except _DAMAGE as err:
            raise build_data_file_error(path, ".npy", err) from err
        return parse_label_first(table, path)
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise build_data_file_error(path, ".csv", err) from err
    return parse_csv_text(text, path)


def find_table_files(folder: str) -> list[str]:
    """Every shard under `folder` (recursively), in a fixed order: sorted relative paths."""
    found = []
    for root, dirs, files in os.walk(folder, followlinks=True):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [os.path.join(root, f) for f in files if f.endswith(SUFFIXES) and not f.startswith(".")]
    return sorted(found, key=lambda p: os.path.relpath(p, folder))


def load_table_folder(folder: str) -> Table:
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"channel folder {folder} does not exist")
    files = find_table_files(folder)
    if not files:
        raise ValueError(f"{folder}: no {', '.join(SUFFIXES)} files")
    return concat_tables([load_table_file(f) for f in files], folder)


def iter_recordio_payloads(stream: BinaryIO, source: str) -> Iterator[bytes]:
    """Unwrap MXNet RecordIO (what SageMaker's RecordWrapperType=RecordIO produces)."""
    parts: list[bytes] = []
    while True:
        header = stream.read(8)
        if not header:
            break
        if len(header) < 8:
            raise ValueError(f"{source}: truncated RecordIO header")
        magic, lrec = struct.unpack("<II", header)
        if magic != RECORDIO_MAGIC:
            raise ValueError(f"{source}: bad RecordIO magic {magic:#x}")
        cflag, length = lrec >> 29, lrec & ((1 << 29) - 1)
        payload = stream.read(length)
        if len(payload) < length:
            raise ValueError(f"{source}: truncated RecordIO record")
        stream.read((4 - length % 4) % 4)  # records are padded to 4 bytes
        parts.append(payload)
        if cflag in (0, 3):  # a whole record, or the last part of a split one
            yield b"".join(parts)
            parts = []
    if parts:
        raise ValueError(f"{source}: RecordIO stream ends inside a split record")


def parse_stream(stream: BinaryIO, source: str) -> Table:
    """One pass over a stream of concatenated .npy arrays, or of CSV text."""
    reader = _Reader(stream)
    head = reader.peek(len(NPY_MAGIC))
    if head.startswith(ZIP_MAGIC):
        raise ValueError(f"{source}: .npz cannot be streamed in Pipe mode; use .npy or CSV, or RecordIO wrapping")
    if head == NPY_MAGIC:
        tables = []
        while reader.peek(1):
            try:
                array = np.lib.format.read_array(reader, allow_pickle=False)
            except _DAMAGE as err:
                raise build_data_file_error(source, ".npy", err) from err
            tables.append(parse_label_first(array, source))
        return concat_tables(tables, source)
    try:
        text = reader.read().decode("utf-8")
    except UnicodeDecodeError as err:
        raise build_data_file_error(source, ".csv", err) from err
    return parse_csv_text(text, source)


def parse_object(payload: bytes, source: str) -> Table:
    if payload.startswith(ZIP_MAGIC):
        return parse_npz(io.BytesIO(payload), source)
    return parse_stream(io.BytesIO(payload), source)


def parse_pipe(stream: BinaryIO, source: str, record_wrapper: str) -> Table:
    if record_wrapper.lower() == "recordio":
        return concat_tables([parse_object(p, source) for p in iter_recordio_payloads(stream, source)], source)
    return parse_stream(stream, source)


class _Reader:
    """read() with a look-ahead, over any stream (a FIFO cannot seek back after sniffing).
    Deliberately not an io.BufferedReader: numpy would then read the file descriptor directly
    and skip what was peeked."""

    def __init__(self, stream: BinaryIO):
        self._stream, self._ahead = stream, b""

    def peek(self, n: int) -> bytes:
        while len(self._ahead) < n:
            more = self._stream.read(n - len(self._ahead))
            if not more:
                break
            self._ahead += more
        return self._ahead[:n]

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            data, self._ahead = self._ahead + self._stream.read(), b""
            return data
        data = self.peek(n)
        self._ahead = self._ahead[len(data):]
        return data

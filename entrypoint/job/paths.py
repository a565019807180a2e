"""Where things live under the SageMaker root (/opt/ml, or SAGEMAKER_BASE_DIR as the toolkit allows)."""

from __future__ import annotations

import os
from typing import NamedTuple

DEFAULT_BASE_DIR = "/opt/ml"


class MlPaths(NamedTuple):
    base: str
    # The user's code when it is not base/code: an SDK v3 job's `code` channel
    # (job/v3_definition.py), where v3's sm_train.sh cds to run it.
    code: str | None = None

    @property
    def input_dir(self) -> str:
        return os.path.join(self.base, "input")

    @property
    def input_config_dir(self) -> str:
        return os.path.join(self.input_dir, "config")

    @property
    def input_data_dir(self) -> str:
        return os.path.join(self.input_dir, "data")

    @property
    def code_dir(self) -> str:
        return self.code or os.path.join(self.base, "code")

    @property
    def model_dir(self) -> str:
        return os.path.join(self.base, "model")

    @property
    def output_dir(self) -> str:
        return os.path.join(self.base, "output")

    @property
    def output_data_dir(self) -> str:
        return os.path.join(self.output_dir, "data")

    @property
    def output_intermediate_dir(self) -> str:
        return os.path.join(self.output_dir, "intermediate")

    @property
    def failure_file(self) -> str:
        return os.path.join(self.output_dir, "failure")

    @property
    def success_file(self) -> str:
        return os.path.join(self.output_dir, "success")

    def config_file(self, name: str) -> str:
        return os.path.join(self.input_config_dir, name)

    def channel_dir(self, channel: str) -> str:
        return os.path.join(self.input_data_dir, channel)


def build_paths(environ: dict[str, str]) -> MlPaths:
    return MlPaths(base=environ.get("SAGEMAKER_BASE_DIR") or DEFAULT_BASE_DIR)


def open_regular(path: str, write: bool = False):
    """A file in a folder a script can write to (output/, output/data/, the ranks' report
    folder), opened as text only when it is a regular file. The script may have put a FIFO
    there under the name (opening one blocks until its other end opens: the entrypoint never
    exited), a device or a symbolic link (followed only when reading). Opened with O_NONBLOCK,
    checked with fstat, then made blocking again; anything else is an OSError naming the path.
    Writing truncates or creates it (mode 0666 less the umask, as open() would)."""
    import errno
    import stat

    not_regular = "not a regular file (a FIFO, device or link the script put there); not opened"
    flags = (os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW) if write else os.O_RDONLY
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    except OSError as exc:  # ENXIO: a FIFO nobody reads; ELOOP: a link (O_NOFOLLOW)
        raise OSError(exc.errno, not_regular, path) if exc.errno in (errno.ENXIO, errno.ELOOP) else exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, not_regular, path)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "w" if write else "r", encoding="utf-8", errors="replace")
    except BaseException:
        os.close(fd)
        raise

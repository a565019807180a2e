"""SageMaker input channels: File, FastFile and Pipe mode, and how ranks share the data.

- File / FastFile: a folder, SM_CHANNEL_<NAME> or <input>/data/<channel>.
- Pipe: a FIFO per epoch, <input>/data/<channel>_<n> with n counting from 0, each read once.
  n counts the passes this process has made, not the training epoch: after a resume at
  epoch 5 the first FIFO SageMaker gives the new container is still <channel>_0.
  One FIFO per host but several ranks per host: the host's local rank 0 drains it into a
  staging file (written whole, then renamed) that the host's other ranks read. The staging
  file lies in a folder of the launch's own (build_staging_folder: per user, launch and
  channel), made with mode 0700; a folder there that is not a private one of this user's (a
  link, another user's, one others can read) is refused, never used; it is removed with the
  last staged pass.
- Sharding: by default every rank sees the whole channel and takes its own slice of each
  global batch (see batches.py). With S3DistributionType ShardedByS3Key each host already
  holds a different part, so ranks split only among the ranks of their host.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
import time
from dataclasses import dataclass
from typing import Mapping

from train.records import Table, load_table_folder, parse_pipe

MODES = ("File", "FastFile", "Pipe")
DISTRIBUTIONS = ("FullyReplicated", "ShardedByS3Key")


@dataclass(frozen=True)
class ChannelConfig:
    name: str
    mode: str = "File"
    distribution: str = "FullyReplicated"
    content_type: str = ""
    record_wrapper: str = "None"


@dataclass(frozen=True)
class ShardPlan:
    index: int  # which of `count` parts of the channel's records this rank reads
    count: int
    group: str  # "world": split among all ranks; "host": split among this host's ranks


def parse_input_data_config(config: Mapping) -> dict[str, ChannelConfig]:
    channels = {}
    for name, entry in config.items():
        mode = entry.get("TrainingInputMode", "File")
        distribution = entry.get("S3DistributionType", "FullyReplicated")
        if mode not in MODES:
            raise ValueError(f"channel {name!r}: TrainingInputMode {mode!r} is not one of {', '.join(MODES)}")
        if distribution not in DISTRIBUTIONS:
            raise ValueError(f"channel {name!r}: S3DistributionType {distribution!r} is not one of "
                             f"{', '.join(DISTRIBUTIONS)}")
        channels[name] = ChannelConfig(name, mode, distribution, entry.get("ContentType", "") or "",
                                       entry.get("RecordWrapperType", "None") or "None")
    return channels


def load_input_data_config(environ: Mapping[str, str], input_config_dir: str) -> dict[str, ChannelConfig]:
    """SM_INPUT_DATA_CONFIG (the toolkit's export) or inputdataconfig.json; none: File mode."""
    raw = environ.get("SM_INPUT_DATA_CONFIG")
    source = "SM_INPUT_DATA_CONFIG"
    if not raw:
        source = os.path.join(input_config_dir, "inputdataconfig.json")
        try:
            with open(source, encoding="utf-8") as f:
                raw = f.read()
        except FileNotFoundError:
            return {}
    try:
        return parse_input_data_config(json.loads(raw))
    except json.JSONDecodeError as err:
        raise ValueError(f"{source} is not valid JSON: {err}") from None


def decide_channel_config(name: str, configs: Mapping[str, ChannelConfig]) -> ChannelConfig:
    return configs.get(name, ChannelConfig(name))


def decide_shard(distribution: str, rank: int, world_size: int, local_rank: int, local_world_size: int) -> ShardPlan:
    if distribution == "ShardedByS3Key":
        return ShardPlan(local_rank, local_world_size, "host")
    return ShardPlan(rank, world_size, "world")


def build_folder_path(name: str, environ: Mapping[str, str], input_data_dir: str) -> str:
    return environ.get(f"SM_CHANNEL_{name.upper()}") or os.path.join(input_data_dir, name)


def build_fifo_path(name: str, input_data_dir: str, pass_index: int) -> str:
    return os.path.join(input_data_dir, f"{name}_{pass_index}")


# Variables that differ between two launches (and two attempts of one: torchrun's restarts), so
# a stale staging file is never taken as ours.
_RUN_IDENTITY = ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "PMIX_NAMESPACE", "OMPI_MCA_orte_hnp_uri",
                 "MASTER_ADDR", "MASTER_PORT", "HOROVOD_GLOO_RENDEZVOUS_PORT", "TRAINING_JOB_NAME")


def build_staging_folder(input_data_dir: str, channel: str, environ: Mapping[str, str], uid: int,
                         staging_root: str) -> str:
    """The folder where a host's local rank 0 stages a Pipe-mode channel for the other local
    ranks: <staging_root>/byoc-pipe-<uid>-<digest>, the digest of the channel's FIFO folder
    (hosts emulated on one machine share /tmp but not FIFOs), its name and the launch. The same
    for every rank of a host, different between users, launches and channels."""
    run = "|".join(environ.get(k, "") for k in _RUN_IDENTITY)
    digest = hashlib.sha256(f"{os.path.abspath(input_data_dir)}|{channel}|{run}".encode()).hexdigest()[:20]
    return os.path.join(staging_root, f"byoc-pipe-{uid}-{digest}")


class StagingFolderError(RuntimeError):
    """The staging folder's path holds something that is not a private folder of this user's."""


def check_staging_folder(path: str) -> None:
    """A private folder of this user's (not a link, not another user's, mode 0700), or raise."""
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
        raise StagingFolderError(
            f"the Pipe-mode staging folder {path} is not a private folder of this user's (a link, another user's, "
            f"or others can read it): remove it, or set TMPDIR to a folder only this user can write")


def start_staging_folder(path: str) -> None:
    """Make `path` with mode 0700; one already there is taken only if it is a private folder of
    this user's (this launch's: the name is per user and launch)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    else:
        os.chmod(path, 0o700)  # whatever the umask
    check_staging_folder(path)


class ChannelReader:
    """Reads one channel, one pass at a time. File mode reads the folder once and keeps it."""

    def __init__(self, config: ChannelConfig, environ: Mapping[str, str], input_data_dir: str,
                 local_rank: int = 0, local_world_size: int = 1, timeout_s: float = 3600.0,
                 staging_root: str | None = None):
        self.config = config
        self.staging_folder = build_staging_folder(input_data_dir, config.name, environ, os.getuid(),
                                                   staging_root or tempfile.gettempdir())
        self._environ, self._input_data_dir = environ, input_data_dir
        self._local_rank, self._local_world_size = local_rank, local_world_size
        self._timeout_s = timeout_s
        self._passes = 0
        self._cached: Table | None = None
        self._staged: list[str] = []

    def load_pass(self) -> Table:
        """The records of the next pass (epoch)."""
        index, self._passes = self._passes, self._passes + 1
        if self.config.mode != "Pipe":
            if self._cached is None:
                self._cached = load_table_folder(build_folder_path(self.config.name, self._environ,
                                                                   self._input_data_dir))
            return self._cached
        fifo = build_fifo_path(self.config.name, self._input_data_dir, index)
        if self._local_world_size == 1:
            with open(fifo, "rb") as stream:
                return parse_pipe(stream, fifo, self.config.record_wrapper)
        return self._load_staged(fifo)

    def _load_staged(self, fifo: str) -> Table:
        staged = os.path.join(self.staging_folder, os.path.basename(fifo))
        if self._local_rank == 0:
            # Earlier passes are done by every local rank: each has since joined a collective step.
            self.release_staging()
            start_staging_folder(self.staging_folder)
            partial = f"{staged}.{os.getpid()}.partial"
            with open(fifo, "rb") as stream, open(partial, "wb") as out:
                while chunk := stream.read(1 << 20):
                    out.write(chunk)
            os.replace(partial, staged)
            self._staged.append(staged)
        else:
            deadline = time.monotonic() + self._timeout_s
            while True:
                try:
                    check_staging_folder(self.staging_folder)  # a folder it did not make: refused at once
                except FileNotFoundError:
                    pass  # not made yet
                else:
                    if os.path.exists(staged):
                        break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"local rank 0 did not stage {fifo} within {self._timeout_s:.0f} s")
                time.sleep(0.02)
        with open(staged, "rb") as stream:
            return parse_pipe(stream, fifo, self.config.record_wrapper)

    def release_staging(self) -> None:
        """Local rank 0: remove the passes it staged, and the staging folder with them."""
        for path in self._staged:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
        if self._staged:
            try:
                os.rmdir(self.staging_folder)
            except OSError:
                pass  # not empty (a pass cut short left its partial file) or gone
        self._staged.clear()

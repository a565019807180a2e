"""The job's own runtime folders: one per job, created exclusively, mode 0700, removed on every
way out the entrypoint survives.

Two jobs (or two containers sharing /run, or a 1-host MPI job and anything else on the machine)
must never read or write each other's SSH configuration, outcome files or host environment.
So each job works in `<BYOC_RUNTIME_DIR or /run/byoc>/job-<id>` and keeps what may be secret
(the private SSH key, the host's environment) in `/dev/shm/byoc-job-<id>` where /dev/shm is
memory-backed (ssh.decide_key_folder). The id is the same on every host of a job — the leader
writes the outcome into a worker's folder, and mpirun tells every rank where its host's
environment is — so it is derived from what every host is given (decide_job_id), not drawn
at random; a job of one host adds its entrypoint's process id, so two runs of one definition
on one machine (parallel tests, emulated jobs) each have their own.

Made whole under a name of its own (mode 0700, its owner file in it) and renamed into place only
where nothing is there (no symlink, no folder someone prepared is followed or used): a folder at
the job's path always names the entrypoint that made it, whenever a stop or a kill comes. A folder left by an entrypoint that was killed (SIGKILL, the OOM
killer) on this same host is taken over; one that belongs to a live entrypoint, or that this
host cannot tell about, is an error naming it.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import NamedTuple

from entrypoint.decide.specs import OWNER_FILE, RuntimeFiles, build_sha256_hex
from entrypoint.hosts import ssh

RUNTIME_BASE = "/run/byoc"  # BYOC_RUNTIME_DIR replaces it
PRIVATE_BASE = "/dev/shm"  # memory-backed in every container: the job's private folder goes here


def decide_private_name(base: str, job_id: str) -> str:
    """The name of the job's folder in /dev/shm. A runtime base other than the default (two
    entrypoints of one job definition on one machine, told apart with BYOC_RUNTIME_DIR) gets
    its own, so the setting separates both folders; every host of a job has the same base, so
    the name is the same on each (mpirun tells the ranks the path of their host's environment)."""
    if base == RUNTIME_BASE:
        return f"byoc-job-{job_id}"
    return f"byoc-{build_sha256_hex(base.encode())[:8]}-job-{job_id}"


def decide_runtime_files(base: str, job_id: str, mounts: list[tuple[str, str]]) -> RuntimeFiles:
    """The job's folders under base (pure): per-job files that are not secret (SSH
    configuration, the outcome) in base/job-<id>; the private key and the host's environment
    in this job's folder in memory-backed storage when there is one (ssh.decide_key_folder)."""
    folder = os.path.join(base, f"job-{job_id}")
    ssh_folder = os.path.join(folder, "ssh")
    key_folder, key_note = ssh.decide_key_folder(ssh_folder, mounts, os.path.join(PRIVATE_BASE, decide_private_name(base, job_id)))
    private_folder = os.path.dirname(key_folder) if key_folder != ssh_folder else ""
    return RuntimeFiles(folder, key_folder, private_folder, key_note)


def load_runtime_files(runtime_dir: str | None, job_id: str) -> RuntimeFiles:
    """runtime_dir (BYOC_RUNTIME_DIR, checked: settings.runtime_dir), else /run/byoc where /run
    is writable, else a folder of this user's under the temporary folder; and which mounts are
    memory-backed."""
    base = runtime_dir or ""
    if not base:
        if os.access(os.path.dirname(RUNTIME_BASE), os.W_OK):
            base = RUNTIME_BASE
        else:
            import tempfile  # rarely needed; it costs a few ms of every start-up

            base = os.path.join(tempfile.gettempdir(), f"byoc-{os.getuid()}")
    return decide_runtime_files(base, job_id, ssh.load_mounts())


class RuntimeDirError(Exception):
    """A job folder cannot be made ours (the message is one line naming it and the fix)."""


class Owner(NamedTuple):
    pid: int
    host: str


def decide_job_id(job_name: str, hosts: tuple[str, ...], hyperparameters_json: str, entrypoint: str = "") -> str:
    """16 hex digits, the same on every host of one job, different between jobs; entrypoint:
    what makes it this entrypoint's own (cli.decide_job_id_of: a 1-host job's process id)."""
    import json

    material = json.dumps([job_name, list(hosts), hyperparameters_json] + ([entrypoint] if entrypoint else []))
    return build_sha256_hex(b"byoc-job-id-v1\0" + material.encode("utf-8"))[:16]


def parse_owner(text: str) -> Owner | None:
    parts = text.split()
    if len(parts) != 2 or not parts[0].isdigit():
        return None
    return Owner(int(parts[0]), parts[1])


def decide_takeover(owner: Owner | None, my_host: str, pid_alive: bool) -> str | None:
    """None when a folder left there may be removed and made again; else why not."""
    if owner is None:
        return "it has no readable owner file (not made by this entrypoint, or cut short)"
    if owner.host != my_host:
        return f"it belongs to an entrypoint on {owner.host} (a container sharing this folder)"
    if pid_alive:
        return f"the entrypoint that made it (pid {owner.pid}) is still running"
    return None


def probe_pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def load_owner(folder: str) -> Owner | None:
    try:
        with open(os.path.join(folder, OWNER_FILE)) as f:
            return parse_owner(f.read(100))
    except OSError:
        return None


def start_job_folder(path: str) -> None:
    """Make `path` this job's folder: mode 0700, its parent a real folder, and its owner file in
    it from the moment it exists. It is made complete under a name of its own beside `path`,
    then renamed into place: a stop (or a kill) at any moment leaves either no folder at `path`
    or one whose owner file names this entrypoint (remove_job_folder removes it; a later job
    takes it over), never one without an owner, which nothing could remove."""
    parent = os.path.dirname(path)
    os.makedirs(parent, mode=0o755, exist_ok=True)
    info = os.lstat(parent)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise RuntimeDirError(f"{parent} is not a folder of this user's (a link, or another user's); "
                              f"set BYOC_RUNTIME_DIR to a folder only this user can write")
    # A name nobody else makes (12 random hex digits), so what is found there on the way out is ours.
    making = os.path.join(parent, f".{os.path.basename(path)}.new-{os.urandom(6).hex()}")
    try:
        os.mkdir(making, 0o700)
        os.chmod(making, 0o700)  # whatever the umask
        fd = os.open(os.path.join(making, OWNER_FILE), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"{os.getpid()} {os.uname().nodename}\n")  # gethostname(), without loading socket
        place_job_folder(making, path)
    finally:
        try:
            remove_tree(making)  # what a stop or an error left of it; nothing once it is in place
        except BaseException:  # a stop that came during this very removal (it is raised once): finish it
            remove_tree(making)
            raise


def place_job_folder(making: str, path: str) -> None:
    """Rename the finished folder to `path`. Nothing there: it is this job's. Anything there (a
    link, a file, a folder someone made): it is never followed or used; a folder left by a
    killed entrypoint of this job on this host is removed and the rename tried once more."""
    for attempt in (1, 2):
        if not os.path.lexists(path):  # rename would replace an empty folder: looked at first
            try:
                os.rename(making, path)
                return
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
                    raise
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            continue  # gone again meanwhile: the next attempt renames
        why = None
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            why = "it is not a folder of this user's"
        else:
            owner = load_owner(path)
            why = decide_takeover(owner, os.uname().nodename, owner is not None and probe_pid_alive(owner.pid))
        if why is not None or attempt == 2:
            raise RuntimeDirError(f"this job's runtime folder {path} already exists and {why or 'came back'}: "
                                  f"two entrypoints of the same job cannot share it; remove it, or set "
                                  f"BYOC_RUNTIME_DIR to another folder") from None
        remove_tree(path)  # left by a killed entrypoint of this job
    raise RuntimeDirError(f"this job's runtime folder {path} kept coming and going: two entrypoints of the same "
                          f"job cannot share it; set BYOC_RUNTIME_DIR to another folder")


def remove_job_folder(path: str) -> None:
    """On every way out: nothing of the job's runtime files outlives it. Only a folder this
    entrypoint made (its owner file names this process) is removed."""
    owner = load_owner(path)
    if owner is None or owner.pid != os.getpid():
        return
    remove_tree(path)


def remove_tree(path: str) -> None:
    """shutil.rmtree(path, ignore_errors=True) for the few files of a job folder, without
    shutil (it brings bz2 and lzma: ~1.5 ms of every start-up). Links are removed, never
    followed (a link given as the folder itself is removed, its target left alone)."""
    if os.path.islink(path):
        try:
            os.unlink(path)
        except OSError:
            pass
        return
    for folder, subfolders, files in os.walk(path, topdown=False):
        for name in files + subfolders:
            entry = os.path.join(folder, name)
            try:
                if name in files or os.path.islink(entry):
                    os.unlink(entry)
                else:
                    os.rmdir(entry)
            except OSError:
                pass
    try:
        os.rmdir(path)
    except OSError:
        pass

"""The user's code: where it comes from, what kind of entry point it is, what to install first.

`decide_*`/`build_*` are pure. `inspect_code` reads the code folder (or a local tarball's
member list) without changing anything; `fetch_code` puts the code in place (the one step here
that writes). Installing requirements is a step of the launch plan, run by orchestrate.py.
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple

from entrypoint.errors import JobDefinitionError

# The toolkit's rule (sagemaker_training.process): a plain relative path inside the code
# folder, no leading '-' or '/', no '.'/'..' segments, only these characters.
SAFE_PROGRAM = re.compile(r"^[A-Za-z0-9._][A-Za-z0-9._+-]*(/[A-Za-z0-9._+-]+)*$")


class CodeSource(NamedTuple):
    kind: str  # "code_dir" (already in place), "local_dir", "local_tar", "s3"
    uri: str | None


class CodeFacts(NamedTuple):
    """What the code folder holds. `known` is False when the code is still in S3 (dry run)."""

    known: bool
    program_exists: bool = False
    program_executable: bool = False
    shebang: tuple[str, ...] = ()  # interpreter argv from a "#!" line, if any
    installable: bool = False  # setup.py, or pyproject.toml with a [project] table
    has_requirements: bool = False
    # What stands under the program's name when it is not a file: "folder", "other" (a FIFO,
    # socket or device), or "" (nothing).
    program_not_a_file: str = ""


class EntryPoint(NamedTuple):
    kind: str  # "python_script", "python_package", "shell_script", "executable"
    program: str
    path: str  # absolute path of the program inside the code folder


def check_program_name(program: str | None) -> str:
    if not program:
        raise JobDefinitionError(
            "No training program is named. Set the sagemaker_program hyperparameter (the SDK "
            "does this from entry_point=) or the SAGEMAKER_PROGRAM environment variable to "
            "the script to run, relative to your source directory, e.g. train.py."
        )
    if not SAFE_PROGRAM.match(program) or any(p in (".", "..") for p in program.split("/")):
        raise JobDefinitionError(
            f"The training program {program!r} is not a plain relative path inside the source "
            f"directory (letters, digits, '._+-/', no leading '-' or '/', no '.' or '..' "
            f"segments). Name it like train.py or scripts/train.sh."
        )
    return program


def decide_code_source(submit_directory: object, code_dir: str, code_dir_empty: bool) -> CodeSource:
    """sagemaker_submit_directory, as the toolkit reads it: fetched only into an empty code
    folder (local mode mounts the code there, and then the submit directory is ignored)."""
    if submit_directory in (None, "") or not code_dir_empty:
        return CodeSource("code_dir", None)
    uri = str(submit_directory)
    if os.path.normpath(uri) == os.path.normpath(code_dir):
        return CodeSource("code_dir", None)
    if uri.startswith("s3://"):
        return CodeSource("s3", uri)
    if uri.endswith((".tar.gz", ".tgz", ".tar")):
        return CodeSource("local_tar", uri)
    return CodeSource("local_dir", uri)


def parse_shebang(first_line: bytes) -> tuple[str, ...]:
    """Interpreter argv the kernel would use: the path and at most one argument."""
    if not first_line.startswith(b"#!"):
        return ()
    text = first_line[2:].decode("utf-8", "replace").strip()
    if not text:
        return ()
    parts = text.split(None, 1)
    return tuple(parts)


def decide_entry_point(program: str, code_dir: str, facts: CodeFacts) -> EntryPoint:
    """The toolkit's order: .sh is a command; a folder with setup.py is a package; .py is a
    script; anything else is a command."""
    path = os.path.join(code_dir, program)
    if facts.known and not facts.program_exists and not (facts.installable and not program.endswith(".sh")):
        what = {"folder": "is a folder, not a file,", "other": "is not a regular file (a FIFO, socket or device)"}.get(
            facts.program_not_a_file, "does not exist")
        raise JobDefinitionError(
            f"The training program {program} {what} in the source directory "
            f"({code_dir}). Check entry_point= and source_dir= in the estimator"
            + (f": entry_point names the script to run, e.g. {program}/train.py." if what.startswith("is a folder")
               else "."))
    if program.endswith(".sh"):
        return EntryPoint("shell_script", program, path)
    if facts.installable:
        return EntryPoint("python_package", program, path)
    if program.endswith(".py") or not facts.known:
        return EntryPoint("python_script", program, path)
    return EntryPoint("executable" if facts.program_executable or facts.shebang else "shell_script", program, path)


def build_program_argv(
    entry: EntryPoint, python: str, facts: CodeFacts, args: tuple[str, ...], record_errors: str
) -> tuple[str, ...]:
    """The command one rank runs (no launcher). Python programs run under record_errors (a
    file path, not `-m`, so nothing in the code folder can shadow it), which records the
    first exception for the failure report and then behaves like `python script.py`."""
    if entry.kind == "python_script":
        return (python, record_errors, entry.path, *args)
    if entry.kind == "python_package":
        module = entry.program[:-3] if entry.program.endswith(".py") else entry.program
        return (python, record_errors, "-m", module.replace("/", "."), *args)
    # Run through the script's own interpreter line rather than chmod'ing the user's file
    # (local mode mounts it, possibly read-only); no shell parses the arguments.
    if facts.shebang:
        return (*facts.shebang, entry.path, *args)
    if entry.kind == "executable":
        return (entry.path, *args)
    return ("/bin/sh", entry.path, *args)


def build_install_steps(python: str, code_dir: str, facts: CodeFacts) -> tuple[tuple[str, ...], ...]:
    pip = (python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input")
    steps = []
    if facts.has_requirements:
        steps.append((*pip, "-r", os.path.join(code_dir, "requirements.txt")))
    if facts.installable:
        steps.append((*pip, code_dir))
    return tuple(steps)


# --- reading the code folder (I/O, read-only) ----------------------------------------------


def _is_installable(names: set[str], read) -> bool:
    if "setup.py" in names:
        return True
    if "pyproject.toml" in names:
        import tomllib  # only for a code folder with a pyproject.toml (start-up cost)

        try:
            return "project" in tomllib.loads(read("pyproject.toml").decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            return False
    return False


def inspect_code(source: CodeSource, code_dir: str, program: str) -> CodeFacts:
    if source.kind == "s3":
        return CodeFacts(known=False)
    if source.kind == "local_tar":
        return _inspect_tar(source.uri, program)
    folder = code_dir if source.kind == "code_dir" else source.uri
    return _inspect_folder(folder, program)


def _inspect_folder(folder: str, program: str) -> CodeFacts:
    try:
        names = set(os.listdir(folder))
    except OSError:
        names = set()
    path = os.path.join(folder, program)

    def read(name: str) -> bytes:
        with open(os.path.join(folder, name), "rb") as f:
            return f.read()

    first_line = b""
    exists = os.path.isfile(path)
    not_a_file = "" if exists or not os.path.lexists(path) else "folder" if os.path.isdir(path) else "other"
    if exists:
        with open(path, "rb") as f:
            first_line = f.readline(512)
    return CodeFacts(
        known=True,
        program_exists=exists,
        program_executable=exists and os.access(path, os.X_OK),
        shebang=parse_shebang(first_line),
        installable=_is_installable(names, read),
        has_requirements="requirements.txt" in names,
        program_not_a_file=not_a_file,
    )


def _inspect_tar(tar_path: str, program: str) -> CodeFacts:
    import tarfile  # only for a sourcedir.tar.gz (start-up cost)

    try:
        with tarfile.open(tar_path) as tar:
            members = {os.path.normpath(m.name): m for m in tar.getmembers()}
            top = {n for n in members if "/" not in n}

            def read(name: str) -> bytes:
                f = tar.extractfile(members[name])
                return f.read() if f else b""

            member = members.get(os.path.normpath(program))
            first_line = b""
            if member is not None and member.isfile():
                f = tar.extractfile(member)
                first_line = f.readline(512) if f else b""
            return CodeFacts(
                known=True,
                program_exists=member is not None and member.isfile(),
                program_executable=member is not None and bool(member.mode & 0o111),
                shebang=parse_shebang(first_line),
                installable=_is_installable(top, read),
                has_requirements="requirements.txt" in top,
                program_not_a_file="" if member is None or member.isfile() else "folder" if member.isdir() else "other",
            )
    except (OSError, EOFError, tarfile.TarError) as exc:  # EOFError: a truncated gzip stream
        raise JobDefinitionError(
            f"sagemaker_submit_directory {tar_path} is not a readable tar archive ({exc})."
        ) from None


def fetch_code(source: CodeSource, code_dir: str) -> None:
    """Put the user's code into code_dir: a copy of a local folder, or an archive (local or
    S3) extracted with the checks of archive.py."""
    from entrypoint.job.archive import extract_tar  # only jobs whose code arrives as an archive

    os.makedirs(code_dir, exist_ok=True)
    if source.kind == "local_dir":
        import shutil

        shutil.copytree(source.uri, code_dir, dirs_exist_ok=True, symlinks=True)
    elif source.kind == "local_tar":
        extract_tar(source.uri, code_dir)
    elif source.kind == "s3":
        import boto3  # only when code comes from S3: boto3 costs ~0.3 s to import

        bucket, _, key = source.uri[len("s3://"):].partition("/")
        client = boto3.client("s3", endpoint_url=os.environ.get("S3_ENDPOINT_URL") or None)
        import tempfile  # only when the code is fetched: it costs every start-up a few ms

        with tempfile.TemporaryDirectory() as tmp:
            archive = os.path.join(tmp, "sourcedir.tar.gz")
            client.download_file(bucket, key, archive)
            extract_tar(archive, code_dir)

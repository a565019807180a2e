"""Reading Dockerfiles, docker/versions.env and the installer scripts, for the image tests.

Pure parsing (parse_*) over text, plus load_* that read the repository's files. Only as
much of the Dockerfile syntax as our Dockerfiles use: instructions, line continuations,
comments, `FROM image AS name`, ARG/ENV/COPY.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

DOCKERFILES = {
    "cpu": REPO_ROOT / "docker" / "Dockerfile.cpu",
    "gpu": REPO_ROOT / "Dockerfile.gpu",
    "trn1": REPO_ROOT / "Dockerfile.trn1",
}
VERSIONS_FILE = REPO_ROOT / "docker" / "versions.env"
SCRIPTS_DIR = REPO_ROOT / "docker" / "scripts"
BUILD_SCRIPT_DIR = "/usr/local/byoc/build/"

_VAR = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")


@dataclasses.dataclass(frozen=True)
class Instruction:
    line: int
    keyword: str
    args: str
    comments: tuple[str, ...]  # the comment lines right above it


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str
    base: str
    instructions: tuple[Instruction, ...]


@dataclasses.dataclass(frozen=True)
class Dockerfile:
    global_args: tuple[str, ...]
    stages: tuple[Stage, ...]

    def stage(self, name: str) -> Stage:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(name)

    def all_instructions(self) -> list[Instruction]:
        return [i for stage in self.stages for i in stage.instructions]


def parse_instructions(text: str) -> list[Instruction]:
    """Instructions with continuations joined and the comment block above each."""
    out: list[Instruction] = []
    comments: list[str] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not pending:
            if not line:
                comments = []
                continue
            if line.startswith("#"):
                comments.append(line)
                continue
            start = number
        elif line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending.append(line[:-1].strip())
            continue
        pending.append(line)
        joined = " ".join(p for p in pending if p)
        keyword, _, args = joined.partition(" ")
        out.append(Instruction(start, keyword.upper(), args.strip(), tuple(comments)))
        pending, comments = [], []
    if pending:
        raise ValueError("the Dockerfile ends inside a continued line")
    return out


def parse_dockerfile(text: str) -> Dockerfile:
    global_args: list[str] = []
    stages: list[Stage] = []
    current: list[Instruction] | None = None
    name = base = ""
    for instruction in parse_instructions(text):
        if instruction.keyword == "FROM":
            if current is not None:
                stages.append(Stage(name, base, tuple(current)))
            words = instruction.args.split()
            if len(words) != 3 or words[1].upper() != "AS":
                raise ValueError(f"line {instruction.line}: FROM without a stage name")
            base, name, current = words[0], words[2], []
        elif current is None:
            if instruction.keyword != "ARG":
                raise ValueError(f"line {instruction.line}: {instruction.keyword} before FROM")
            global_args.append(parse_arg_name(instruction.args))
        else:
            current.append(instruction)
    if current is not None:
        stages.append(Stage(name, base, tuple(current)))
    return Dockerfile(tuple(global_args), tuple(stages))


def parse_arg_name(args: str) -> str:
    return args.split("=", 1)[0].strip()


def parse_env_names(args: str) -> list[str]:
    """Names set by `ENV A=1 B="x y"` (the only ENV form our Dockerfiles use)."""
    return [word.split("=", 1)[0] for word in shlex.split(args)]


def parse_variables(text: str) -> set[str]:
    return set(_VAR.findall(text))


def parse_versions(text: str) -> dict[str, str]:
    """docker/versions.env: KEY=VALUE lines, comments and blank lines; raises on anything else."""
    pins: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Z][A-Z0-9_]*)=(.*)", line)
        if not match:
            raise ValueError(f"versions.env line {number}: not KEY=VALUE: {line!r}")
        key, value = match.groups()
        if key in pins:
            raise ValueError(f"versions.env line {number}: {key} set twice")
        if value != value.strip() or '"' in value or "'" in value or "$" in value:
            raise ValueError(f"versions.env line {number}: quotes, $ or edge spaces in {key}")
        pins[key] = value
    return pins


def build_args_for(pins: dict[str, str], flavor: str) -> dict[str, str]:
    """What docker/build.sh passes for a flavour: COMMON_X and <FLAVOR>_X as X."""
    prefix = flavor.upper() + "_"
    args: dict[str, str] = {}
    for key, value in pins.items():
        if key.startswith("COMMON_"):
            args[key.removeprefix("COMMON_")] = value
        elif key.startswith(prefix):
            args[key.removeprefix(prefix)] = value
    return args


def parse_required_env(script_text: str) -> set[str]:
    """Variables a script insists on: `: "${NAME:?...}"`."""
    return set(re.findall(r"\$\{([A-Z][A-Z0-9_]*):\?", script_text))


def parse_called_scripts(run_args: str) -> list[str]:
    """Names of docker/scripts/* that a RUN calls."""
    return re.findall(re.escape(BUILD_SCRIPT_DIR) + r"([A-Za-z0-9_.-]+\.sh)", run_args)


def load_dockerfile(flavor: str) -> Dockerfile:
    return parse_dockerfile(DOCKERFILES[flavor].read_text())


def load_versions() -> dict[str, str]:
    return parse_versions(VERSIONS_FILE.read_text())

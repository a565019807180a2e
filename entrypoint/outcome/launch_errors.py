"""Why a process could not be started, in one line a user can act on.

The kernel and Python report a failed start as an exception (E2BIG, ENOENT for a missing
`#!` interpreter, EACCES, "embedded null byte", "illegal environment variable name", a lone
surrogate's UnicodeEncodeError) whose
text names neither the hyperparameter nor the variable at fault. These functions are pure:
they take the argv and environment that were refused and the exception, and name the cause."""

from __future__ import annotations

import errno
import os

# Where a value's size is worth naming: the biggest values are the likely culprits of E2BIG.
_LARGE_VALUE_BYTES = 8192


def _size(text: str) -> int:
    return len(text.encode("utf-8", "surrogateescape")) + 1


def _argument(argv: list[str], i: int) -> str:
    """`argument 4 (the value of --lr)`: the hyperparameter an argument belongs to, where it shows."""
    before = argv[i - 1] if i > 0 else ""
    named = before.startswith("-") and len(before) < 200 and _encodable(before) and "\0" not in before
    return f"argument {i} (the value of {before})" if named else f"argument {i}"


def _encodable(text: str) -> bool:
    """What os.fsencode takes: any text, and the bytes of a non-UTF-8 name (surrogateescape)."""
    try:
        text.encode("utf-8", "surrogateescape")
        return True
    except UnicodeEncodeError:
        return False


def _largest_values(argv: list[str], env: dict[str, str]) -> str:
    sizes = [(_size(v), f"argument {i}") for i, v in enumerate(argv)]
    sizes += [(_size(k) + _size(v), f"environment variable {k}") for k, v in env.items()]
    big = sorted((s for s in sizes if s[0] >= _LARGE_VALUE_BYTES), reverse=True)[:3]
    if not big:
        return ""
    return "; the largest: " + ", ".join(f"{name} ({size:,} bytes)" for size, name in big)


def describe_launch_error(argv: list[str], env: dict[str, str], error: BaseException, shebang: bool = False) -> str:
    """One line: which process could not start, and what to change."""
    program = argv[0] if argv else "?"
    if isinstance(error, ValueError) and "null byte" in str(error):
        where = [_argument(argv, i) for i, v in enumerate(argv) if "\0" in v]
        where += [f"environment variable {k}" for k, v in env.items() if "\0" in k or "\0" in v]
        return (f"could not start {program}: a NUL byte in {', '.join(where) or 'a value'} "
                "(the kernel cannot pass one); remove it from the hyperparameter or variable")
    if isinstance(error, UnicodeEncodeError):  # a lone surrogate: JSON "\ud800" decodes to one
        where = [_argument(argv, i) for i, v in enumerate(argv) if not _encodable(v)]
        where += [f"environment variable {k}" for k, v in env.items() if not (_encodable(k) and _encodable(v))]
        return (f"could not start {program}: a lone surrogate (U+{ord(error.object[error.start]):04X}, half of a "
                f"UTF-16 pair with no other half) in {', '.join(where) or 'a value'}, which is not text a process "
                "can be given; write the character itself, or both halves of its \\uXXXX pair, in the "
                "hyperparameter or variable")
    if isinstance(error, ValueError) and "environment variable name" in str(error):
        bad = [k for k in env if "=" in k or not k]
        return (f"could not start {program}: environment variable name(s) {', '.join(repr(k) for k in bad) or '?'} "
                "cannot be passed to a process (a name must not be empty or contain '=')")
    if isinstance(error, OSError):
        if error.errno == errno.E2BIG:
            total = sum(map(_size, argv)) + sum(_size(k) + _size(v) for k, v in env.items())
            return (f"could not start {program}: its arguments and environment ({total:,} bytes) are too large "
                    f"for the kernel (E2BIG){_largest_values(argv, env)}; pass large values in a file "
                    "(an input channel) instead of a hyperparameter or environment variable")
        if error.errno == errno.ENOENT:
            hint = " (the interpreter named on the program's #! line)" if shebang else ""
            return f"could not start {program}{hint}: no such file"
        if error.errno in (errno.EACCES, errno.EPERM):
            return f"could not start {program}: permission denied (is it executable? chmod +x)"
        if error.errno == errno.ENOEXEC:
            return f"could not start {program}: not a program this machine can run (no #! line, or another architecture)"
        return f"could not start {program}: {os.strerror(error.errno) if error.errno else error}"
    return f"could not start {program}: {error}"

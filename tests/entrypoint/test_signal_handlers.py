"""Every function entrypoint/ passes to signal.signal only posts an event on the host's loop
(entrypoint/loop/): read from the code (its AST), not from a list kept by hand. A handler that
writes nests under a burst of signals and wedges on a slow log pipe; one that raises cuts
whatever runs (issue 49)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENTRYPOINT = REPO / "entrypoint"


def is_signal_signal(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "signal"
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "signal")


def only_posts(body: ast.AST) -> bool:
    """An expression that is one call of `<something>.post(...)`."""
    return isinstance(body, ast.Call) and isinstance(body.func, ast.Attribute) and body.func.attr == "post"


def function_body(node: ast.FunctionDef) -> list[ast.stmt]:
    body = list(node.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    return body


def find_handlers(tree: ast.Module) -> list[tuple[int, str, ast.AST | None]]:
    """(line, how it is named, what it resolves to) for each handler passed to signal.signal in
    the module: a lambda, a function or method of the module (by name), a name bound to a
    lambda in the same function, or a handler put back (a name bound from signal.signal's
    return: the one that was there before)."""
    functions = {node.name: node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    found = []
    for scope in [tree, *[n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]]:
        lambdas, saved = {}, set()
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                if isinstance(node.value, ast.Lambda):
                    lambdas[node.targets[0].id] = node.value
                elif any(is_signal_signal(n) for n in ast.walk(node.value)):
                    saved.add(node.targets[0].id)
            if isinstance(node, ast.For) and isinstance(node.iter, ast.Call) and \
                    isinstance(node.iter.func, ast.Attribute) and isinstance(node.iter.func.value, ast.Name) and \
                    node.iter.func.value.id in saved and isinstance(node.target, ast.Tuple):
                saved.update(e.id for e in node.target.elts if isinstance(e, ast.Name))
        for node in ast.walk(scope):
            if not is_signal_signal(node) or len(node.args) < 2 or (scope is tree and node.lineno in
                                                                     {f[0] for f in found}):
                continue
            handler = node.args[1]
            if isinstance(handler, ast.Lambda):
                found.append((node.lineno, "lambda", handler))
            elif isinstance(handler, ast.Name) and handler.id in lambdas:
                found.append((node.lineno, handler.id, lambdas[handler.id]))
            elif isinstance(handler, ast.Name) and handler.id in saved:
                found.append((node.lineno, handler.id, None))  # put back
            elif isinstance(handler, ast.Attribute) and handler.attr in ("SIG_IGN", "SIG_DFL"):
                found.append((node.lineno, handler.attr, None))
            else:
                name = handler.attr if isinstance(handler, ast.Attribute) else getattr(handler, "id", "?")
                found.append((node.lineno, name, functions.get(name)))
    return sorted(set(found), key=lambda f: f[0])


def test_every_signal_handler_of_the_entrypoint_only_posts():
    checked, wrong = [], []
    for path in sorted(ENTRYPOINT.rglob("*.py")):
        for line, name, target in find_handlers(ast.parse(path.read_text())):
            where = f"{path.relative_to(REPO)}:{line} {name}"
            if target is None and name in ("SIG_IGN", "SIG_DFL"):
                continue
            if target is None and name not in ("SIG_IGN", "SIG_DFL"):
                if any(name == f for f in ("handler", "previous")):
                    continue  # the handler that was there before, put back
                wrong.append(f"{where}: not found")
                continue
            checked.append(where)
            if isinstance(target, ast.Lambda):
                ok = only_posts(target.body)
            else:
                body = function_body(target)
                ok = len(body) == 1 and isinstance(body[0], ast.Expr) and only_posts(body[0].value)
            if not ok:
                wrong.append(f"{where}: does more than post")
    assert wrong == []
    # The handlers the entrypoint has: the stop token's (SIGTERM/SIGINT/SIGHUP) and SIGUSR1's,
    # the run's SIGCHLD (the MPI worker's leader asks on the job port now). No SIGALRM:
    # finishing arms no timer.
    assert len(checked) >= 3, checked
    assert not any("SIGALRM" in path.read_text() for path in ENTRYPOINT.rglob("*.py"))


def test_the_reader_of_the_handlers_tells_a_handler_that_writes():
    tree = ast.parse("""
import signal
def writes(signum, frame):
    log("hello")
def posts(signum, frame):
    '''a docstring'''
    loop.post(Thing())
def install(loop):
    signal.signal(signal.SIGTERM, writes)
    signal.signal(signal.SIGUSR1, posts)
    signal.signal(signal.SIGCHLD, lambda s, f: loop.post(ChildExited()))
    signal.signal(signal.SIGHUP, lambda s, f: print("x"))
    posting = lambda s, f: loop.post(Asked(s))
    previous = {sig: signal.signal(sig, posting) for sig in (1, 2)}
    for sig, handler in previous.items():
        signal.signal(sig, handler)
""")
    found = {(name, None if target is None else (only_posts(target.body) if isinstance(target, ast.Lambda) else
                                                 only_posts(function_body(target)[0].value)))
             for _, name, target in find_handlers(tree)}
    assert found == {("writes", False), ("posts", True), ("lambda", True), ("lambda", False), ("posting", True),
                     ("handler", None)}

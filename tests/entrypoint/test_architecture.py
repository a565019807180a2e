"""The launch code's rules, read from its meaning (the AST), not its text: what carries an
event and who takes it, how a restart's word is compared, where a stop's exit code is made,
which waits are the loop's, which modules start threads, and what the orchestrator reads of a
role. Each rule's reader is shown to tell a breach on a small sample first."""

from __future__ import annotations

import ast
import sys
from pathlib import Path
import pytest

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "entrypoint"
sys.path.insert(0, str(REPO))

from entrypoint.loop import events  # noqa: E402


def modules() -> dict[str, ast.Module]:
    return {str(p.relative_to(PACKAGE)): ast.parse(p.read_text(), str(p)) for p in sorted(PACKAGE.rglob("*.py"))}


def name_of(node: ast.AST) -> str | None:
    """The last name of a Name or an Attribute (job_port.Refused -> Refused)."""
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def event_types() -> set[str]:
    return {n.name for n in ast.parse((PACKAGE / "loop" / "events.py").read_text()).body
            if isinstance(n, ast.ClassDef) and any(name_of(b) == "NamedTuple" for b in n.bases)}


# --- events: one module defines them; each has a handler ------------------------------------


def find_posted(tree: ast.Module) -> set[str]:
    """The types of what is posted: `x.post(T(...))`, `post(T(...))`, `self._post(T(...))`."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and name_of(node.func) in ("post", "_post") and node.args and \
                isinstance(node.args[0], ast.Call):
            found.add(name_of(node.args[0].func))
    return found - {None}


def find_registered(tree: ast.Module) -> set[str]:
    """The types handlers are registered for: the keys of `x.on({...})` and `x.also({...})`."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and name_of(node.func) in ("on", "also") and node.args and \
                isinstance(node.args[0], ast.Dict):
            found.update(name_of(key) for key in node.args[0].keys if key is not None)
    return found - {None}


def test_the_readers_of_posts_and_handlers_see_every_shape():
    tree = ast.parse("loop.post(StopRequested(1))\nself._post(job_port.Refused('a', 'b'))\npost(Delivered(h, 1))\n"
                     "loop.post(event)\nloop.on({PeerLost: f, job_port.HostDone: g})\nloop.also({StopRequested: h})\n")
    assert find_posted(tree) == {"StopRequested", "Refused", "Delivered"}
    assert find_registered(tree) == {"PeerLost", "HostDone", "StopRequested"}


def test_every_event_posted_or_taken_is_defined_in_the_events_module():
    defined = event_types()
    posted = {(name, kind) for name, tree in modules().items() for kind in find_posted(tree)}
    registered = {(name, kind) for name, tree in modules().items() for kind in find_registered(tree)}
    assert {kind for _, kind in posted} >= {"StopRequested", "StacksRequested", "ChildExited", "PeerLost"}
    assert not {(n, k) for n, k in posted | registered if k not in defined}
    elsewhere = {f"{name}: {node.name}" for name, tree in modules().items() if name != "loop/events.py"
                 for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
                 and node.name in defined}
    assert not elsewhere, elsewhere


def test_every_event_but_a_wake_up_has_a_handler_somewhere():
    """An event none takes is logged once (host_loop.dispatch); one that no module registers
    for at all is a defect of the contract. RankOutputOpens is read by the pump, never posted."""
    registered = {kind for tree in modules().values() for kind in find_registered(tree)}
    wake_ups = {kind.__name__ for kind in events.WAKE_UPS}
    never_posted = {"RankOutputOpens"}
    posted = {kind for tree in modules().values() for kind in find_posted(tree)}
    assert not never_posted & posted
    missing = event_types() - registered - wake_ups - never_posted
    assert not missing, missing
    assert not wake_ups & registered, "a wake-up needs no handler: the wait reads its condition"


# --- a restart's word is an enum; a stop's exit code is one function ----------------------------


def find_word_text_compares(tree: ast.Module) -> list[int]:
    """Lines that compare a `.word` with a string, or make an AttemptWord from one."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(name_of(s) == "word" for s in sides) and \
                    any(isinstance(s, ast.Constant) and isinstance(s.value, str) for s in sides):
                found.append(node.lineno)
        if isinstance(node, ast.Call) and name_of(node.func) == "AttemptWord" and node.args and \
                isinstance(node.args[0], ast.Constant):
            found.append(node.lineno)
    return found


def test_a_restart_word_is_never_compared_as_text():
    sample = ast.parse('if word.word == "start": pass\nif "end" != self.board.word.word: pass\n'
                       'AttemptWord("stop", 1, h)\nif word.word is Word.START: pass\nAttemptWord(Word.END, 1, h)\n')
    assert find_word_text_compares(sample) == [1, 2, 3]
    found = {f"{name}:{line}" for name, tree in modules().items() for line in find_word_text_compares(tree)}
    assert not found, found


def find_signal_exit_arithmetic(tree: ast.Module) -> list[int]:
    """`128 + x`, `x + 128` or `128 - x` (x a negative returncode): the exit code of a signal,
    made by hand."""
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub))
            and any(isinstance(side, ast.Constant) and side.value == 128 for side in (node.left, node.right))]


def test_a_stop_exit_code_is_made_in_one_function():
    from entrypoint.outcome.stops import decide_stop_exit_code

    assert find_signal_exit_arithmetic(ast.parse("code = 128 + signum\nx = n + 128\ny = 128 - n\nz = n * 128\n")) == [1, 2, 3]
    found = {name for name, tree in modules().items() if find_signal_exit_arithmetic(tree)}
    assert not found, found
    import signal

    assert decide_stop_exit_code(signal.SIGTERM) == decide_stop_exit_code("SIGTERM") == 143
    assert decide_stop_exit_code(2) == decide_stop_exit_code("SIGINT") == 130
    assert decide_stop_exit_code("SIGHUP") == 129


# --- waits: the loop's, and no Event nobody sets --------------------------------------------


def find_idle_event_waits(tree: ast.Module) -> list[str]:
    """Events waited on that nothing in the module sets: a pause in disguise (an Event's wait
    is a thread's own interruptible pause only when its owner can end it)."""
    made = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and name_of(node.value.func) == "Event":
            made.update(name_of(target) for target in node.targets)
    waited = {name_of(n.func.value) for n in ast.walk(tree) if isinstance(n, ast.Call)
              and isinstance(n.func, ast.Attribute) and n.func.attr == "wait" and name_of(n.func.value) in made}
    set_ = {name_of(n.func.value) for n in ast.walk(tree) if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute) and n.func.attr == "set"}
    # An Event handed to a function that sets it (watch_ports(give_up=...)) is set by its owner.
    passed = {name_of(a) for n in ast.walk(tree) if isinstance(n, ast.Call) for a in n.args}
    return sorted(waited - set_ - passed)


def test_no_wait_is_on_an_event_that_nothing_sets():
    sample = ast.parse("idle = threading.Event()\nidle.wait(1)\nself._stop = threading.Event()\n"
                       "self._stop.wait(2)\ndef close(self): self._stop.set()\n")
    assert find_idle_event_waits(sample) == ["idle"]
    found = {f"{name}: {n}" for name, tree in modules().items() if not name.startswith("rank/")
             for n in find_idle_event_waits(tree)}
    assert not found, found


# --- threads and timers: how many, and never a role's ---------------------------------------


# A thread is state the loop does not see, and a timer a wait it does not own: each is counted,
# outside rank/ (the user's processes, not the entrypoint's). What starts one: the loop's steps
# beside it (run_beside); the job port's reader, its senders, the peer watches; the leader's
# reader of its workers' rank output, a worker's stream of its own, the follower of mpirun's
# files; the run's output pumps; the report's one thread; the compile cache's writer.
MOST_THREAD_SITES = 10
# A wait with a timeout outside the loop: a timer the loop does not own. Those left keep a pace
# of their own off the loop: the report's samples, the peer watches' probes, the follower of the
# ranks' files; and a process given its grace period (processes.stop_process).
MOST_TIMED_WAITS = 4


def find_thread_starts(tree: ast.Module) -> list[int]:
    """threading.Thread / Timer calls, and _thread.start_new_thread (the low-level way)."""
    return sorted(n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call)
                  and name_of(n.func) in ("Thread", "Timer", "start_new_thread"))


def outside_rank(name: str) -> bool:
    return not name.startswith("rank/")


def test_at_most_ten_places_start_a_thread_and_none_is_a_role_or_the_orchestrator():
    sample = "threading.Thread(target=f).start()\nThread(target=g)\nt.start()\n_thread.start_new_thread(h, ())\n"
    assert find_thread_starts(ast.parse(sample)) == [1, 2, 4]
    sites = [f"{name}:{line}" for name, tree in modules().items() if outside_rank(name)
             for line in find_thread_starts(tree)]
    assert len(sites) <= MOST_THREAD_SITES, sites
    assert not [s for s in sites if s.startswith("roles/") or s.split(":")[0] in ("orchestrate.py", "cli.py")]


def find_timed_waits(tree: ast.Module) -> list[int]:
    """`x.wait(...)` with an argument, on anything but the loop (`loop.wait(until, deadline)`
    is the loop's own wait: its deadline is the loop's)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "wait" and \
                (node.args or node.keywords) and name_of(node.func.value) != "loop":
            found.append(node.lineno)
    return sorted(found)


def test_at_most_four_timed_waits_outside_the_loop():
    sample = "stop.wait(1.0)\nself._stop.wait(timeout=2)\nloop.wait(done, deadline)\nself.loop.wait(d)\nt.wait()\n"
    assert find_timed_waits(ast.parse(sample)) == [1, 2]
    waits = [f"{name}:{line}" for name, tree in modules().items() if outside_rank(name) and not name.startswith("loop/")
             for line in find_timed_waits(tree)]
    assert len(waits) <= MOST_TIMED_WAITS, waits


# --- who owns a host's state: Host, the roles flat beside it --------------------------------------


def class_bases(trees: dict[str, ast.Module]) -> dict[str, tuple[str, list[str]]]:
    """Each class of entrypoint/: (its module, the names of its bases)."""
    return {node.name: (name, [name_of(b) for b in node.bases]) for name, tree in trees.items()
            for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}


def class_depth(classes: dict, name: str) -> int:
    """1 for a class whose bases are none of entrypoint's; one more for each of its own above it."""
    if name not in classes:
        return 0
    return 1 + max([class_depth(classes, b) for b in classes[name][1] if b != name] or [0])


def self_attributes(node: ast.ClassDef) -> set[str]:
    """The names a class's methods set on self (self.x = ..., self.x += ..., self.x: T = ...)."""
    found = set()
    for n in ast.walk(node):
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, (ast.AugAssign,
                                                                                             ast.AnnAssign)) else []
        for target in targets:
            for t in ast.walk(target):
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    found.add(t.attr)
    return found


def class_nodes(trees: dict[str, ast.Module]) -> dict[str, ast.ClassDef]:
    return {node.name: node for tree in trees.values() for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}


def attributes_with_inherited(classes: dict, nodes: dict, name: str) -> set[str]:
    if name not in nodes:
        return set()
    found = self_attributes(nodes[name])
    for base in classes[name][1]:
        if base != name:
            found |= attributes_with_inherited(classes, nodes, base)
    return found


def test_the_readers_of_classes_see_a_breach():
    sample = {"a.py": ast.parse("class A:\n    pass\nclass B(A):\n    def f(self):\n        self.x = 1\n"
                                "class C(B):\n    def g(self):\n        self.y: int = 2\n        self.x += 1\n")}
    classes, nodes = class_bases(sample), class_nodes(sample)
    assert [class_depth(classes, c) for c in "ABC"] == [1, 2, 3]
    assert attributes_with_inherited(classes, nodes, "C") == {"x", "y"}


def test_no_class_is_deeper_than_two_and_every_role_subclasses_hostrole_directly():
    trees = modules()
    classes = class_bases(trees)
    deep = {c: class_depth(classes, c) for c in classes if class_depth(classes, c) > 2}
    assert not deep, deep
    roles = {c for c, (module, _) in classes.items() if module.startswith("roles/") and "HostRole" in
             attributes_chain(classes, c)}
    assert roles >= {"SingleHost", "JobPortLeader", "JobPortWorker", "MpiLeader", "MpiWorker"}
    assert all(classes[c][1] == ["HostRole"] for c in roles - {"HostRole"}), {c: classes[c][1] for c in roles}


def attributes_chain(classes: dict, name: str) -> set[str]:
    """name and every entrypoint class above it."""
    found = {name}
    for base in classes.get(name, ("", []))[1]:
        if base in classes and base != name:
            found |= attributes_chain(classes, base)
    return found


def role_leaves(classes: dict) -> set[str]:
    roles = {c for c, (module, _) in classes.items() if module.startswith("roles/") and "HostRole" in
             attributes_chain(classes, c)}
    parents = {b for c in roles for b in classes[c][1]}
    return roles - parents


def test_a_hosts_state_is_set_on_host_only_and_a_role_keeps_at_most_fifteen_attributes():
    """orchestrate.Host owns the plan, the environment, the stop, the output, the attempt, the
    report's parts and the current run: no roles/ class sets a name Host sets (two copies kept in
    step by hand). A role keeps what its own family adds beside them: 15 names at most, its
    bases' included."""
    trees = modules()
    classes, nodes = class_bases(trees), class_nodes(trees)
    host = self_attributes(nodes["Host"])
    assert {"plan", "env", "stop", "collector", "paths", "attempt", "supervisor", "report", "restarts"} <= host
    both = {f"{c}.{a}" for c, (module, _) in classes.items() if module.startswith("roles/")
            for a in self_attributes(nodes[c]) & host}
    assert not both, both
    leaves = {c: sorted(attributes_with_inherited(classes, nodes, c)) for c in role_leaves(classes)}
    assert len(leaves) == 5 and all(len(a) <= 15 for a in leaves.values()), leaves


def find_loop_takes(tree: ast.Module) -> list[int]:
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr == "take" and name_of(n.func.value) == "loop"]


def test_one_process_wait_loop_takes_from_the_hosts_loop():
    """loop.take (the run's wait: until a child exits, an event, or its next look) is the
    Supervisor's alone; every other wait is loop.wait(until, deadline)."""
    assert find_loop_takes(ast.parse("self.loop.take(1)\nloop.take()\nqueue.take()\n")) == [1, 2]
    takes = {name for name, tree in modules().items() if not name.startswith("loop/") and find_loop_takes(tree)}
    assert takes == {"run/supervise.py"}, takes


def find_supervisor_reads(tree: ast.Module) -> list[str]:
    """`supervisor.x` or `host.supervisor.x` read, not called: a role reading a run's state."""
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    return [n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and id(n) not in called
            and name_of(n.value) == "supervisor"]


def test_a_role_reads_no_attribute_of_the_run_it_only_calls_its_methods():
    assert find_supervisor_reads(ast.parse("supervisor.kill_at\nhost.supervisor.stop_after_failure(w)\n"
                                           "host.supervisor.followers.append(f)\n")) == ["kill_at", "followers"]
    reads = {f"{name}: {a}" for name, tree in modules().items() if name.startswith("roles/")
             for a in find_supervisor_reads(tree)}
    assert not reads, reads


def test_a_sender_started_off_the_loop_pauses_on_the_loop():
    """send_to_each's senders and the root-cause sender: their pauses between tries are the
    host loop's (send_until takes the loop), not an Event nobody sets."""
    import inspect

    from entrypoint.hosts import job_port

    assert "loop" in inspect.signature(job_port.send_until).parameters
    assert "loop" in inspect.signature(job_port.send_to_each).parameters


# --- the host's state machine (orchestrate.py) ----------------------------------------------


def test_every_state_but_done_has_one_step_and_a_stop_outcome_is_one_function_of_the_state():
    import signal

    from entrypoint import orchestrate
    from entrypoint.orchestrate import HostState, build_stop_outcome

    assert set(orchestrate.STEPS) == set(HostState) - {HostState.DONE}
    startup = build_stop_outcome(HostState.WAITING, signal.SIGTERM, [])
    assert startup.exit_code == 143 and startup.reason.startswith("Stopped by SIGTERM during start-up")
    for state in orchestrate.BEFORE_THE_ROLE:
        assert build_stop_outcome(state, "SIGINT", []).reason == build_stop_outcome(HostState.WAITING, 2, []).reason
    between = build_stop_outcome(HostState.RESTARTING, "SIGHUP", ["exit code 5"])
    assert between.exit_code == 129 and between.reason.startswith("Stopped by SIGHUP before attempt 2 started")
    assert "attempt 1: exit code 5" in between.reason


def role_members_read(tree: ast.Module) -> set[str]:
    """What the orchestrator reads or calls of a role: `role.x`, `host.role.x`, `launch.role.x`."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (
                (isinstance(node.value, ast.Name) and node.value.id == "role") or
                (isinstance(node.value, ast.Attribute) and node.value.attr == "role")):
            found.add(node.attr)
    return found


# What orchestrate.py may use of a role: the lifecycle's calls (roles/base.py) and what it
# reads for the failure's words and the log. A member more is a back-and-forth the state
# machine was built to end: it goes in the role protocol, or the role does it itself.
ROLE_PROTOCOL = {"start", "start_live", "begin_running", "run_attempt", "restart", "end_attempts", "settle",
                 "job_report", "close"}


def test_the_orchestrator_uses_only_the_role_protocol():
    assert role_members_read(ast.parse("role.start()\nhost.role.settle(o)\nlaunch.role.close(o)\nx.other\n")) == \
        {"start", "settle", "close"}
    used = role_members_read(ast.parse((PACKAGE / "orchestrate.py").read_text()))
    assert used <= ROLE_PROTOCOL, used - ROLE_PROTOCOL
    assert "relaunchable" not in used and "run" not in used  # the attempt loop is the state machine's, not a callback
    assert not used & {"plan", "stop", "collector", "loop", "started_at", "what", "attempt"}  # Host holds them


# --- launcher families: one module each, one registry ----------------------------------------


def code_strings(tree: ast.Module) -> set[str]:
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docstrings}


def files_naming(family) -> set[str]:
    """The modules that name a family's identity: one of its roles (Role.X), one of its
    launcher kinds as a string, or the role classes its decide_role names."""
    roles = {role.name for role in family.ROLES}
    kinds = set(family.KINDS)
    found = set()
    for name, tree in modules().items():
        attributes = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                      and isinstance(n.value, ast.Name) and n.value.id == "Role"}
        if attributes & roles or code_strings(tree) & kinds:
            found.add(name)
    return found


# Where a family's identity is named besides its own module: the SDKs' words for it
# (decide/distribution.py parses v2's `distribution=`, job/v3_definition.py reads v3's driver
# names), the Role enum (decide/launch_plan.py) and the registry. What a family changes in
# shared decisions is its module's answer (decide_host_processes: the threads' share), never a
# switch on its kind there. Its role class lives in roles/, named by its module.
SHARED_NAMERS = {"decide/distribution.py", "job/v3_definition.py", "decide/launch_plan.py",
                 "decide/launchers/__init__.py"}


def test_each_launcher_family_is_named_in_its_module_and_the_shared_places_only():
    from entrypoint.decide.launchers import FAMILIES

    assert [f.NAME for f in FAMILIES] == ["single", "torchrun", "mpirun", "parameter-server"]
    counts = {}
    for family in FAMILIES:
        own = f"decide/launchers/{family.__name__.rsplit('.', 1)[1]}.py"
        naming = files_naming(family)
        assert own in naming
        assert naming - {own} <= SHARED_NAMERS, (family.NAME, naming - {own} - SHARED_NAMERS)
        counts[family.NAME] = len(naming)
    assert max(counts.values()) <= 4, counts  # its module, and at most three of the shared places


def test_every_family_speaks_the_same_protocol_and_the_registry_covers_every_role_and_kind():
    from entrypoint.decide.distribution import ENABLE_KEYS
    from entrypoint.decide.launch_plan import Role
    from entrypoint.decide.launchers import FAMILIES, find_family_of_kind, find_family_of_role

    for family in FAMILIES:
        for name in ("NAME", "KINDS", "ROLES", "decide_plan", "describe", "decide_relaunched",
                     "describe_restart_limits", "decide_role", "decide_host_processes"):
            assert hasattr(family, name), (family.NAME, name)
    assert {role for f in FAMILIES for role in f.ROLES} == set(Role)
    for role in Role:
        assert find_family_of_role(role).NAME
    for kind in ("process", *ENABLE_KEYS):
        assert find_family_of_kind(kind).NAME  # every launcher distribution.py parses has its family

"""The host's one loop (entrypoint/loop/): events posted from any thread or a signal handler
are handled on the main thread, by type; a wait ends on its condition, its deadline or a stop.
Then the roles on it, with stand-in transports: the job port's and the watches' events posted
in every order, a stop among them at every point, and what the role decides."""

from __future__ import annotations

import itertools
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import NamedTuple

import pytest

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from entrypoint.hosts.job_port import AttemptWord, HostDone, PeerLost, Word  # noqa: E402
from entrypoint.loop import HostLoop, StopRequested, Waited  # noqa: E402
from entrypoint.run.stop import Stop  # noqa: E402


class Ping(NamedTuple):
    n: int


class Other(NamedTuple):
    text: str


def test_events_are_handled_on_the_main_thread_in_the_order_posted_by_type():
    loop, seen = HostLoop(), []
    loop.on({Ping: lambda e: seen.append((e.n, threading.current_thread() is threading.main_thread()))})
    poster = threading.Thread(target=lambda: [loop.post(Ping(n)) for n in range(100)])
    poster.start()
    poster.join()
    loop.post(Other("no handler: dropped"))
    assert loop.wait(lambda: len(seen) == 100, time.monotonic() + 60) is Waited.DONE
    assert seen == [(n, True) for n in range(100)]


def test_a_wait_ends_at_its_deadline_and_not_before():
    loop = HostLoop()
    deadline = time.monotonic() + 0.3
    assert loop.wait(deadline=deadline) is Waited.TIMEOUT
    assert time.monotonic() >= deadline
    assert loop.wait(deadline=time.monotonic() - 1) is Waited.TIMEOUT  # past already: at once
    assert loop.wait(lambda: True, deadline=time.monotonic() - 1) is Waited.DONE  # the condition first


def test_a_stop_ends_every_wait_from_its_post_on_unless_the_wait_outlives_stops():
    loop, taken = HostLoop(), []
    loop.on({StopRequested: taken.append})
    threading.Timer(0.1, loop.post, [StopRequested(signal.SIGTERM)]).start()
    assert loop.wait(deadline=time.monotonic() + 3600) is Waited.STOPPED
    assert loop.stop_name == "SIGTERM" and taken == [StopRequested(signal.SIGTERM)]
    assert loop.wait(deadline=time.monotonic() + 3600) is Waited.STOPPED  # a later wait: at once
    assert loop.wait(deadline=time.monotonic() + 0.1, stop_ends=False) is Waited.TIMEOUT  # a run's: goes on
    loop.post(StopRequested(signal.SIGINT))
    assert loop.stop_name == "SIGTERM"  # the first stop is the one named


def test_a_real_signal_reaches_a_wait_blocked_on_the_queue():
    """SIGTERM to this process while the main thread waits with no deadline of its own: the
    stop token's handler posts StopRequested, and the wait ends (the loop's tick catches a
    signal the kernel handed another thread)."""
    stop = Stop()
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        stop.install()
        threading.Timer(0.2, os.kill, [os.getpid(), signal.SIGTERM]).start()
        assert stop.loop.wait() is Waited.STOPPED
        assert stop.signals == ["SIGTERM"]
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def test_handlers_are_the_phases_and_off_gives_back_the_ones_before():
    loop, seen = HostLoop(), []
    outer = loop.on({Ping: lambda e: seen.append(("outer", e.n))})
    inner = loop.on({Ping: lambda e: seen.append(("inner", e.n)), Other: lambda e: seen.append(e.text)})
    loop.post(Ping(1))
    loop.post(Other("x"))
    loop.handle_pending()
    loop.off(inner)
    loop.post(Ping(2))
    loop.post(Other("dropped"))
    loop.handle_pending()
    loop.off(outer)
    loop.post(Ping(3))
    loop.handle_pending()
    assert seen == [("inner", 1), "x", ("outer", 2)]


def test_a_phase_takes_a_type_with_several_handlers_and_a_step_beside_it_sees_it_too(capsys):
    loop, seen = HostLoop(), []
    phase = loop.on({Ping: (lambda e: seen.append(("first", e.n)), lambda e: seen.append(("second", e.n)))})
    beside = loop.also({Ping: lambda e: seen.append(("beside", e.n))})
    later = loop.on({Other: lambda e: seen.append(e.text)})  # another type: the Ping handlers stay
    loop.post(Ping(1))
    loop.handle_pending()
    loop.off(beside)  # out of order: what came after it stays
    loop.post(Ping(2))
    loop.post(Other("x"))
    loop.handle_pending()
    loop.off(phase)
    loop.off(later)
    assert seen == [("first", 1), ("second", 1), ("beside", 1), ("first", 2), ("second", 2), "x"]
    assert loop.handlers_of(Ping) == ()


def test_an_event_no_handler_takes_is_said_once_for_its_type_and_a_wake_up_never(capsys):
    from entrypoint.loop import ChildExited, StepEnded

    loop = HostLoop()
    for n in range(3):
        loop.post(Ping(n))
        loop.post(Other("nobody"))
        loop.post(ChildExited())
        loop.post(StepEnded())
    loop.handle_pending()
    said = [line for line in capsys.readouterr().err.splitlines() if "no phase takes" in line]
    assert len(said) == 2 and any("Ping" in line for line in said) and any("Other" in line for line in said)


def test_take_waits_for_one_event_then_handles_what_is_queued_behind_it():
    loop, seen = HostLoop(), []
    loop.on({Ping: lambda e: seen.append(e.n)})
    assert loop.take(0.05) is False and seen == []
    for n in range(3):
        loop.post(Ping(n))
    assert loop.take(3600) is True and seen == [0, 1, 2]


def test_only_the_main_thread_takes_events_and_a_step_beside_it_sees_them_handled_there():
    """take() is the main thread's; a step run beside the loop never takes an event itself: its
    wait ends once the main thread handled what it waits for."""
    loop, errors, handled_on = HostLoop(), [], []

    def take_elsewhere() -> None:
        try:
            loop.take(0)
        except AssertionError as error:
            errors.append(str(error))

    thread = threading.Thread(target=take_elsewhere)
    thread.start()
    thread.join()
    assert errors == ["a run's wait is the main thread's"]
    loop.on({Ping: lambda e: handled_on.append((e.n, threading.current_thread() is threading.main_thread()))})

    def step() -> Waited:
        threading.Thread(target=loop.post, args=(Ping(7),)).start()  # posted from a third thread
        return loop.wait(lambda: bool(handled_on), time.monotonic() + 3600)

    assert loop.run_beside(step) == (Waited.DONE, Waited.DONE)
    assert handled_on == [(7, True)]


# --- a role on the loop, its transports stood in ------------------------------------------------

def make_roles(tmp_path, monkeypatch, current: str):
    """Makes the real job-port role of `current` in a 3-host torchrun job, in attempt 1 whose
    processes failed here; no port, no watch threads, no network: what it sends is recorded,
    what it hears is posted. Silences are named at once (the waits' deadlines are now)."""
    from support.jobtree import write_tree

    from entrypoint.cli import load_plan, load_runtime
    from entrypoint.decide.settings import parse_launch_settings
    from entrypoint.job.config import load_job
    from entrypoint.job.paths import build_paths
    from entrypoint.job.probe import probe_machine
    from entrypoint.orchestrate import Host
    from entrypoint.roles import job_port as role_module
    from entrypoint.run.supervise import OutputCollector, RunResult

    for name in list(os.environ):
        if name.startswith(("SM_", "SAGEMAKER_", "BYOC_")):
            monkeypatch.delenv(name)
    root = write_tree(tmp_path / current, hosts=("algo-1", "algo-2", "algo-3"), current_host=current,
                      hyperparameters={"sagemaker_torch_distributed_enabled": True}, script="pass\n")
    environ = {"SAGEMAKER_BASE_DIR": str(root), "BYOC_MAX_RESTARTS": "3", "BYOC_COMPILE_CACHE": "0",
               "BYOC_RUNTIME_DIR": str(tmp_path / "run")}
    monkeypatch.setenv("BYOC_RUNTIME_DIR", str(tmp_path / "run"))
    settings = parse_launch_settings(environ)
    plan = load_plan(load_job(build_paths(environ), environ), probe_machine(), load_runtime(settings, "0" * 16),
                     settings)
    plan = plan._replace(settings=plan.settings._replace(attempt_end_wait_s=0.0, peer_wait_timeout_s=0.0))
    paths = build_paths(environ)
    kind = role_module.JobPortLeader if plan.is_leader else role_module.JobPortWorker

    def make():
        host = Host(plan, dict(environ), kind(), paths, Stop(), OutputCollector(), "torchrun", True)
        role, peers, sent = host.role, host.role.peers, []
        peers.send_word = lambda _host, to, word, attempt, exit_code=0, within_s=None: \
            sent.append((to, word, attempt)) or True
        peers.send_word_to_each = lambda _host, hosts, word, attempt, within_s: {
            to: peers.send_word(_host, to, word, attempt, within_s=within_s) for to in hosts}
        peers.peer_addresses = lambda peer: ["10.0.0." + peer[-1]]
        host.loop.on({HostDone: lambda done: role.on_host_done(host, done),
                      AttemptWord: lambda word: role.on_attempt_word(host, word),
                      PeerLost: lambda lost: peers.on_peer_lost(host, lost)})
        peers.watches = [StandInWatch()]  # the peers are being watched: a PeerLost counts
        host.supervisor = StandInRun()
        host.run = RunResult(1)  # attempt 1's processes failed here
        return host, sent

    return make


@pytest.fixture
def leader(tmp_path, monkeypatch):
    return make_roles(tmp_path, monkeypatch, "algo-1"), None


@pytest.fixture
def worker(tmp_path, monkeypatch):
    return make_roles(tmp_path, monkeypatch, "algo-2")


class StandInWatch:
    def close(self) -> None:
        pass


def restart(host, line: str, cause: str):
    """The orchestrator's restart step (orchestrate.step_restarting): the failure noted, then the
    role's part."""
    from entrypoint.orchestrate import note_restart

    note_restart(host, 1, cause, time.time())
    return host.role.restart(host, line)


class StandInRun:
    """The run of attempt 1 on this host: its processes have ended."""

    def __init__(self) -> None:
        self.stopped: list[str] = []

    def stop_unless_stopping(self, why: str) -> bool:
        return False  # its processes have ended: nothing to stop

    def stop_after_failure(self, why: str) -> None:
        self.stopped.append(why)


ENDED_2 = AttemptWord(Word.ENDED, 1, "algo-2", 137, "10.0.0.2")
ENDED_3 = AttemptWord(Word.ENDED, 1, "algo-3", 143, "10.0.0.3")
STALE = AttemptWord(Word.ENDED, 2, "algo-3", 1, "10.0.0.3")  # another attempt's: dropped
FORGED = AttemptWord(Word.ENDED, 1, "algo-3", 1, "10.9.9.9")  # from another address: refused
DONE_3 = HostDone("algo-3", 0, "10.0.0.3")
LOST_3 = PeerLost("algo-3", "host algo-3 stopped answering on port 7778 for 30 s")
STOP = StopRequested(signal.SIGTERM)


def decide_expected(events) -> str | None:
    """What the leader's restart must answer after these events, by its rules: a lost host ends
    the restart, naming it; else a stop; else a worker whose part ended cannot take part in
    another attempt; else every worker's `ended` (stale and forged words aside) starts attempt 2;
    else the workers that never said it are named."""
    if LOST_3 in events:
        return LOST_3.reason
    if STOP in events:
        return "a stop signal came"
    if DONE_3 in events:
        return "host algo-3's part of the job had already ended: it cannot take part in another attempt"
    if ENDED_2 in events and ENDED_3 in events:
        return None
    return "silent"


EVENTS = (ENDED_2, ENDED_3, STALE, FORGED, DONE_3, LOST_3, STOP)


def test_the_leaders_restart_answers_by_its_rules_whatever_the_order_of_what_it_hears(leader):
    """Every order of every subset of the events (13 700 of them), each on a fresh leader."""
    make, _ = leader
    checked = 0
    for size in range(len(EVENTS) + 1):
        for order in itertools.permutations(EVENTS, size):
            host, sent = make()
            for event in order:
                host.loop.post(event)
            why = restart(host, "attempt 1 failed", "rank 0: exit code 1")
            expected, context = decide_expected(order), [type(e).__name__ for e in order]
            if expected == "silent":
                assert why is not None and "did not say their processes of attempt 1" in why, (context, why)
            else:
                assert why == expected, (context, why)
            starts = [s for s in sent if s[1] == "start"]
            assert starts == ([("algo-2", "start", 2), ("algo-3", "start", 2)] if expected is None else []), context
            assert host.attempt == (2 if expected is None else 1), context
            checked += 1
    assert checked == 13700


@pytest.mark.parametrize("at", range(3))
def test_a_stop_at_every_point_of_the_leaders_restart_ends_it_and_starts_no_attempt(leader, at):
    """The stop posted before, between or after the workers' `ended`: no attempt starts."""
    make, _ = leader
    host, sent = make()
    words = [ENDED_2, ENDED_3]
    for event in words[:at] + [STOP] + words[at:]:
        host.loop.post(event)
    assert restart(host, "attempt 1 failed", "rank 0: exit code 1") == "a stop signal came"
    assert not [s for s in sent if s[1] == "start"] and host.attempt == 1


START_2 = AttemptWord(Word.START, 2, "algo-1", 0, "10.0.0.1")
END_1 = AttemptWord(Word.END, 1, "algo-1", 0, "10.0.0.1")
STOP_1 = AttemptWord(Word.STOP, 1, "algo-1", 0, "10.0.0.1")
START_3 = AttemptWord(Word.START, 3, "algo-1", 0, "10.0.0.1")  # two ahead: stale
FORGED_START = AttemptWord(Word.START, 2, "algo-1", 0, "10.9.9.9")  # not the leader's address
LOST_1 = PeerLost("algo-1", "host algo-1 stopped answering on port 7778 for 30 s")
WORKER_EVENTS = (START_2, END_1, STOP_1, START_3, FORGED_START, LOST_1, STOP)


def decide_worker_expected(events) -> str | None:
    """A worker's restart: a lost leader, else a stop, ends it; else the leader's first word
    stands (`start 2`: attempt 2; `end 1`: the job ends); else no word came."""
    if LOST_1 in events:
        return LOST_1.reason
    if STOP in events:
        return "a stop signal came"
    word = next((e for e in events if e in (START_2, END_1)), None)
    if word is START_2:
        return None
    if word is END_1:
        return "the leader algo-1 ends the job after attempt 1"
    return "no word from the leader algo-1 within 0 s"


def test_a_workers_restart_answers_by_its_rules_whatever_the_order_of_what_it_hears(worker):
    """Every order of every subset of the events (13 700), each on a fresh worker: it says
    `ended 1` to the leader first, whatever it heard before."""
    checked = 0
    for size in range(len(WORKER_EVENTS) + 1):
        for order in itertools.permutations(WORKER_EVENTS, size):
            host, sent = worker()
            for event in order:
                host.loop.post(event)
            why = restart(host, "attempt 1 failed", "rank 3: exit code 1")
            context = [f"{type(e).__name__}:{getattr(e, 'word', '')}" for e in order]
            assert why == decide_worker_expected(order), (context, why)
            assert sent == [("algo-1", "ended", 1)], context
            assert host.attempt == (2 if why is None else 1), context
            checked += 1
    assert checked == 13700


# --- what the review of the loop found -----------------------------------------------------------

def test_a_handler_that_raises_is_said_and_the_wait_goes_on(capfd):
    loop, seen = HostLoop(), []

    def broken(event):
        raise KeyError("late session")

    loop.on({Other: broken, Ping: lambda e: seen.append(e.n)})
    loop.post(Other("boom"))
    loop.post(Ping(1))
    assert loop.wait(lambda: seen == [1], time.monotonic() + 60) is Waited.DONE
    err = capfd.readouterr().err
    assert "internal error while handling Other: KeyError: 'late session'" in err and "Traceback" in err


def test_a_stop_that_comes_while_finishing_begins_counts_for_finishing():
    """The signal lands while begin_finishing takes what was queued (a handler runs): the
    loop's stop, reset for finishing, still holds it, and Finish sees it before its reaction
    is in place."""
    from entrypoint.run.finishing import Finish

    stop = Stop()
    stop.loop.on({Ping: lambda e: stop.on_signal(signal.SIGTERM, None)})
    stop.loop.post(Ping(1))
    stop.begin_finishing()
    assert stop.loop.stop_name == "SIGTERM" and Finish(stop).stopped()
    quiet = Stop()
    quiet.loop.post(StopRequested(signal.SIGTERM))  # a stop the run answered: not finishing's
    quiet.signals.append("SIGTERM")
    quiet.begin_finishing()
    assert not quiet.loop.stopped() and not Finish(quiet).stopped()


def test_what_is_posted_as_the_processes_end_is_taken_before_the_run_returns(tmp_path):
    """An event posted after the processes ended (here by the output pump, for a line a
    process the script left behind writes a moment later, as a port's reader would post a
    root cause) is handled before run_processes returns: the outcome is decided with it."""
    from entrypoint.decide.specs import ProcessSpec
    from entrypoint.run.supervise import OutputCollector, run_processes

    stop, seen = Stop(), []
    stop.loop.on({Other: lambda e: seen.append(e.text)})
    collector = OutputCollector()
    collector.on_line = lambda line: line == "last" and stop.loop.post(Other(line))
    left_behind = "import subprocess; subprocess.Popen(['setsid', 'sh', '-c', 'sleep 0.3; echo last'])"
    run = run_processes((ProcessSpec("p", (sys.executable, "-c", left_behind)),), dict(os.environ),
                        str(tmp_path), collector, stop)
    assert run.exit_code == 0 and seen == ["last"]


def test_a_host_lost_while_a_restarts_processes_start_stops_them(leader):
    make, _ = leader
    host, _ = make()
    host.loop.post(LOST_3)
    host.loop.handle_pending()  # taken between two attempts: the old run is over
    new_run = StandInRun()
    host.role.on_processes_started(host, new_run)
    assert new_run.stopped == [f"{LOST_3.reason}: the job cannot go on"]


def test_a_stop_while_the_workers_output_drains_is_the_runs_too_and_cuts_the_wait():
    from entrypoint.hosts.worker_output import WorkerOutput

    class SilentSession:
        """A worker whose last lines never arrive."""

        ended, said = False, []

        def close(self) -> None:
            pass

        def say_lost(self, why: str) -> None:
            self.said.append(why)

    class StandInPump:
        def stop(self) -> None:
            pass

    loop, run_saw = HostLoop(), []
    loop.on({StopRequested: run_saw.append})  # the run's handler
    output = WorkerOutput([SilentSession()], loop, StandInPump())
    threading.Timer(0.2, loop.post, [StopRequested(signal.SIGTERM)]).start()
    output.stop(3600.0)
    assert run_saw == [StopRequested(signal.SIGTERM)]
    assert output.sessions[0].said == ["its last lines did not arrive within 3600 s"]


def test_a_step_walked_away_from_cuts_only_itself_not_a_later_step_on_a_reused_thread_id():
    """The kernel hands a thread's id to a later thread once it ended: a cut keyed by the id cut
    the next step's first wait too (closing, after a report walked away from: 10 of 20 runs)."""
    loop = HostLoop(tick_s=0.01)
    for _ in range(20):
        first = loop.run_beside(lambda: loop.wait(deadline=time.monotonic() + 60), deadline=time.monotonic() + 0.02)
        assert first == (Waited.TIMEOUT, None)
        loop.walked_away.join()  # StepCut at its next wait: it ends
        second = loop.run_beside(lambda: loop.wait(deadline=time.monotonic() + 0.01))
        assert second == (Waited.DONE, Waited.TIMEOUT)  # its own wait ran to its deadline


def test_a_burst_is_told_by_when_its_signals_came_not_when_they_were_handled():
    """Behind a log write that blocks, five SIGUSR1 posted at once are handled seconds apart:
    still one burst (before: one line, and one round of questions to the ranks, each)."""
    from entrypoint.loop import Burst

    burst, said = Burst(), []
    posted = [100.0 + 0.001 * i for i in range(5)]
    for at in posted:  # handled 1.1 s apart, each
        said.append(burst.take(1.0, at))
    assert said == ["", None, None, None, None]
    assert burst.take(1.0, 102.0) == " (and 4 more before, not said)"  # the next burst says the quiet ones


def wait_for_lines(path: Path, count: int) -> list[str]:
    """The file's lines once it has `count` of them (a guard against a hang, not a bound)."""
    guard = time.monotonic() + 60
    while time.monotonic() < guard:
        lines = path.read_text().split() if path.exists() else []
        if len(lines) >= count:
            return lines
        time.sleep(0.01)
    raise AssertionError(f"{path}: fewer than {count} lines")


def test_a_burst_of_stops_is_forwarded_once_and_a_stop_after_the_quiet_again(tmp_path, capsys):
    """A storm of SIGTERM (issue 62, case 6) is one stop: forwarded as its first is taken, not
    once each (the script's handler ran again during its save, and one that came as it ended
    killed it). A stop after signal_burst_s of quiet is forwarded again. The burst is told by
    when the stops were posted (their `at`), not when they were handled."""
    from entrypoint.decide.specs import ProcessSpec
    from entrypoint.run.supervise import OutputCollector, Supervisor
    from entrypoint.settings import DEFAULTS

    events = tmp_path / "events"
    script = ("import signal, time\n"
              f"say = lambda what: open({str(events)!r}, 'a').write(what + '\\n')\n"
              "signal.signal(signal.SIGTERM, lambda *_: say('term'))\n"
              "say('ready')\n"
              "time.sleep(60)\n")
    loop = HostLoop()
    supervisor = Supervisor(OutputCollector(), loop=loop)
    loop.on({StopRequested: supervisor.on_stop})
    supervisor.start(ProcessSpec("p", (sys.executable, "-c", script)), dict(os.environ), str(tmp_path))
    try:
        wait_for_lines(events, 1)
        for i in range(200):  # posted 1 ms apart: one burst
            loop.post(StopRequested(signal.SIGTERM, 100.0 + 0.001 * i))
        loop.handle_pending()
        wait_for_lines(events, 2)  # its SIGTERM
        loop.post(StopRequested(signal.SIGTERM, 100.2 + 2 * DEFAULTS.signal_burst_s))  # after the quiet
        loop.handle_pending()
        said = wait_for_lines(events, 3)
    finally:
        supervisor.signal_all(signal.SIGKILL)
        for _, proc in supervisor.children:
            proc.wait()
    assert said == ["ready", "term", "term"]  # one SIGTERM a burst: every forward reached it, and only those
    log = [line for line in capsys.readouterr().err.splitlines() if "received SIGTERM" in line]
    assert log == [f"[entrypoint] received SIGTERM: forwarding it to the job, SIGKILL in {DEFAULTS.grace_period_s:g} s",
                   "[entrypoint] received SIGTERM (and 199 more before, not said): forwarding it to the job again"]


def test_a_step_walked_away_from_knows_it_and_one_that_ran_to_its_end_does_not():
    loop, seen = HostLoop(tick_s=0.01), {}
    gate = threading.Event()

    def blocked():
        gate.wait(60)  # blocked where the loop cannot cut it (the kernel, a subprocess)
        seen["cut"] = loop.walked_away_from_here()

    assert loop.run_beside(blocked, deadline=time.monotonic() + 0.05) == (Waited.TIMEOUT, None)
    gate.set()
    loop.walked_away.join()
    assert loop.run_beside(lambda: loop.walked_away_from_here()) == (Waited.DONE, False)
    assert seen == {"cut": True}

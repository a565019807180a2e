"""The lifecycle every host role goes through (roles/), tested with a stand-in role and
no other host, as torch tests its elastic agent with a stand-in: start, run (with restarts),
finish, then the one write of output/, then close. The real roles' own rules (an MPI leader
tells its workers after its outcome is written; a torchrun worker tells its leader, then waits
for its port to close) are tested end to end on emulated hosts (tests/multihost)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from support.jobtree import write_tree  # noqa: E402

from entrypoint import cli  # noqa: E402
from entrypoint.outcome.records import Outcome  # noqa: E402
from entrypoint import orchestrate  # noqa: E402
from entrypoint.loop import Waited  # noqa: E402
from entrypoint.roles.base import HostRole  # noqa: E402


class StandIn(HostRole):
    """Records each step; start and finish may end the job their own way."""

    def __init__(self, events: list, root: Path, start_outcome=None, finish_outcome=None, report_action=None,
                 close_action=None, settings=None):
        self.events, self.root = events, root
        self.start_outcome, self.finish_outcome = start_outcome, finish_outcome
        # What the report and close steps do beside recording (a leader's read of its workers'
        # figures, a word to another host): here, something that blocks.
        self.report_action, self.close_action = report_action, close_action
        self.settings = settings

    def start(self, host):
        self.events.append("start")
        if self.settings:  # the test's deadlines for the last steps
            host.plan = host.plan._replace(settings=host.plan.settings._replace(**self.settings))
        return self.start_outcome

    def begin_running(self, host):
        started = super().begin_running(host)
        self.events.append("run")
        return started

    def run_attempt(self, host, hooks):
        ran = super().run_attempt(host, hooks)
        self.events.append(("ran", ran.exit_code))
        return ran

    def on_processes_started(self, host, supervisor):
        super().on_processes_started(host, supervisor)
        self.events.append("processes started")

    def settle(self, host, outcome):
        self.events.append(("settle", outcome.exit_code))
        return self.finish_outcome or outcome

    def job_report(self, host, outcome):
        if self.report_action is not None:
            self.events.append("report")
            self.report_action()
            self.events.append("reported")

    def close(self, host, outcome):
        # What an MPI leader relies on: the outcome is on disk before it tells anyone.
        written = [name for name in ("success", "failure") if (self.root / "output" / name).exists()]
        self.events.append(("close", outcome.exit_code, written))
        if self.close_action is not None:
            self.close_action()
            self.events.append("closed")


@pytest.fixture
def job(tmp_path, monkeypatch):
    """A 1-host job tree whose role is a StandIn; cli.main run in this process (its signal
    handlers restored after)."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGALRM)}
    for name in list(os.environ):
        if name.startswith(("SM_", "SAGEMAKER_", "BYOC_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("BYOC_RUNTIME_DIR", str(tmp_path / "run"))
    events: list = []
    options: dict = {}

    def start(script: str, **role_options) -> int:
        root = write_tree(tmp_path / "ml", script=script, hyperparameters=role_options.pop("hyperparameters", {}))
        monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(root))
        for name, value in role_options.pop("env", {}).items():
            monkeypatch.setenv(name, value)
        relaunch = role_options.pop("relaunch", False)
        options.update(role_options, root=root)
        monkeypatch.setattr(orchestrate, "choose_role",
                            lambda plan: (StandIn(events=events, **options), "the script", relaunch))
        return cli.main(["train"])

    yield start, events, tmp_path / "ml"
    for s, handler in saved.items():
        signal.signal(s, handler)


def test_a_successful_job_goes_start_run_settle_then_is_written_then_closed(job):
    start, events, root = job
    assert start("print('trained')\n") == 0
    assert events == ["start", "run", "processes started", ("ran", 0), ("settle", 0), ("close", 0, ["success"])]


def test_a_role_that_cannot_start_runs_nothing_and_its_outcome_is_the_jobs(job):
    start, events, root = job
    code = start("open('ran', 'w')\n", start_outcome=Outcome(1, "host(s) algo-2 did not accept SSH\n"))
    assert code == 1
    assert events == ["start", ("close", 1, ["failure"])]
    assert (root / "output/failure").read_text() == "host(s) algo-2 did not accept SSH\n"
    assert not (root / "code/ran").exists()


def test_settle_may_turn_this_hosts_success_into_the_jobs_failure(job):
    """A leader whose own part succeeded while a worker's failed: the job failed."""
    start, events, root = job
    code = start("print('fine here')\n", finish_outcome=Outcome(3, "host algo-2 ended its part with exit code 3\n"))
    assert code == 3
    assert events[-2:] == [("settle", 0), ("close", 3, ["failure"])]
    assert (root / "output/failure").read_text().startswith("host algo-2 ended its part with exit code 3")


def test_a_relaunchable_role_runs_its_processes_again_within_one_run_step(job):
    start, events, root = job
    script = ("import os, sys\n"
              "first = not os.path.exists('attempt')\n"
              "open('attempt', 'a').write('x')\n"
              "sys.exit(5 if first else 0)\n")
    assert start(script, relaunch=True, env={"BYOC_MAX_RESTARTS": "1"}) == 0
    assert events == ["start", "run", "processes started", ("ran", 5), "processes started", ("ran", 0), ("settle", 0),
                      ("close", 0, ["success"])]


def test_a_failing_script_is_reported_once_and_closed_with_its_code(job):
    start, events, root = job
    assert start("raise SystemExit(7)\n") == 7
    assert events == ["start", "run", "processes started", ("ran", 7), ("settle", 7), ("close", 7, ["failure"])]
    assert "exit code 7" in (root / "output/failure").read_text()


def test_an_error_of_ours_still_closes_the_role_as_a_failure(job, monkeypatch):
    """A bug in the launcher (any exception) must not leave other hosts waiting: the role is
    closed with exit code 1 before the traceback goes on."""
    start, events, root = job

    def broken(*args, **kwargs):
        raise RuntimeError("a bug of ours")

    monkeypatch.setattr(orchestrate, "run_attempt", broken)
    with pytest.raises(RuntimeError, match="a bug of ours"):
        start("print('never')\n")
    assert events == ["start", "run", ("close", 1, [])]


# --- the end of the job: bounded, and a stop cuts it short (run/finishing.py) -------------------

def blocking_open(fifo: Path):
    """A step that blocks the way a FIFO left where we read blocked the entrypoint for good:
    open() of a FIFO that nothing writes to waits for a writer."""
    os.mkfifo(fifo)
    return lambda: open(fifo).close()


def stop_soon(signum=signal.SIGTERM, after_s: float = 0.3):
    """SIGTERM to this process from another thread, once the step is blocked."""
    import threading

    threading.Timer(after_s, os.kill, (os.getpid(), signum)).start()


@pytest.mark.parametrize("step", ["report", "close"])
def test_a_finishing_step_that_blocks_is_cut_at_its_deadline_and_the_outcome_stands(job, tmp_path, capfd, step):
    start, events, root = job
    action = blocking_open(tmp_path / "fifo")
    code = start("raise SystemExit(3)\n", **{f"{step}_action": action},
                 settings={"finish_report_s": 0.5, "finish_close_s": 0.5, "peer_wait_timeout_s": 0.0})
    assert code == 3
    assert "exit code 3" in (root / "output/failure").read_text()
    if step == "report":  # cut, then closing runs
        assert events[-2:] == ["report", ("close", 3, ["failure"])]
    else:
        assert events[-1] == ("close", 3, ["failure"])
    assert f"{'job report' if step == 'report' else 'closing'}: cut short: it took longer than 0.5 s" in capfd.readouterr().err
    assert not list((tmp_path / "run").glob("*/*")), "the job's runtime folders are removed"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_while_finishing_cuts_the_step_skips_the_rest_and_keeps_the_outcome(job, tmp_path, capfd, signum):
    start, events, root = job

    def report():
        stop_soon(signum)
        blocking_open(tmp_path / "fifo")()

    code = start("print('trained')\n", report_action=report, close_action=blocking_open(tmp_path / "fifo-2"))
    assert code == 0  # the outcome decided before the stop: success, not 143
    assert (root / "output/success").exists() and not (root / "output/failure").exists()
    # Cut in the report; closing then runs for finish_after_stop_s only (its own blocked call cut).
    assert events[-2:] == ["report", ("close", 0, ["success"])]
    err = capfd.readouterr().err
    assert f"received {signal.Signals(signum).name} while finishing" in err
    assert "job report: cut short: stopped by" in err and "closing: cut short: it took longer than 2 s" in err
    assert not list((tmp_path / "run").glob("*/*"))


def test_a_stop_while_closing_ends_it_keeping_a_failure(job, tmp_path, capfd):
    start, events, root = job

    def close():
        stop_soon()
        blocking_open(tmp_path / "fifo")()

    assert start("raise SystemExit(5)\n", close_action=close) == 5
    assert "exit code 5" in (root / "output/failure").read_text()
    assert events[-1] == ("close", 5, ["failure"])
    assert "closing: cut short: stopped by SIGTERM" in capfd.readouterr().err


# --- one stop token: a SIGTERM at every step of the lifecycle (run/stop.py) ---------------------

class StoppedAt(StandIn):
    """A stand-in that gets SIGTERM at one step, then waits there the way the real roles' waits
    do: on the host's loop (a peer that never answers). Records whether its wait saw the stop,
    and whether a later step saw it too."""

    WAIT_S = 60.0  # a peer that never answers: only a stop ends the wait before this

    def __init__(self, stop_at_step: str, **kwargs):
        super().__init__(**kwargs)
        self.stop_at_step = stop_at_step

    def wait_for_a_peer(self, host, step: str) -> None:
        if step == self.stop_at_step:
            os.kill(os.getpid(), signal.SIGTERM)
        if host.loop.wait(deadline=time.monotonic() + self.WAIT_S) is Waited.STOPPED:
            self.events.append(("saw the stop", step))
        elif step == self.stop_at_step:
            self.events.append(("missed the stop", step))

    def start(self, host):
        self.events.append("start")
        if self.stop_at_step == "start":
            self.wait_for_a_peer(host, "start")
        return None

    def begin_running(self, host):
        started = super().begin_running(host)  # StandIn's: "run"
        if self.stop_at_step == "run":
            self.wait_for_a_peer(host, "run")  # before the processes: none may start
        return started

    def settle(self, host, outcome):
        self.events.append(("settle", outcome.exit_code))
        if self.stop_at_step == "settle":
            self.wait_for_a_peer(host, "settle")
        return outcome

    def job_report(self, host, outcome):
        self.events.append("report")
        if self.stop_at_step == "report":
            self.wait_for_a_peer(host, "report")
        self.events.append("reported")

    def close(self, host, outcome):
        written = [name for name in ("success", "failure") if (self.root / "output" / name).exists()]
        self.events.append(("close", outcome.exit_code, written))
        if self.stop_at_step in ("report", "close"):
            self.wait_for_a_peer(host, "close")  # a stop taken by the report is still the close's
        self.events.append("closed")


@pytest.fixture
def stopped_job(job, tmp_path, monkeypatch):
    _, events, _ = job
    root = tmp_path / "ml"

    def run(step: str, script: str) -> int:
        write_tree(root, script=script)
        monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(root))
        monkeypatch.setattr(orchestrate, "choose_role",
                            lambda plan: (StoppedAt(events=events, root=root, stop_at_step=step), "the script", False))
        return cli.main(["train"])

    return run, events, root


def test_a_sigterm_while_the_role_starts_is_seen_by_its_wait_and_nothing_runs(stopped_job):
    run, events, root = stopped_job
    assert run("start", "open('ran', 'w')\n") == 143
    # The stop came before the outcome: the job report (of the start-up) is still written.
    assert events == ["start", ("saw the stop", "start"), "report", "reported", ("close", 143, ["failure"]), "closed"]
    assert "Stopped by SIGTERM during start-up, before the training processes started" in (root / "output/failure").read_text()
    assert not (root / "code/ran").exists()


def test_a_sigterm_before_the_processes_start_starts_none_of_them(stopped_job):
    run, events, root = stopped_job
    assert run("run", "open('ran', 'w')\n") == 143
    assert events[:3] == ["start", "run", ("saw the stop", "run")]
    assert "processes started" not in events and ("ran", 143) in events
    # A start-up stop, not a failure of the script that never ran (issue 43: "train.py ... exit
    # code 143: killed by SIGTERM").
    assert (root / "output/failure").read_text().startswith(
        "Stopped by SIGTERM during start-up, before the training processes started")
    assert not (root / "code/ran").exists()


def test_a_sigterm_while_a_leader_waits_for_its_workers_ends_the_wait_and_the_job_report_still_runs(stopped_job):
    """The run's outcome was decided before the stop: the stop ends the wait; finishing (the
    report, the close) is not cut by a stop that came before it."""
    run, events, root = stopped_job
    assert run("settle", "print('trained')\n") == 0
    assert events[-6:] == [("settle", 0), ("saw the stop", "settle"), "report", "reported",
                           ("close", 0, ["success"]), "closed"]


@pytest.mark.parametrize("step", ["report", "close"])
def test_a_sigterm_while_finishing_cuts_the_step_and_the_close_still_sees_it(stopped_job, capfd, step):
    """Before one token, a SIGTERM taken by a worker's report (sending its figures) was lost to
    its close, which then waited BYOC_PEER_WAIT_TIMEOUT_S for the leader."""
    run, events, root = stopped_job
    assert run(step, "print('trained')\n") == 0
    assert (root / "output/success").exists()
    close_at = events.index(("close", 0, ["success"]))
    assert ("saw the stop", "close") in events[close_at:] or "closed" not in events[close_at:]
    assert ("missed the stop", "close") not in events
    assert f"{'job report' if step == 'report' else 'closing'}: cut short: stopped by SIGTERM" in capfd.readouterr().err


def test_a_sigterm_at_the_first_moment_of_start_up_ends_in_the_start_up_outcome(job, monkeypatch):
    """The token is the handler from its first moment inside cli.main's try: a stop while the
    previous outcome is cleared (before the plan is read) is an outcome, not a traceback."""
    start, events, root = job

    def clear_with_a_stop(paths):
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # a second while the first unwinds: only noted

    monkeypatch.setattr(cli, "clear_previous_outcome", clear_with_a_stop)
    assert start("open('ran', 'w')\n") == 143
    assert (root / "output/failure").read_text().startswith("Stopped by SIGTERM during start-up")
    assert events == [] and not (root / "code/ran").exists()


def test_the_entrypoint_constructs_one_stop_token():
    """Every wait reads the token cli.main made; none makes its own (run/stop.py)."""
    import ast

    made = []
    for path in (Path(orchestrate.__file__).parent).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "Stop":
                made.append(path.name)
    assert made == ["cli.py"]

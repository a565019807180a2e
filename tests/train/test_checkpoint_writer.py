"""Checkpoints written in the background (train.checkpoints.CheckpointWriter, the loop's use of
it): the same file as a synchronous write, the "saved" line only once the file is in place, a
failed write raised on the training thread, at most one write in flight, and the end of the
run (and a SIGTERM stop) waiting for the write. No wall-time bounds: order and outcome."""

from __future__ import annotations

import io
import json
import os
import signal
import threading
import weakref
from pathlib import Path

import pytest
import torch

import train.loop as train_loop
from train.backend import Backend, to_cpu
from train.checkpoints import (CheckpointWriteError, CheckpointWriter, build_checkpoint_path, load_checkpoint,
                               save_checkpoint)
from train.config import parse_config
from train.loop import EXIT_STOPPED, build_optimizer, format_checkpoint_saved, run_training
from train.metrics import Reporter
from train.models import build_mlp
from train.ranks import RankInfo
from tests.train.train_helpers import write_job

LEADER = RankInfo(0, 0, 1, 1, "single")


def model_and_optimizer(optimizer: str = "adam"):
    torch.manual_seed(0)
    model = build_mlp(12, 4, (16,), False)
    opt = build_optimizer(parse_config(["--optimizer", optimizer]), model.parameters(), 0.1)
    take_step(model, opt)  # the optimizer has state (Adam's moments, SGD's momentum)
    return model, opt


def take_step(model, opt) -> None:
    opt.zero_grad()
    model(torch.randn(8, 12)).square().mean().backward()
    opt.step()


def assert_same(a, b) -> None:
    if torch.is_tensor(a):
        assert torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b


class Recorder:
    """The writer's callbacks, in the order they came, with what was on disk at that moment."""

    def __init__(self):
        self.events: list[tuple] = []

    def saved(self, step, path, paused_s, write_s, write_cpu_s):
        on_disk = load_checkpoint(os.path.dirname(path))
        self.events.append(("saved", step, on_disk["step"] if on_disk else None,
                            min(paused_s, write_s, write_cpu_s) >= 0))

    def failed(self, step, err):
        self.events.append(("failed", step, str(err)))

    def waited(self, step, waited_s):
        self.events.append(("waited", step))

    def writer(self, folder, **kwargs) -> CheckpointWriter:
        return CheckpointWriter(str(folder), self.saved, self.failed, self.waited, **kwargs)


# -- the state handed over is a copy -------------------------------------------------------
@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_checkpoint_state_is_a_copy_the_next_step_does_not_change(optimizer):
    model, opt = model_and_optimizer(optimizer)
    state = Backend(LEADER, torch.device("cpu")).checkpoint_state(model, opt)
    before = {"model": {k: v.clone() for k, v in state["model"].items()},
              "optimizer": {k: {n: t.clone() if torch.is_tensor(t) else t for n, t in s.items()}
                            for k, s in state["optimizer"]["state"].items()}}
    take_step(model, opt)
    assert not torch.equal(model.state_dict()["1.weight"], before["model"]["1.weight"])  # the step moved it
    assert_same(state["model"], before["model"])
    assert_same(state["optimizer"]["state"], before["optimizer"])


def test_to_cpu_copies_every_tensor_and_keeps_plain_values():
    t = torch.ones(3)
    copied = to_cpu({"a": [t, (t, 2.5)], "b": None, "c": "text"})
    t.add_(1)
    assert torch.equal(copied["a"][0], torch.ones(3)) and torch.equal(copied["a"][1][0], torch.ones(3))
    assert copied["a"][1][1] == 2.5 and copied["b"] is None and copied["c"] == "text"
    assert isinstance(copied["a"][1], tuple)


# -- the writer -----------------------------------------------------------------------------
def test_a_background_save_writes_the_file_a_synchronous_save_writes(tmp_path):
    model, opt = model_and_optimizer()
    state = {"step": 7, **Backend(LEADER, torch.device("cpu")).checkpoint_state(model, opt)}
    save_checkpoint(str(tmp_path / "sync"), state)
    rec = Recorder()
    writer = rec.writer(tmp_path / "background")
    writer.submit(7, state)
    writer.wait()
    writer.close()
    assert_same(load_checkpoint(str(tmp_path / "background")), load_checkpoint(str(tmp_path / "sync")))
    assert rec.events == [("saved", 7, 7, True)]
    assert sorted(os.listdir(tmp_path / "background")) == ["checkpoint.pt"]  # no partial file left


def test_the_saved_callback_comes_only_once_the_file_is_in_place(tmp_path):
    gate, inside = threading.Event(), threading.Event()

    def slow_save(folder, state):
        inside.set()
        gate.wait()
        return save_checkpoint(folder, state)

    rec = Recorder()
    writer = rec.writer(tmp_path, save=slow_save)
    writer.submit(3, {"step": 3, "model": {"w": torch.zeros(2)}})
    inside.wait()
    assert rec.events == [] and not os.path.exists(build_checkpoint_path(str(tmp_path)))
    gate.set()
    writer.wait()
    # Loaded from disk inside the callback: the file held step 3 when "saved" was said.
    assert rec.events == [("saved", 3, 3, True)]
    writer.close()


def test_at_most_one_save_in_flight_the_next_waits_and_the_first_copy_is_freed_first(tmp_path):
    gate, inside_first = threading.Event(), threading.Event()
    order: list[str] = []
    first_tensor = torch.zeros(4)
    first_alive = weakref.ref(first_tensor)
    alive_when_second_written: list[bool] = []

    def save(folder, state):
        if state["step"] == 1:
            order.append("first write starts")
            inside_first.set()
            gate.wait()
            order.append("first write ends")
        else:
            alive_when_second_written.append(first_alive() is not None)
            order.append("second write")
        return save_checkpoint(folder, state)

    rec = Recorder()
    writer = rec.writer(tmp_path, save=save)
    writer.submit(1, {"step": 1, "model": {"w": first_tensor}})
    del first_tensor
    inside_first.wait()
    second = threading.Thread(target=lambda: (writer.submit(2, {"step": 2, "model": {"w": torch.ones(4)}}),
                                              order.append("second submit returned")))
    second.start()
    second.join(0.5)
    assert second.is_alive()  # it waits for the first write (a slow machine only makes this easier)
    gate.set()
    second.join()
    writer.wait()
    writer.close()
    assert order.index("first write ends") < order.index("second submit returned")
    assert order.index("first write ends") < order.index("second write")
    assert alive_when_second_written == [False]  # never two copies in memory
    assert [e[:2] for e in rec.events] == [("saved", 1), ("waited", 2), ("saved", 2)]
    assert load_checkpoint(str(tmp_path))["step"] == 2


def test_no_wait_when_the_previous_save_is_done(tmp_path):
    rec = Recorder()
    writer = rec.writer(tmp_path)
    for step in (1, 2, 3):
        writer.submit(step, {"step": step})
        writer.wait()
    writer.close()
    assert [e[:2] for e in rec.events] == [("saved", 1), ("saved", 2), ("saved", 3)]


@pytest.mark.parametrize("then", ["wait", "submit", "raise_if_failed"])
def test_a_failed_write_is_reported_at_once_and_raised_on_the_training_thread(tmp_path, then):
    (tmp_path / "file").write_text("a regular file")
    folder = tmp_path / "file" / "checkpoints"  # under a regular file: root cannot write there either
    rec = Recorder()
    writer = rec.writer(folder)
    writer.submit(5, {"step": 5, "model": {"w": torch.zeros(2)}})
    if then == "raise_if_failed":
        with writer._changed:  # the write has failed (no wall time: wait for the writer's own flag)
            writer._changed.wait_for(lambda: not writer._busy)
    with pytest.raises(CheckpointWriteError, match=f"checkpoint {folder}/checkpoint.pt not written: Not a directory;"
                                                   " there was no previous checkpoint"):
        getattr(writer, then)(*((6, {"step": 6}) if then == "submit" else ()))
    assert rec.events == [("failed", 5, f"checkpoint {folder}/checkpoint.pt not written: Not a directory;"
                                        " there was no previous checkpoint.")]
    writer.raise_if_failed()  # raised once
    writer.close()


def test_a_failed_rename_keeps_the_previous_checkpoint_and_names_it(tmp_path, monkeypatch):
    rec = Recorder()
    writer = rec.writer(tmp_path)
    writer.submit(1, {"step": 1})
    writer.wait()

    def failing_replace(src, dst):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "replace", failing_replace)
    writer.submit(2, {"step": 2})
    with pytest.raises(CheckpointWriteError, match=f"Input/output error; the previous checkpoint {tmp_path}/checkpoint.pt"
                                                   " is intact"):
        writer.wait()
    monkeypatch.undo()
    writer.close()
    assert load_checkpoint(str(tmp_path))["step"] == 1
    assert sorted(os.listdir(tmp_path)) == ["checkpoint.pt"]


def test_close_lets_a_write_in_flight_land_and_does_not_raise(tmp_path):
    gate, inside = threading.Event(), threading.Event()

    def slow_save(folder, state):
        inside.set()
        gate.wait()
        return save_checkpoint(folder, state)

    writer = Recorder().writer(tmp_path, save=slow_save)
    writer.submit(4, {"step": 4})
    inside.wait()
    closing = threading.Thread(target=writer.close)
    closing.start()
    closing.join(0.2)
    assert closing.is_alive()
    gate.set()
    closing.join()
    assert load_checkpoint(str(tmp_path))["step"] == 4
    with pytest.raises(RuntimeError, match="closed"):
        writer.submit(5, {"step": 5})


def test_reporter_lines_from_two_threads_never_interleave():
    class Stream(io.StringIO):
        writes: list[str] = []

        def write(self, text):
            self.writes.append(text)
            return super().write(text)

    stream = Stream()
    reporter = Reporter(True, None, stream)
    threads = [threading.Thread(target=lambda n=n: [reporter.line(f"[t{n}] line {i}") for i in range(200)])
               for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(w.endswith("\n") and w.count("\n") == 1 for w in stream.writes)  # one write per whole line
    assert len(stream.getvalue().splitlines()) == 400


def test_the_saved_line():
    assert format_checkpoint_saved(60, "/opt/ml/checkpoints", 0.01234) == (
        "[checkpoint] saved step 60 to /opt/ml/checkpoints (took 12.34 ms on the training thread)")
    assert format_checkpoint_saved(60, "/c", 0.0004, 0.0215, 0.00191) == (
        "[checkpoint] saved step 60 to /c (took 0.40 ms on the training thread; written in 21.5 ms, 1.9 ms of CPU,"
        " by the checkpoint writer)")


# -- the training loop ----------------------------------------------------------------------
ARGS = ["--epochs", "50", "--batch_size", "8", "--hidden_sizes", "[32]", "--seed", "3", "--optimizer", "adam",
        "--log_every", "4", "--hang_timeout_s", "0"]


class CountingBackend(Backend):
    """One process; counts optimizer steps so a test's writer can wait for the training."""

    def __init__(self):
        super().__init__(LEADER, torch.device("cpu"))
        self.steps = 0
        self.changed = threading.Condition()

    def backward_step(self, loss, optimizer, scaler, lr):
        super().backward_step(loss, optimizer, scaler, lr)
        with self.changed:
            self.steps += 1
            self.changed.notify_all()


def train(root: Path, args: list[str], capsys, backend: Backend | None = None) -> tuple[str, BaseException | None]:
    """One process, the loop's own code (no launcher): its log and what it raised."""
    error = None
    try:
        run_training(parse_config(ARGS + args), backend or Backend(LEADER, torch.device("cpu")),
                     {"SAGEMAKER_BASE_DIR": str(root)})
    except BaseException as err:  # SystemExit for a stop
        error = err
    return capsys.readouterr().out, error


def slowed_writer(monkeypatch, before_save):
    """The loop's writer, with `before_save(state)` run in the writer thread before each write."""
    original = train_loop.build_checkpoint_writer

    def build(checkpoint_dir, reporter):
        writer = original(checkpoint_dir, reporter)
        real = writer._save
        writer._save = lambda folder, state: (before_save(state), real(folder, state))[1]
        return writer

    monkeypatch.setattr(train_loop, "build_checkpoint_writer", build)


def when_called(monkeypatch, owner, name, hook):
    """Run hook(*args) on the calling thread before owner.name(*args)."""
    real = getattr(owner, name)

    def wrapped(*args, **kwargs):
        hook(*args)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapped)


def line_index(log: str, prefix: str) -> int:
    return next(i for i, line in enumerate(log.splitlines()) if line.startswith(prefix))


def test_a_checkpoint_every_step_in_the_background_holds_the_steps_own_state(tmp_path, capsys, monkeypatch):
    """checkpoint_every 1 (the shortest): the write of step k starts only after step k+1 has
    changed the live weights; it must still hold step k's. The synchronous run is the reference."""
    sync_root, bg_root = write_job(tmp_path / "sync"), write_job(tmp_path / "bg")
    sync_log, error = train(sync_root, ["--max_steps", "9", "--checkpoint_every", "1",
                                        "--checkpoint_background", "false"], capsys)
    assert error is None, sync_log
    backend = CountingBackend()

    def after_the_next_step(state):
        with backend.changed:
            assert backend.changed.wait_for(lambda: backend.steps > state["step"], timeout=60)

    slowed_writer(monkeypatch, after_the_next_step)
    bg_log, error = train(bg_root, ["--max_steps", "9", "--checkpoint_every", "1"], capsys, backend)
    assert error is None, bg_log
    assert [line.split(" (")[0] for line in bg_log.splitlines() if "saved step" in line] == [
        f"[checkpoint] saved step {s} to {bg_root}/checkpoints" for s in range(1, 9)]
    assert "written in" in bg_log and "written in" not in sync_log
    assert_same(load_checkpoint(str(bg_root / "checkpoints")), load_checkpoint(str(sync_root / "checkpoints")))
    assert load_checkpoint(str(bg_root / "checkpoints"))["step"] == 8
    assert_same(torch.load(bg_root / "model/model.pt")["state_dict"], torch.load(sync_root / "model/model.pt")["state_dict"])


def test_the_end_of_training_waits_for_the_last_write(tmp_path, capsys, monkeypatch):
    """The write of step 10 goes on only once the loop's end is reached (or after 2 s): with
    the end's wait it is on disk, and said so, before anything of the end happens."""
    root = write_job(tmp_path)
    end_reached, written = threading.Event(), threading.Event()

    def at_the_end(*args):
        print("[test] the end of the loop", flush=True)
        end_reached.set()
        written.wait(timeout=60)

    when_called(monkeypatch, train_loop, "verify_replicas", at_the_end)
    slowed_writer(monkeypatch, lambda state: state["step"] == 10 and end_reached.wait(timeout=2))
    when_called(monkeypatch, train_loop, "format_checkpoint_saved", lambda step, *rest: step == 10 and written.set())
    log, error = train(root, ["--max_steps", "12", "--checkpoint_every", "5"], capsys)
    assert error is None, log
    assert line_index(log, "[checkpoint] saved step 10 ") < line_index(log, "[test] the end of the loop")
    assert line_index(log, "[test] the end of the loop") < line_index(log, "[result]")
    assert load_checkpoint(str(root / "checkpoints"))["step"] == 10


def test_a_sigterm_stop_waits_for_its_checkpoint_before_exiting(tmp_path, capsys, monkeypatch):
    """A SIGTERM while step 2's write is in flight; at the next log step every rank agrees to
    stop and the stop's checkpoint is written: it must be on disk, and said so, before the
    "[stopped]" line and the exit. Each write goes on once "[stopped]" is said (or after 1 s)."""
    root = write_job(tmp_path)
    stopped_said = threading.Event()
    when_called(monkeypatch, Reporter, "line",
                lambda self, text: text.startswith("[stopped]") and stopped_said.set())

    def before_save(state):
        if state["step"] == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # the loop's handler notes it
        stopped_said.wait(timeout=1)

    slowed_writer(monkeypatch, before_save)
    log, error = train(root, ["--max_steps", "40", "--checkpoint_every", "2"], capsys)
    assert isinstance(error, SystemExit) and error.code == EXIT_STOPPED, log
    stop_step = int(log.split("[stopped] SIGTERM: stopped at step ", 1)[1].split(";")[0])
    assert stop_step % 4 == 0  # a log step (log_every 4)
    assert line_index(log, f"[checkpoint] saved step {stop_step} ") < line_index(log, "[stopped]")
    assert load_checkpoint(str(root / "checkpoints"))["step"] == stop_step
    assert not (root / "model/model.pt").exists()


@pytest.mark.parametrize("background", ["true", "false"])
def test_a_write_error_fails_the_run_in_both_modes(tmp_path, capsys, background):
    root = write_job(tmp_path)
    (root / "input/config").mkdir(parents=True, exist_ok=True)
    (root / "blocker").write_text("a regular file")
    folder = root / "blocker" / "checkpoints"  # under a regular file: root cannot write there either
    (root / "input/config/checkpointconfig.json").write_text(json.dumps({"LocalPath": str(folder)}))
    log, error = train(root, ["--max_steps", "30", "--checkpoint_every", "5", "--checkpoint_background", background],
                       capsys)
    assert isinstance(error, CheckpointWriteError), log
    assert f"checkpoint {folder}/checkpoint.pt not written: Not a directory" in str(error)
    assert "saved step" not in log and "[result]" not in log
    assert ("[checkpoint] step 5 not saved: " in log) == (background == "true")  # logged when it happened


def test_a_failed_background_write_fails_the_run_at_the_next_step_not_the_next_save(tmp_path, capsys, monkeypatch):
    """Step 5's write fails; step 7 ends only once the failure is known: the run stops right
    there (no step 8 progress line; the next checkpoint, at 10, is never reached)."""
    root = write_job(tmp_path)
    (root / "input/config").mkdir(parents=True, exist_ok=True)
    (root / "blocker").write_text("a regular file")
    (root / "input/config/checkpointconfig.json").write_text(json.dumps({"LocalPath": str(root / "blocker/c")}))
    failed = threading.Event()
    when_called(monkeypatch, Reporter, "line", lambda self, text: "not saved" in text and failed.set())
    backend = CountingBackend()
    when_called(monkeypatch, backend, "backward_step",
                lambda *args: backend.steps == 6 and failed.wait(timeout=60))  # the 7th step
    log, error = train(root, ["--max_steps", "30", "--checkpoint_every", "5"], capsys, backend)
    assert isinstance(error, CheckpointWriteError), log
    assert 5 < backend.steps <= 7
    assert "step 4/30" in log and "step 8/30" not in log


def test_the_next_copy_is_taken_only_once_the_previous_write_is_on_disk(tmp_path, capsys, monkeypatch):
    """Step 5's write goes on once step 10's copy is taken (or after 2 s): the loop must wait
    for the write before copying again, so that one copy exists at a time."""
    root = write_job(tmp_path)
    backend = CountingBackend()
    events: list[str] = []
    second_copy = threading.Event()

    def copying(*args):
        events.append(f"copy at step {backend.steps}")
        if backend.steps == 10:
            second_copy.set()

    when_called(monkeypatch, backend, "checkpoint_state", copying)
    when_called(monkeypatch, train_loop, "format_checkpoint_saved", lambda step, *rest: events.append(f"saved {step}"))
    slowed_writer(monkeypatch, lambda state: state["step"] == 5 and second_copy.wait(timeout=2))
    log, error = train(root, ["--max_steps", "12", "--checkpoint_every", "5"], capsys, backend)
    assert error is None, log
    assert events[:4] == ["copy at step 5", "saved 5", "copy at step 10", "saved 10"]
    assert "[checkpoint] step 10 waited " in log

"""Our TensorBoard event file: the leader's live figures as scalars and text, written with
tensorboardX's event writer (imported only when TensorBoard is on; not named after it, so it
shadows nothing).

A folder that cannot be made or written (read-only, full) is a note (the log and the report's
notes), once, and the job goes on without its events: they are a view of the job, never its
failure. A figure the writer cannot hold (a step outside int64, a value that is not a finite
number within a 32-bit float) is not the folder's fault: that figure is left out with a note,
once, and the rest are written. The file is written from the live thread only
(live/loop.py), so it needs no lock.
"""

from __future__ import annotations

import math
import os


# The record writer's optional S3 and GCS clients, for s3:// and gs:// folders: ours is local.
NOT_NEEDED = ("boto3", "google.cloud")
INT64 = (-(1 << 63), (1 << 63) - 1)  # an event's step
FLOAT32_MAX = 3.4028234663852886e38  # a scalar's simple_value (a larger one would become inf)


def decide_unholdable(value, step, wall) -> str | None:
    """Why the events cannot hold this scalar (pure), or None."""
    if isinstance(step, bool) or not isinstance(step, int) or not INT64[0] <= step <= INT64[1]:
        return f"step {step!r} is not a 64-bit integer"[:120]
    for what, number, largest in (("value", value, FLOAT32_MAX), ("wall time", wall, float("inf"))):
        if isinstance(number, bool) or not isinstance(number, (int, float)):
            return f"{what} {number!r} is not a number"[:120]
        if isinstance(number, int) and abs(number) > FLOAT32_MAX or \
                isinstance(number, float) and not (math.isfinite(number) and abs(number) <= largest):
            return f"{what} {number!r} is not a finite number the writer holds"[:120]
    return None


def load_writer():
    """tensorboardX's event writer and protos, loaded without its package's __init__, which
    imports torch (2.7 s of CPU and hundreds of MB in the launcher, measured here) and its
    whole SummaryWriter; and without the record writer's S3/GCS clients (boto3: 0.3 s). This
    process imports tensorboardX nowhere else (the script's processes are not this one)."""
    import importlib.util
    import sys
    import types

    if "tensorboardX" not in sys.modules:
        spec = importlib.util.find_spec("tensorboardX")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("tensorboardX is not installed (pyproject.toml, docker/versions.env)")
        package = types.ModuleType("tensorboardX")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["tensorboardX"] = package
    hidden = [name for name in NOT_NEEDED if name not in sys.modules]
    sys.modules.update({name: None for name in hidden})  # importing them now raises ImportError
    try:
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto import event_pb2, plugin_text_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2
    finally:
        for name in hidden:
            sys.modules.pop(name, None)
    return EventsWriter, event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, plugin_text_pb2


def build_utf8(text: str) -> str:
    """Text protobuf can encode: a lone surrogate (a rank's name can be any text) becomes '?'."""
    return text.encode("utf-8", "replace").decode("utf-8")


class EventsFile:
    def __init__(self, folder: str, note):
        self.folder = folder
        self.note = note  # text -> None: what was left out, and why the folder failed (the live notes)
        self.problem: str | None = None  # why no more events are written, once that happened
        self.written = 0  # events written
        self.left_out = 0  # scalars the writer cannot hold
        self._writer = None
        self._modules = None

    def _open(self) -> None:
        self._modules = load_writer()
        os.makedirs(self.folder, exist_ok=True)
        self._writer = self._modules[0](os.path.join(self.folder, "events"), ".byoc")

    def write(self, scalars: list[tuple[str, float, int, float]], texts: list[tuple[str, str, int, float]]) -> bool:
        """scalars and texts: (tag, value, step, wall time); every value finite (the live view
        left the others out). Flushed at once: SageMaker syncs what is on disk. False once the
        folder failed (then never again)."""
        if self.problem is not None:
            return False
        if not scalars and not texts:
            return True
        try:
            if self._writer is None:
                self._open()
            self._write_events(scalars, texts)
            self._writer.flush()
        except (OSError, ImportError) as exc:  # the folder (or the writer) is not there for us: never again
            self.fail(exc)
            return False
        except Exception as exc:  # noqa: BLE001 - a figure, not the folder: this tick's rest is left out
            self.leave_out("this tick's figures", f"{type(exc).__name__}: {exc}"[:120])
        return True

    def _write_events(self, scalars, texts) -> None:
        _, event_pb2, summary_pb2, tensor_pb2, shape_pb2, text_pb2 = self._modules
        Event, Summary = event_pb2.Event, summary_pb2.Summary
        # The scalars of one (step, wall time) share an event, as a merged summary does: a tick
        # at 1,024 hosts has ~5,300 scalars at a few hundred points in time, and a record each
        # (two CRCs in pure Python, a proto) was a sixth of the tick. A scalar joins a moment's
        # event only if that event comes after its tag's last one: each tag's scalars stay in
        # the order given (joined by moment alone, a host's point at a rank's step 2 put that
        # rank's step 2 before its step 1).
        groups: list[tuple[int, float, list]] = []
        newest: dict[tuple, int] = {}  # (step, wall) -> the index of its newest event
        after: dict[str, int] = {}  # tag -> the index of the event its last scalar joined
        for tag, value, step, wall in scalars:
            why = decide_unholdable(value, step, wall)
            if why is not None:
                self.leave_out(tag, why)
                continue
            index = newest.get((step, wall))
            if index is None or index <= after.get(tag, -1):
                index = newest[(step, wall)] = len(groups)
                groups.append((step, wall, []))
            groups[index][2].append(Summary.Value(tag=tag, simple_value=value))
            after[tag] = index
        for step, wall, values in groups:
            self._writer.write_event(Event(wall_time=wall, step=step, summary=Summary(value=values)))
            self.written += 1
        # Text as tensorboardX.summary.text makes it (the text plugin's string tensor).
        metadata = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(
            plugin_name="text", content=text_pb2.TextPluginData(version=0).SerializeToString()))
        for tag, value, step, wall in texts:
            why = decide_unholdable(0.0, step, wall)
            if why is not None:
                self.leave_out(tag, why)
                continue
            tensor = tensor_pb2.TensorProto(dtype="DT_STRING", string_val=[build_utf8(value).encode("utf-8")],
                                            tensor_shape=shape_pb2.TensorShapeProto(dim=[shape_pb2.TensorShapeProto.Dim(size=1)]))
            summary = Summary(value=[Summary.Value(tag=tag, metadata=metadata, tensor=tensor)])
            self._writer.write_event(Event(wall_time=wall, step=step, summary=summary))
            self.written += 1

    def leave_out(self, tag: str, why: str) -> None:
        """A figure the writer cannot hold: left out, said once (the first's words)."""
        self.left_out += 1
        if self.left_out == 1:
            self.note(f"TensorBoard events: figures the writer cannot hold are left out (the first: "
                      f"{build_utf8(tag)[:80]}: {why})")

    def fail(self, exc: Exception) -> None:
        what = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        self.problem = f"TensorBoard events: cannot write {self.folder}: {what}; the job goes on without them"
        self.note(self.problem)
        self.close()

    def close(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close()
            except Exception:  # noqa: BLE001 - a full disk again: nothing more to say
                pass

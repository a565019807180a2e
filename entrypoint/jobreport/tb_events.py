"""Our TensorBoard event file: the leader's live figures as scalars and text, written with
tensorboardX's event writer (imported only when TensorBoard is on; not named after it, so it
shadows nothing).

A folder that cannot be made or written (read-only, full) is a note in the log, once, and the
job goes on without its events: they are a view of the job, never its failure. The file is
written from the live thread only (jobreport/live.py), so it needs no lock.
"""

from __future__ import annotations

import os


# The record writer's optional S3 and GCS clients, for s3:// and gs:// folders: ours is local.
NOT_NEEDED = ("boto3", "google.cloud")


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
    def __init__(self, folder: str, log):
        self.folder = folder
        self.log = log
        self.problem: str | None = None  # why no more events are written, once that happened
        self.written = 0  # events written
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
        except Exception as exc:  # noqa: BLE001 - OSError mostly; never the job's failure
            self.fail(exc)
            return False
        return True

    def _write_events(self, scalars, texts) -> None:
        _, event_pb2, summary_pb2, tensor_pb2, shape_pb2, text_pb2 = self._modules
        Event, Summary = event_pb2.Event, summary_pb2.Summary
        for tag, value, step, wall in scalars:
            summary = Summary(value=[Summary.Value(tag=tag, simple_value=value)])
            self._writer.write_event(Event(wall_time=wall, step=step, summary=summary))
            self.written += 1
        # Text as tensorboardX.summary.text makes it (the text plugin's string tensor).
        metadata = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(
            plugin_name="text", content=text_pb2.TextPluginData(version=0).SerializeToString()))
        for tag, value, step, wall in texts:
            tensor = tensor_pb2.TensorProto(dtype="DT_STRING", string_val=[build_utf8(value).encode("utf-8")],
                                            tensor_shape=shape_pb2.TensorShapeProto(dim=[shape_pb2.TensorShapeProto.Dim(size=1)]))
            summary = Summary(value=[Summary.Value(tag=tag, metadata=metadata, tensor=tensor)])
            self._writer.write_event(Event(wall_time=wall, step=step, summary=summary))
            self.written += 1

    def fail(self, exc: Exception) -> None:
        what = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        self.problem = f"TensorBoard events: cannot write {self.folder}: {what}; the job goes on without them"
        self.log(f"job report: {self.problem}")
        self.close()

    def close(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close()
            except Exception:  # noqa: BLE001 - a full disk again: nothing more to say
                pass

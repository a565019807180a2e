"""Our TensorBoard event file: the leader's live figures as scalars and text, written with
tensorboardX's event writer (imported only when TensorBoard is on; not named after it, so it
shadows nothing).

A folder that cannot be made or written (read-only, full) is a note in the log, once, and the
job goes on without its events: they are a view of the job, never its failure. The file is
written from the live thread only (jobreport/live.py), so it needs no lock.
"""

from __future__ import annotations

import os


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

    def _open(self) -> None:
        from tensorboardX.event_file_writer import EventsWriter

        os.makedirs(self.folder, exist_ok=True)
        self._writer = EventsWriter(os.path.join(self.folder, "events"), ".byoc")

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
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.proto.summary_pb2 import Summary
        from tensorboardX.summary import text as text_summary

        for tag, value, step, wall in scalars:
            summary = Summary(value=[Summary.Value(tag=tag, simple_value=value)])
            self._writer.write_event(Event(wall_time=wall, step=step, summary=summary))
            self.written += 1
        for tag, value, step, wall in texts:
            summary = text_summary(tag, build_utf8(value))
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

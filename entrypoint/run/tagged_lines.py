"""mpirun's tagged output put back into whole lines (pure: bytes in, bytes out).

Under `mpirun --tag-output`, each host's daemon reads a rank's pipe in chunks of its own size
(4 KiB in Open MPI 4.1) and tags each chunk, and each line within it: `[1,0]<stdout>:text`. A
chunk boundary falls anywhere in a line once the rank writes faster than the daemon reads, so
one line arrives as two tagged pieces, and another rank's line can land between them, glued to
the first piece. Whole-line writes in the ranks (rank/record_errors.py) do not prevent this: the
cut is on the reading side.

TaggedLines rejoins each rank-and-stream's pieces by their tag, so every line a rank wrote
whole leaves the entrypoint whole, under its tag. Text shaped like a tag counts as one only
where mpirun could have written it; where it could not, it is the rank's own text
(`print("[1,0]<stdout>: x")`) and stays in the rank's line:
- on the stream it names: `<stdout>` on mpirun's stdout, `<stderr>`/`<stddiag>` on its stderr;
- not right after another tag: mpirun writes one tag before each item and each line, and never
  an empty one, so a second tag in a row is the first text of the rank's line;
- naming a rank of this job (below its -np).
Inside a line, after some of a rank's text, a tag of this stream naming a rank of the job is
mpirun's: the ranks' output reaches mpirun's daemons through a pseudo-terminal, which cuts a
line at any byte under load, so such a tag is where another rank's piece was glued, and no
byte tells it from the same text printed by a rank (docs/reliability.md says so).
Text without a tag (mpirun's own messages)
passes through as it comes. A piece still waiting for its line's end is written as a line of
its own when the stream goes quiet (flush_partial), when it grows past MAX_PENDING_BYTES, and
at the end of the stream: output is never held back for long or lost.
"""

from __future__ import annotations

import re

TAG = re.compile(rb"\[\d+,\d+\]<std(?:out|err|diag)>:")
# The start of a tag that a read may have cut: held until the next read completes it.
_TAG_START = re.compile(rb"\[\d*(?:,\d*(?:\](?:<(?:s(?:t(?:d(?:[a-z]{0,4}(?:>)?)?)?)?)?)?)?)?")
_LONGEST_TAG = 40
MAX_PENDING_BYTES = 65536


class TaggedLines:
    def __init__(self, stream: str = "stdout", ranks: int | None = None) -> None:
        """stream: which of mpirun's pipes this is; ranks: the job's -np (None: any)."""
        self.streams = (b"<stdout>:",) if stream == "stdout" else (b"<stderr>:", b"<stddiag>:")
        self.ranks = ranks
        self.pending: dict[bytes, bytes] = {}  # tag -> the start of its current line
        self.current: bytes | None = None  # the tag whose piece the last read ended inside
        self.carry = b""  # the start of a tag, cut by the last read

    def feed(self, chunk: bytes) -> bytes:
        """What to write now for chunk: whole lines, and untagged text as it came."""
        data = self.carry + chunk
        self.carry = b""
        start = data.rfind(b"[", max(0, len(data) - _LONGEST_TAG))
        if start >= 0 and _TAG_START.fullmatch(data, start):
            data, self.carry = data[:start], data[start:]
        out: list[bytes] = []
        at = 0
        run_end = at  # the end of the tags right after mpirun's last one: all the rank's text
        for match in TAG.finditer(data):
            if not self._could_be_mpiruns(match, run_end):
                run_end = match.end() if match.start() == run_end else run_end
                continue  # the rank's own text: it stays in the text around it
            self._add(self.current, data[at:match.start()], out)
            self.current, at = match.group(), match.end()
            run_end = at
        self._add(self.current, data[at:], out)
        return b"".join(out)

    def _could_be_mpiruns(self, match, run_end: int) -> bool:
        tag = match.group()
        if not tag.endswith(self.streams) or (match.start() == run_end and self.current is not None and run_end > 0):
            return False
        rank = int(tag[tag.index(b",") + 1:tag.index(b"]")])
        return self.ranks is None or rank < self.ranks

    def _add(self, tag: bytes | None, text: bytes, out: list[bytes]) -> None:
        if not text:
            return
        if tag is None:
            out.append(text)
            return
        *lines, rest = text.split(b"\n")
        for line in lines:
            out += [tag, self.pending.pop(tag, b""), line, b"\n"]
        if lines:
            # After a newline every rank's line starts with its tag: text here has none.
            self.current = None
            if rest:
                out.append(rest)
            return
        piece = self.pending.get(tag, b"") + rest
        if len(piece) > MAX_PENDING_BYTES:  # a line with no end (a progress bar's \r updates)
            out += [tag, piece, b"\n"]
            self.pending.pop(tag, None)
        else:
            self.pending[tag] = piece

    @property
    def has_partial(self) -> bool:
        return bool(self.pending or self.carry)

    def flush_partial(self) -> bytes:
        """Every line still waiting for its end, each as a line of its own (the stream went
        quiet, or ended)."""
        out = [tag + piece + b"\n" for tag, piece in self.pending.items()]
        self.pending.clear()
        out.append(self.carry)
        self.carry = b""
        self.current = None
        return b"".join(out)

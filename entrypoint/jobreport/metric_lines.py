"""Throughput as the script itself reports it, from its output lines: `12,345 samples/s`
(train/'s progress lines), `samples_per_sec=123.4` or `"samples_per_sec": 123.4` (key=value
and JSON metric lines, what SageMaker's metric_definitions usually catch). Every line of the
job's processes passes here (supervise.OutputCollector.on_line): a substring test first, the
regular expressions only on the lines that mention samples."""

from __future__ import annotations

import re
import statistics
import threading
import time

AFTER_NUMBER = re.compile(r"(?<![\w.,])([0-9][0-9,]*(?:\.[0-9]+)?)\s*samples/s(?:ec)?\b")
AFTER_KEY = re.compile(r"samples_per_sec(?:ond)?[\"']?\s*[:=]\s*([0-9][0-9]*(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)")
MAX_VALUES = 2048


def parse_samples_per_s(line: str) -> float | None:
    """The samples a second a line reports, or None; a value that is not a finite number, or
    a number with misplaced commas, is no value."""
    if "sample" not in line:
        return None
    match = AFTER_KEY.search(line) or AFTER_NUMBER.search(line)
    if match is None:
        return None
    text = match.group(1)
    if "," in text and not re.fullmatch(r"[0-9]{1,3}(?:,[0-9]{3})+(?:\.[0-9]+)?", text):
        return None
    try:
        value = float(text.replace(",", ""))
    except ValueError:
        return None
    return value if value == value and value != float("inf") else None


class ReportedThroughput:
    """The values seen, with when (thread-safe: every output pump calls take). Past MAX_VALUES,
    every other one is dropped: the median stays that of the whole run."""

    def __init__(self) -> None:
        self.values: list[tuple[float, float]] = []
        self._lock = threading.Lock()

    def take(self, line: str) -> None:
        value = parse_samples_per_s(line)
        if value is None:
            return
        with self._lock:
            self.values.append((time.time(), value))
            if len(self.values) > MAX_VALUES:
                self.values = self.values[::2]

    def median(self) -> float | None:
        with self._lock:
            values = [v for _, v in self.values]
        return round(statistics.median(values), 1) if values else None

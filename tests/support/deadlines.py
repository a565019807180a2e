"""Checks that a wait gave up at its own deadline, whatever the machine's speed.

A wait with a deadline looks at its stop (a callable) and then at the clock, in that order,
each time round its loop. Its deadline is set before its first look at the stop. So, on any
machine, at most one look at the stop can come at or after (first look + timeout_s): the
look after it finds the deadline passed and the wait returns "timeout". A second late look
means the wait ignored its deadline; the stop then answers True, so the wait ends as
"stopped" instead of "timeout" (the test fails) rather than running on.
"""

import time


class DeadlineStop:
    """The `stopped` callable to give a wait whose deadline a test checks."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.looks: list[float] = []

    def __call__(self) -> bool:
        self.looks.append(time.monotonic())
        late = [t for t in self.looks if t >= self.looks[0] + self.timeout_s]
        return len(late) > 1

"""The host's one loop (host_loop.py) and the events it carries (events.py): every thread,
port reader and signal handler posts an event; the main thread takes each and hands it to the
current phase's handlers."""

from entrypoint.loop.events import WAKE_UPS, ChildExited, StacksRequested, StepEnded, StopRequested
from entrypoint.loop.host_loop import Burst, Handlers, HostLoop, StepCut, Waited

__all__ = ["WAKE_UPS", "Burst", "ChildExited", "Handlers", "HostLoop", "StacksRequested", "StepCut", "StepEnded",
           "StopRequested", "Waited"]

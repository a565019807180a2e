"""`python -m entrypoint`: cli.main, then the process ends at once with its exit code."""

import os
import sys

from entrypoint.cli import main

code = main()
# By now the outcome is written and the other hosts are told. The interpreter's teardown would
# first restore SIGTERM's default action, so a stop arriving during it (SDK v2 local mode stops
# every container once one has exited) would end the process as "killed by SIGTERM" instead
# of with this code. Nothing is left for the teardown to do: the entrypoint's threads are
# daemons, its folders removed and its files closed; only the standard streams to flush.
for stream in (sys.stdout, sys.stderr):
    try:
        stream.flush()
    except (OSError, ValueError):
        pass
os._exit(code)

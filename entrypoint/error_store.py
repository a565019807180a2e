"""Root causes from every host reach the leader through a torch TCPStore it serves.

With torchrun and the parameter server, each host runs its own launcher and its ranks'
output stays on that host; yet the leader's output/failure must name the first failure
anywhere. The leader serves a c10d TCPStore (torch's own key-value store, the one torchrun
rendezvous on) for the job's lifetime; a failing rank's record_errors appends its record
there (BYOC_ERROR_STORE=leader:port). torch is imported in a background thread, so the job
starts as fast as without it.
"""

from __future__ import annotations

import threading
from datetime import timedelta

from entrypoint.failure import RootCause, parse_root_cause_line
from entrypoint.rank.record_errors import MARKER, STORE_COUNT_KEY, STORE_RECORD_KEY


class RootCauseStore:
    def __init__(self, port: int, log):
        self.port = port
        self.log = log
        self._store = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            from torch.distributed import TCPStore

            self._store = TCPStore(
                "0.0.0.0", self.port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10)
            )
        except Exception as exc:  # noqa: BLE001 - root causes from other hosts are a bonus
            self.log(f"cannot serve the root-cause store on port {self.port}: {exc}")
        finally:
            self._ready.set()

    def collect(self) -> list[RootCause]:
        self._ready.wait(timeout=60)
        if self._store is None:
            return []
        causes = []
        try:
            count = self._store.add(STORE_COUNT_KEY, 0)
            for i in range(1, count + 1):
                line = self._store.get(STORE_RECORD_KEY.format(i)).decode("utf-8", "replace")
                cause = parse_root_cause_line(MARKER + line)
                if cause is not None:
                    causes.append(cause)
        except Exception as exc:  # noqa: BLE001
            self.log(f"cannot read the root-cause store: {exc}")
        return causes

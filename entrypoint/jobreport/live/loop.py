"""This host's live view (jobreport/live/update.py says what moves), ticked on the report's
thread (jobreport/sampler.py) from its start to its stop, both by the host's part of the job
report (jobreport/host.py):

- a worker of a job-port launch (torchrun, parameter server): every tick, its update to the
  leader (send, which returns the bytes sent);
- the leader, or the one host: its own update and the workers' queued ones, into the live view,
  the TensorBoard events (when on) and the status line (when due).
An MPI worker runs none: its figures reach the leader at the end only (asked on the job port).
"""

from __future__ import annotations

import threading
import time

from entrypoint.jobreport.live.update import Notes, build_update, fit_update, load_rank_raws, parse_update
from entrypoint.jobreport.live.status_line import build_status_line
from entrypoint.settings import DEFAULTS



def decide_tick_s(tensorboard_dir: str | None, live_interval_s: float, status_interval_s: float,
                  worker: bool) -> float | None:
    """How often this host's live thread works; None: it has nothing to do. A worker sends at
    the live interval when the leader writes events, else at the status line's."""
    ticks = ([live_interval_s] if tensorboard_dir else []) + ([status_interval_s] if status_interval_s > 0 else [])
    if not ticks:
        return None
    return ticks[0] if worker else min(ticks)


class LiveLoop:
    def __init__(self, spec, host: str, sampler, throughput, log, send=None, capacity_ends_at: float | None = None,
                 max_bytes: int = DEFAULTS.live_figures_bytes, job_hosts: int = 1):
        from entrypoint.jobreport.live.view import LiveView, decide_points_sent

        self.spec, self.host, self.sampler, self.throughput, self.log = spec, host, sampler, throughput, log
        self.send = send  # a worker's: text -> bytes delivered (0: not)
        self.max_bytes = max_bytes  # a worker's update, at most (settings.live_figures_bytes)
        self.points_sent = decide_points_sent(job_hosts)  # a worker's: its newest points the leader reads
        self.capacity_ends_at = capacity_ends_at
        self.notes, self.notes_logged = Notes(), 0
        self.sent: dict = {}  # what this host's updates covered so far (update.build_update)
        self.started_at = sampler.phases.get("entrypoint start", time.time())
        self.view = LiveView(self.started_at, self.notes)
        self.events = None
        if spec.tensorboard_dir and send is None:
            from entrypoint.jobreport.live.tb_events import EventsFile

            # what it leaves out, and a folder it cannot write, are notes: logged and in the report
            self.events = EventsFile(spec.tensorboard_dir, lambda text: self.notes.add(text, always=True))
        self.tick_s = decide_tick_s(spec.tensorboard_dir, spec.live_interval_s, spec.status_interval_s, send is not None)
        # host -> its newest update not read yet: every host is in the next tick, whatever their
        # number (a queue of 64 once left 191 of 256 hosts out); a newer update replaces one not
        # read yet (replaced counts them: their points are not drawn, the newer one's are).
        self.inbox: dict[str, str] = {}
        self.inbox_lock = threading.Lock()  # the main thread puts, the live thread takes
        self.replaced = 0
        self.messages = self.bytes_sent = self.largest = 0  # a worker's traffic to the leader
        self.cpu_s = 0.0  # this thread's CPU time, with the sampler's in the report
        self.next_status = time.monotonic() + spec.status_interval_s
        self.phases_said = 0
        self.stopped = False
        self.attached = False  # ticked on the report's thread (start)

    def start(self) -> "LiveLoop":
        if self.tick_s is not None:
            self.sampler.attach(self)
            self.attached = True
        return self

    def take_remote(self, host: str, text: str) -> None:
        """A worker's update from the job port (the role's handler, on the main thread): kept for
        the live thread's next tick, the newest of each host (the live thread alone writes the
        notes: it says the replaced ones counted here)."""
        with self.inbox_lock:
            if host in self.inbox:
                self.replaced += 1
            self.inbox[host] = text

    def tick(self) -> None:
        started = time.thread_time()
        try:
            own = build_update(self.host, self.sampler.snapshot()[0], load_rank_raws(self.spec.rank_folder, self.notes),
                               self.sent, self.throughput.median(), self.notes)
            if self.send is not None:
                self.send_update(own)
            else:
                self.take_updates(own)
        except Exception as exc:  # noqa: BLE001 - the live view is a bonus: never the job's failure
            self.notes.add(f"live figures: {type(exc).__name__}: {exc}"[:300])
        if self.send is None and self.spec.status_interval_s > 0 and time.monotonic() >= self.next_status:
            self.next_status = time.monotonic() + self.spec.status_interval_s
            self.log(self.status_line())  # whatever this tick's figures did
        self.log_notes()
        self.cpu_s += time.thread_time() - started

    def send_update(self, update: dict) -> None:
        text = fit_update(update, self.max_bytes, self.points_sent)
        delivered = self.send(text)
        if delivered:
            self.messages, self.bytes_sent = self.messages + 1, self.bytes_sent + delivered
            self.largest = max(self.largest, delivered)

    def take_updates(self, own: dict) -> None:
        with self.inbox_lock:
            inbox, self.inbox = self.inbox, {}
            replaced = self.replaced
        if replaced:
            self.notes.add("workers' live figures came faster than they were read: an update replaced by its "
                           "host's newer one is not drawn (the newer one is)")
        updates = [own]
        newest = self.view.decide_points_read(len(inbox) + 1)
        for host, text in inbox.items():
            parsed = parse_update(text, host, self.notes, newest)
            if parsed is None:
                self.notes.add(f"host {host}: live figures that are not figures, left out")
            else:
                updates.append(parsed)
        scalars, texts = self.view.take_all(updates)
        texts.extend(self.phase_texts())
        if self.events is not None:
            self.events.write(scalars, texts)

    def status_line(self) -> str:
        util, mem = self.view.gpu_now()
        left = self.capacity_ends_at - time.time() if self.capacity_ends_at is not None else None
        return build_status_line(time.time() - self.started_at, self.view.ranks_now(), util, mem, left)

    def phase_texts(self) -> list:
        """This host's phases, as text, when new ones were reached."""
        phases = sorted(self.sampler.snapshot()[1].items(), key=lambda p: p[1])
        if len(phases) == self.phases_said:
            return []
        self.phases_said = len(phases)
        text = "\n\n".join(f"{self.host}: {name} at +{when - self.started_at:.1f} s" for name, when in phases)
        return [("job/phases", text, len(phases), time.time())]

    def log_notes(self) -> None:
        for note in self.notes.seen[self.notes_logged:]:
            self.log(f"job report (live): {note}")
        self.notes_logged = len(self.notes.seen)

    def stop(self) -> None:
        """The ticks end (one under way first); the leader writes what came since its last tick
        (the finished job's folder then holds everything); a worker says what its live figures
        cost. Idempotent."""
        if self.stopped:
            return
        self.stopped = True
        if self.attached:
            self.sampler.detach(self)
        if self.tick_s is None:
            return
        if self.send is None:
            self.tick()
        elif self.messages:
            self.log(f"job report (live): {self.messages} update(s) sent to the leader, {self.bytes_sent} bytes, "
                     f"the largest {self.largest} bytes")
        if self.events is not None:
            self.events.close()

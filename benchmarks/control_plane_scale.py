"""The job's control plane at scale: the real leader's job port, liveness watch, restart words
and live view, against H-1 light stand-in workers that speak the real protocol, measured here.

    .venv/bin/python benchmarks/control_plane_scale.py --hosts 2,64,256,1024 [--liveness-s 20]

The leader (this process): hosts/job_port.JobPort (sized to the job), a PeerWatch over every
worker's port, the restart barrier as roles/job_port.JobPortLeader runs it (every `ended` taken,
then `start` to every worker at once: send_to_each), and jobreport/live's LiveLoop taking the
workers' live figures and ticking. The stand-ins (one other process, one selector thread, no
thread a worker): each worker has its own loopback address (127.0.x.y) and job port there, which
answers the leader's words (TAKEN) and its probes; each probes the leader's port at the job's
pace (job_port.decide_probe_every_s), and sends its words signed with the job's key, all at once:
live figures (real updates: live/update.build_update), `ended 1`, then its outcome (HostDone).
Left out: the ranks, torchrun, the role objects and their checks of a sender's address, DNS
(the stand-ins' names are addresses), and the network: every host is on this machine's
loopback, sharing its 2 cores.

Ends with one JSON line per host count: {"hosts", "connect_s", "ready_s", "restart_barrier_s",
"settle_s", "dropped_connections", "lost_messages", "leader_threads_peak", "liveness_cpu_pct",
"live_cpu_pct", "live_hosts_shown"}. lost_messages counts the words a stand-in sent that the
leader never took, whatever the stand-in was told.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import selectors
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

KEY = "5e" * 32
LEADER_PORT, WORKER_PORT = 47811, 47812


def stand_in_address(i: int) -> str:
    return f"127.0.{1 + i // 250}.{1 + i % 250}"


# --- the stand-ins (a child process) ----------------------------------------------------------

class StandIns:
    """count workers on one selector thread: their ports (answering TAKEN to each line), their
    probes of the leader, and their words to it, all at once."""

    def __init__(self, count: int, every_s: float):
        from entrypoint.hosts.job_port import parse_record, parse_signed_line

        self.parse_record, self.parse_signed_line = parse_record, parse_signed_line
        self.count, self.every_s = count, every_s
        self.selector = selectors.DefaultSelector()
        self.opened_at = time.time()
        self.starts: dict[int, float] = {}  # worker -> when its `start 2` was taken
        for i in range(count):
            server = socket.create_server((stand_in_address(i), WORKER_PORT), backlog=64)
            server.setblocking(False)
            self.selector.register(server, selectors.EVENT_READ, ("listen", i))
        self.outgoing: dict = {}
        self.results: dict = {}
        self.next_probe = time.monotonic() + every_s

    def send_all(self, build_line) -> None:
        """Every worker's line to the leader at once; results: worker -> the answer."""
        for i in range(self.count):
            sock = socket.socket()
            sock.setblocking(False)
            sock.bind((stand_in_address(i), 0))
            sock.connect_ex(("127.0.0.1", LEADER_PORT))
            self.outgoing[sock] = [i, build_line(i).encode(), b"", "connecting"]
            self.selector.register(sock, selectors.EVENT_WRITE, ("send", sock))

    def probe_leader(self) -> None:
        for i in range(self.count):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # as the real probes
            sock.setblocking(False)
            sock.bind((stand_in_address(i), 0))
            sock.connect_ex(("127.0.0.1", LEADER_PORT))
            self.selector.register(sock, selectors.EVENT_WRITE, ("probe", sock))

    def step(self, timeout: float) -> None:
        if time.monotonic() >= self.next_probe:
            self.next_probe = time.monotonic() + self.every_s
            self.probe_leader()
        for key, _ in self.selector.select(timeout=timeout):
            kind, what = key.data
            if kind == "listen":
                try:
                    conn, _ = key.fileobj.accept()
                except BlockingIOError:
                    continue
                conn.setblocking(False)
                self.selector.register(conn, selectors.EVENT_READ, ("serve", [what, conn, b""]))
            elif kind == "serve":
                self.serve(what)
            elif kind == "probe":
                self.selector.unregister(what)
                what.close()
            elif kind == "send":
                self.advance(what)

    def serve(self, state) -> None:
        i, conn, data = state
        try:
            chunk = conn.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if chunk:
            state[2] = data + chunk
            return
        answers = b""
        for line in data.decode().splitlines():
            record, _ = self.parse_signed_line(line, KEY, self.opened_at)
            message = self.parse_record(record) if record else None
            if getattr(message, "word", None) == "start":
                self.starts[i] = time.monotonic()
            answers += b"BYOC-TAKEN\n" if record else b"BYOC-REFUSED not signed\n"
        try:
            conn.send(answers)
        except OSError:
            pass
        self.selector.unregister(conn)
        conn.close()

    def advance(self, sock) -> None:
        state = self.outgoing[sock]
        if state[3] == "connecting":
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                self.finish(sock, "dropped")
                return
            sock.setblocking(True)
            sock.sendall(state[1])
            sock.shutdown(socket.SHUT_WR)
            sock.setblocking(False)
            state[3] = "reading"
            self.selector.modify(sock, selectors.EVENT_READ, ("send", sock))
            return
        try:
            chunk = sock.recv(512)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        state[2] += chunk
        if not chunk:
            self.finish(sock, "taken" if state[2].startswith(b"BYOC-TAKEN") else "dropped")

    def finish(self, sock, how: str) -> None:
        i = self.outgoing.pop(sock)[0]
        self.results[i] = how
        self.selector.unregister(sock)
        sock.close()


def run_stand_ins(count: int, every_s: float) -> int:
    from entrypoint.hosts.job_port import AttemptWord, HostDone, HostLive, Word, build_record, build_signed_line
    from entrypoint.jobreport.live.update import Notes, build_update, fit_update
    from entrypoint.jobreport.live.view import decide_points_sent
    from entrypoint.settings import DEFAULTS

    sys.path.insert(0, str(REPO / "benchmarks"))
    from live_scale import host_points, rank_raw

    stand_ins = StandIns(count, every_s)
    print(json.dumps({"up": True}), flush=True)
    commands = open(sys.stdin.fileno(), "r")
    selector_thread_stop = threading.Event()
    pending: list = []
    lock = threading.Lock()

    def read_commands() -> None:
        for line in commands:
            with lock:
                pending.append(json.loads(line))

    threading.Thread(target=read_commands, daemon=True).start()

    def signed(message) -> str:
        return build_signed_line(KEY, build_record(message, time.time()))

    while not selector_thread_stop.is_set():
        stand_ins.step(0.05)
        with lock:
            todo, pending[:] = list(pending), []
        for command in todo:
            what = command["do"]
            if what == "quit":
                return 0
            if what == "report":
                while stand_ins.outgoing:
                    stand_ins.step(0.05)
                print(json.dumps({"results": stand_ins.results, "starts": stand_ins.starts}), flush=True)
                stand_ins.results = {}
                continue
            stand_ins.results = {}
            started = time.monotonic()
            if what == "live":
                def line(i: int) -> str:
                    host = f"algo-{i + 2}"
                    update = build_update(host, host_points(time.time() - 10, i), [rank_raw(8 * i + r, 1)
                                                                                   for r in range(8)], {}, None, Notes())
                    # As a worker of a job of count + 1 hosts sends it (jobreport/live/loop.py).
                    return signed(HostLive(host, fit_update(update, DEFAULTS.live_figures_bytes,
                                                            decide_points_sent(count + 1))))
            elif what == "ended":
                def line(i: int) -> str:
                    return signed(AttemptWord(Word.ENDED, 1, f"algo-{i + 2}", 1))
            else:  # done
                def line(i: int) -> str:
                    return signed(HostDone(f"algo-{i + 2}", 0))
            stand_ins.send_all(line)
            print(json.dumps({"sent_at": started}), flush=True)
    return 0


# --- the leader (this process) ----------------------------------------------------------------

def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(hosts: int, liveness_s: float) -> dict:
    from entrypoint.decide.job_report import ReportSpec
    from entrypoint.hosts.job_port import (AttemptWord, Word, Delivered, HostDone, HostLive, JobPort, PeerLost, PeerWatch,
                                           decide_probe_every_s, send_to_each)
    from entrypoint.jobreport.live.loop import LiveLoop
    from entrypoint.loop import HostLoop
    from entrypoint.settings import DEFAULTS
    sys.path.insert(0, str(REPO / "benchmarks"))
    from live_scale import NoThroughput, Sampler

    workers = hosts - 1
    loop, got = HostLoop(), {"live": set(), "ended": set(), "done": set(), "lost": [], "delivered": {}}
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"control-plane-{os.getpid()}"
    (tmp / "ranks").mkdir(parents=True, exist_ok=True)
    live = LiveLoop(ReportSpec(str(tmp / "ranks"), 1.0, 8, 0, str(tmp / "tb" / "byoc-job"), 10.0, 10.0),
                    "algo-1", Sampler(time.time() - 3600), NoThroughput(), lambda line: None)
    loop.on({HostLive: lambda m: (got["live"].add(m.host), live.take_remote(m.host, m.figures)),
             AttemptWord: lambda m: got["ended"].add(m.host), HostDone: lambda m: got["done"].add(m.host),
             PeerLost: lambda m: got["lost"].append(m.host),
             Delivered: lambda d: got["delivered"].__setitem__(d.host, d.delivered)})
    port = JobPort(LEADER_PORT, loop.post, job_key=KEY, settings=DEFAULTS, hosts=hosts)
    peak = [threading.active_count()]
    sampling = threading.Event()
    sampler_cpu = [0.0]  # the sampler's own CPU so far: the benchmark's, not the leader's

    def sample_threads() -> None:  # the leader's threads, every 2 ms (this one not counted)
        while not sampling.wait(0.002):
            peak[0] = max(peak[0], threading.active_count() - 1)
            sampler_cpu[0] = time.thread_time()

    threading.Thread(target=sample_threads, daemon=True).start()
    every_s = decide_probe_every_s(hosts, DEFAULTS.host_lost_timeout_s)
    child = subprocess.Popen([sys.executable, __file__, "--stand-ins", str(workers), "--every-s", str(every_s)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def tell(what: str) -> dict:
        child.stdin.write(json.dumps({"do": what}) + "\n")
        child.stdin.flush()
        return json.loads(child.stdout.readline())

    def wait(until, seconds: float = 300.0) -> float:
        started = time.monotonic()
        loop.wait(until, time.monotonic() + seconds)
        return time.monotonic() - started

    try:
        assert json.loads(child.stdout.readline())["up"]
        names = [stand_in_address(i) for i in range(workers)]
        started = time.monotonic()
        watch = PeerWatch(names, WORKER_PORT, DEFAULTS.host_lost_timeout_s, DEFAULTS.peer_wait_timeout_s, loop.post,
                          settings=DEFAULTS, job_hosts=hosts)
        wait(lambda: all(seen is not None for seen in watch._last_seen.values()))
        ready_s = time.monotonic() - started
        sent_at = tell("live")["sent_at"]
        wait(lambda: len(got["live"]) == workers)
        connect_s = time.monotonic() - sent_at
        live_results = tell("report")["results"]
        tick_started = time.thread_time()
        live.tick()
        live_cpu = time.thread_time() - tick_started
        shown = len(live.view.hosts_shown)
        # The restart barrier: every `ended 1` taken, then `start 2` to every worker at once.
        sent_at = tell("ended")["sent_at"]
        wait(lambda: len(got["ended"]) == workers)
        send_to_each(names, WORKER_PORT, KEY, lambda host: AttemptWord(Word.START, 2, "algo-1"),
                     DEFAULTS.host_done_send_s, loop)
        wait(lambda: len(got["delivered"]) == workers)
        barrier = tell("report")
        restart_barrier_s = max(barrier["starts"].values(), default=sent_at) - sent_at
        # Liveness alone: the leader's sweeps and the workers' probes, nothing else.
        # The thread sampler's own CPU (~2.5% of a core: 500 wake-ups a second) is taken out.
        before, sampler_before, window = cpu_s(), sampler_cpu[0], time.monotonic()
        wait(lambda: False, liveness_s)
        liveness_cpu = (cpu_s() - before - (sampler_cpu[0] - sampler_before)) / (time.monotonic() - window)
        sent_at = tell("done")["sent_at"]
        wait(lambda: len(got["done"]) == workers)
        settle_s = time.monotonic() - sent_at
        done_results = tell("report")["results"]
        watch.close()
        sampling.set()
    finally:
        try:
            tell("quit")
        except (OSError, ValueError):
            pass
        child.wait(timeout=60)
        port.close()
        live.stop()
    results = [*live_results.values(), *barrier["results"].values(), *done_results.values()]
    dropped = sum(1 for r in results if r != "taken")
    lost = (workers - len(got["live"])) + (workers - len(got["ended"])) + (workers - len(got["done"]))
    return {"hosts": hosts, "connect_s": round(connect_s, 3), "ready_s": round(ready_s, 3),
            "restart_barrier_s": round(restart_barrier_s, 3), "settle_s": round(settle_s, 3),
            "dropped_connections": dropped, "lost_messages": lost, "leader_threads_peak": peak[0],
            "liveness_cpu_pct": round(100 * liveness_cpu, 2), "live_cpu_pct": round(100 * live_cpu / 10.0, 2),
            "live_hosts_shown": shown, "lost_hosts": len(got["lost"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="2,64,256,1024", help="host counts, comma-separated")
    parser.add_argument("--liveness-s", type=float, default=20.0, help="the window liveness alone is measured over")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--stand-ins", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--every-s", type=float, default=1.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stand_ins is not None:
        return run_stand_ins(args.stand_ins, args.every_s)
    if args.one:
        print(json.dumps(measure(args.one, args.liveness_s)))
        return 0
    results = []
    for hosts in (int(h) for h in args.hosts.split(",")):
        done = subprocess.run([sys.executable, __file__, "--one", str(hosts), "--liveness-s", str(args.liveness_s)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stderr[-3000:], file=sys.stderr)
            return done.returncode
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print("| hosts | connect s | ready s | restart barrier s | settle s | dropped | lost | leader threads | "
          "liveness CPU | live CPU | live hosts |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['hosts']} | {r['connect_s']:.2f} | {r['ready_s']:.2f} | {r['restart_barrier_s']:.2f} | "
              f"{r['settle_s']:.2f} | {r['dropped_connections']} | {r['lost_messages']} | {r['leader_threads_peak']} | "
              f"{r['liveness_cpu_pct']:.1f}% | {r['live_cpu_pct']:.1f}% | {r['live_hosts_shown']} |")
    for r in results:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The faults the multi-host test jobs inject (`--fail`), shared by mpi_job.py and torch_job.py:
the same options and the same faults whatever carries the collectives."""
import os
import signal
import sys
import time

FAULTS = ("none", "leader", "worker", "worker-once", "hang-worker", "abort-leader", "abort-worker",
          "leader-then-abort-worker", "abort-worker-then-leader")
# In the two-fault cases, the second comes this long after the first: two hosts failing within a second.
SECOND_FAULT_AFTER_S = 0.4


def add_fault_options(parser) -> None:
    parser.add_argument("--fail", default="none", choices=FAULTS)
    parser.add_argument("--hold", type=float, default=0.0)  # seconds to stay in the job
    parser.add_argument("--save-s", type=float, default=0.0)  # seconds the SIGTERM handler takes
    parser.add_argument("--orphan-check", type=int, default=0)  # 1: leave_an_orphan_and_look_for_it


def leave_an_orphan_and_look_for_it(model: str, rank: int) -> None:
    """Start a process that outlives its parent and exits at once: it is re-parented to the
    nearest subreaper (the host's entrypoint), which must collect it while the job runs.
    Writes orphan-<rank> with the orphan's state 1 s later ("gone" once collected, "Z" if it
    stays defunct)."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        orphan = os.fork()
        if orphan == 0:
            os._exit(0)
        os.write(write, str(orphan).encode())
        os._exit(0)
    os.waitpid(child, 0)
    orphan = int(os.read(read, 32))
    time.sleep(1.0)
    try:
        with open(f"/proc/{orphan}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        state = "gone"
    write_marker(model, f"orphan-{rank}", state)


def write_marker(model: str, name: str, host: str) -> None:
    with open(os.path.join(model, name), "w") as f:
        f.write(host)


def checkpoint_on_sigterm(args, model: str, rank: int, host: str) -> None:
    """SIGTERM takes --save-s (as writing a checkpoint would), leaves sigterm-<rank>, exits 143."""
    def on_sigterm(*_):
        time.sleep(args.save_s)
        write_marker(model, f"sigterm-{rank}", host)
        sys.exit(143)

    signal.signal(signal.SIGTERM, on_sigterm)


def stuck_on_the_worker():
    time.sleep(600)  # as if blocked in I/O: silent, never reaching the barrier


def inject_fault(args, model: str, rank: int, size: int, host: str) -> None:
    """After the first collective: leaves started-<rank>, then the fault --fail asks for, then
    stays --hold seconds."""
    write_marker(model, f"started-{rank}", host)
    if args.orphan_check:
        leave_an_orphan_and_look_for_it(model, rank)
    last = rank == size - 1
    if args.fail == "worker" and last or args.fail == "leader" and rank == 0:
        raise RuntimeError(f"injected failure on {host}")
    if args.fail == "abort-worker" and last or args.fail == "abort-leader" and rank == 0:
        sys.stdout.flush()
        os.abort()  # a C++ abort in a library: no Python exception, no record of its own
    if args.fail == "leader-then-abort-worker":
        if rank == 0:
            raise RuntimeError(f"injected failure on {host}")
        if last:
            time.sleep(SECOND_FAULT_AFTER_S)
            os.abort()
    if args.fail == "abort-worker-then-leader":
        if last:
            os.abort()
        if rank == 0:
            time.sleep(SECOND_FAULT_AFTER_S)
            raise RuntimeError(f"injected failure on {host}")
    if args.fail == "hang-worker" and last:
        stuck_on_the_worker()
    once_marker = os.path.join(model, "failed-once")
    if args.fail == "worker-once" and last and not os.path.exists(once_marker):
        open(once_marker, "w").close()  # the restarted job runs through
        raise RuntimeError(f"injected failure on {host}")
    deadline = time.time() + args.hold
    while time.time() < deadline:
        time.sleep(0.05)

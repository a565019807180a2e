"""The walk an MPI leader's launch takes through entrypoint's modules: how often it goes back
into a module it had already left (the architecture issue's measure of a launch that
"bounces between rooms"). A real 2-host mpirun job on emulated hosts (localcluster, root);
the leader's entrypoint runs under a profiler from the moment run_plan is called until the
entrypoint ends (its outcome written, its workers told, its sshd stopped).

    .venv/bin/python benchmarks/launch_walk.py [--repo PATH]

--repo: the checkout whose entrypoint runs on the hosts (default: this one), e.g. a worktree
of an older commit, to compare. Only the leader's main thread is followed (threads that
probe peers run beside it).

The walk: the module of each call made within --depth calls of the launch's own line (cli.py
and orchestrate.py, where run_plan is), in order, a run of calls into one module counted once.
The plan's record (its properties) and log.py are data and a leaf, not rooms, and what a
leaf calls is its own (log.py's text rule lives in rank/record_errors.py). A return is a
move into a module the walk had left before. Printed, for depths 1 to 3: the walk, the
returns, the calls per module.
"""


from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
LINE = ("cli.py", "orchestrate.py", "run/execute.py")  # the last: run_plan's module in a tree before issue 44
NOT_ROOMS = ("log.py", "plan.py", "decide/plan.py", "decide/launch_plan.py")  # the last: the record, from issue 51 on


def run_traced(repo: str, out: str) -> int:
    """On the leader: cli.main under a profiler; the rooms it walks go to `out`."""
    sys.path.insert(0, repo)
    package = os.path.join(repo, "entrypoint") + os.sep
    rooms: dict[int, list[str]] = {1: [], 2: [], 3: []}
    recording = False

    def room_of(frame) -> str | None:
        name = frame.f_code.co_filename if frame is not None else ""
        return name[len(package):] if name.startswith(package) else None

    def profile(frame, event, _arg) -> None:
        nonlocal recording
        if event != "call":
            return
        if frame.f_code.co_name == "run_plan" and room_of(frame):
            recording = True
        room = room_of(frame)
        if not recording or not room or room in LINE or room in NOT_ROOMS:
            return
        caller, depth = frame.f_back, 1
        while caller is not None and room_of(caller) not in LINE and depth <= 3:
            if room_of(caller) in NOT_ROOMS:
                return  # called by a leaf (log.py's text rule): the leaf's own business, not a room
            caller, depth = caller.f_back, depth + 1
        for limit, walk in rooms.items():
            if caller is not None and depth <= limit and (not walk or walk[-1] != room):
                walk.append(room)

    from entrypoint.cli import main

    sys.setprofile(profile)
    try:
        code = main(["train"])
    finally:
        sys.setprofile(None)
        with open(out, "w") as f:
            json.dump(rooms, f)
    return code


def count_returns(walk: list[str]) -> int:
    left: set[str] = set()
    returns = 0
    for previous, room in zip(walk, walk[1:]):
        left.add(previous)
        returns += room in left
    return returns


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", default=str(HERE.parent))
    parser.add_argument("--traced", metavar="OUT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    repo = os.path.abspath(args.repo)
    if args.traced:
        return run_traced(repo, args.traced)
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(HERE.parent))
    import multihost_overhead as bench
    from localcluster import EmulatedCluster

    with tempfile.TemporaryDirectory(prefix="launch-walk-") as tmp:
        code_dir, seed, out = Path(tmp) / "code", Path(tmp) / "ssh-seed", Path(tmp) / "rooms.json"
        bench.write_code(code_dir)
        bench.write_ssh_seed(seed)
        hosts = bench.build_host_names(2)
        with EmulatedCluster(hosts, bench.build_job("mpi", str(code_dir)), echo=bench.TimedLines(),
                             ssh_seed=str(seed)) as cluster:
            env = (("PYTHONPATH", repo),)
            leader = bench.Side("mpi", "ours", (sys.executable, __file__, "--repo", repo, "--traced", str(out)), env, 180)
            worker = bench.Side("mpi", "ours", (sys.executable, "-m", "entrypoint", "train"), env, 180)
            from localcluster.multirun import ClusterRun

            procs = {host: cluster.start_on(host, list((leader if host == hosts[0] else worker).argv), env=dict(env),
                                            stop_host_on_exit=True) for host in hosts}
            result = ClusterRun(procs).wait(timeout=180, fail_fast=True, grace=10)
            if not result.ok:
                print("\n".join(f"--- {h}\n{r.output[-3000:]}" for h, r in result.results.items()), file=sys.stderr)
                return 1
        rooms = {int(k): v for k, v in json.loads(out.read_text()).items()}
    print(f"repo: {repo}")
    for depth, walk in rooms.items():
        entries = {r: walk.count(r) for r in dict.fromkeys(walk)}
        print(f"depth {depth}: {count_returns(walk)} returns to a module already left, in {len(walk)} moves")
        print("  walk: " + " > ".join(walk))
        print("  entries: " + ", ".join(f"{r} {n}" for r, n in sorted(entries.items(), key=lambda x: -x[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())

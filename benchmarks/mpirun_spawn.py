"""How Open MPI's launch scales with the host count: the leader starting every orted over
SSH itself (`plm_rsh_no_tree_spawn 1`, what our mpirun command does) vs Open MPI's tree
spawn (each started orted starts the next ones), on emulated hosts (localcluster: Linux
namespaces, needs root).

    .venv/bin/python benchmarks/mpirun_spawn.py [--hosts 2,4,8,16] [--runs 5]

Every host gets one key pair trusted by all (the tree spawn needs workers to log in to
each other; our images never allow that), X25519 key exchange as our client configuration
prefers, and a plain `sshd -D`; then, on algo-1,
`mpirun --host algo-1:1,...,algo-N:1 -np N ... /bin/true`, alternating the two modes.
Reported per mode: mpirun's wall time (median), and the CPU time that mpirun and its
children (the ssh clients) used on the leader. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from multihost_overhead import build_host_names, build_job, parse_host_counts, write_code, write_ssh_seed  # noqa: E402

# mpirun, timed on the leader by the leader's own clock, with its children's CPU time.
TIMED = (
    "import resource, subprocess, sys, time\n"
    "t = time.monotonic()\n"
    "rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode\n"
    "wall = time.monotonic() - t\n"
    "r = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
    "print('SPAWN rc=%d wall=%.3f cpu=%.3f' % (rc, wall, r.ru_utime + r.ru_stime))\n"
)
MODES = {"leader starts every orted": "1", "tree spawn": "0"}


def build_mpirun_argv(hosts: list[str], interface: str, no_tree_spawn: str) -> list[str]:
    return [
        "mpirun", "--allow-run-as-root",
        "--host", ",".join(f"{h}:1" for h in hosts), "-np", str(len(hosts)),
        "-mca", "plm_rsh_no_tree_spawn", no_tree_spawn,
        "-mca", "btl_tcp_if_include", interface, "-mca", "oob_tcp_if_include", interface,
        "-mca", "btl", "^openib,ofi", "-mca", "pml", "ob1",
        "/bin/true",
    ]  # fmt: skip


def run_mode(cluster, hosts: list[str], interface: str, mode: str) -> tuple[float, float]:
    argv = [sys.executable, "-c", TIMED, *build_mpirun_argv(hosts, interface, MODES[mode])]
    done = cluster.run_on(hosts[0], argv, timeout=300)
    line = next((ln for ln in done.output.splitlines() if "SPAWN rc=" in ln), "")
    fields = dict(part.split("=") for part in line.split("SPAWN ", 1)[-1].split()) if line else {}
    if fields.get("rc") != "0":
        raise RuntimeError(f"{mode} on {len(hosts)} hosts failed:\n{done.output[-3000:]}")
    return float(fields["wall"]), float(fields["cpu"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=parse_host_counts, default=(2, 4, 8, 16), help="host counts (default 2,4,8,16)")
    parser.add_argument("--runs", type=int, default=5, help="runs per mode and host count (default 5)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("mpirun_spawn: needs root (emulated hosts are Linux namespaces)", file=sys.stderr)
        return 2
    from localcluster import EmulatedCluster
    from localcluster.optml import INTERFACE_NAME

    print(f"command: {' '.join(sys.argv)}")
    print(f"machine: {os.cpu_count()} CPUs, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    summary = []
    with tempfile.TemporaryDirectory(prefix="bench-spawn-") as tmp:
        code_dir = Path(tmp) / "code"
        write_code(code_dir)
        seed = Path(tmp) / "ssh-seed"
        # The key exchange our client configuration prefers (entrypoint/hosts/ssh.py).
        write_ssh_seed(seed, kex_algorithms="curve25519-sha256")
        for count in args.hosts:
            hosts = build_host_names(count)
            with EmulatedCluster(hosts, build_job("mpi", str(code_dir)), ssh_seed=str(seed)) as cluster:
                for host in hosts:
                    cluster.start_on(host, ["/usr/sbin/sshd", "-D", "-o", "LogLevel=ERROR"])
                time.sleep(1.0)
                for mode in MODES:  # warm-up, not counted
                    run_mode(cluster, hosts, INTERFACE_NAME, mode)
                results: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
                for _ in range(args.runs):
                    for mode in MODES:
                        results[mode].append(run_mode(cluster, hosts, INTERFACE_NAME, mode))
                for mode, runs in results.items():
                    walls, cpus = [w for w, _ in runs], [c for _, c in runs]
                    line = (f"{count:>3} hosts  {mode:<26} mpirun wall {statistics.median(walls):5.2f} s "
                            f"(min {min(walls):.2f}, max {max(walls):.2f})  leader CPU {statistics.median(cpus):5.2f} s")
                    summary.append(line)
                    print(line, flush=True)
    print("== summary (medians of %d runs)" % args.runs)
    print("\n".join(summary))
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

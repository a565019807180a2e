"""Start a whole parameter-server job on this machine, with exactly the processes and
environment the entrypoint gives each host (entrypoint.decide.launchers.parameter_server.build_parameter_server_processes
writes the contract; train/ps.py reads it): H shard processes (`python -m train.ps_server`, "one per host") and
H x P worker processes running the given command.

    python -m jobs.ps_local --hosts 2 --workers-per-host 1 -- python -m train.ps_train --epochs 5

Used by the tests; useful to try a PS job without a cluster.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Mapping, Sequence

from entrypoint.decide.launchers.parameter_server import build_parameter_server_processes
from entrypoint.decide.specs import ProcessSpec
from entrypoint.decide.topology import Topology


def build_ps_processes(num_hosts: int, workers_per_host: int, worker_argv: Sequence[str],
                       master_addr: str, master_port: int, python: str = sys.executable) -> tuple[ProcessSpec, ...]:
    """Every host's processes as the entrypoint's parameter-server launch decides them
    (entrypoint.decide.launchers.parameter_server.build_parameter_server_processes: the contract is written there only),
    with the rendezvous the plan's environment adds; the shards first, then the workers."""
    if num_hosts < 1 or workers_per_host < 1:
        raise ValueError("need at least one host and one worker per host")
    if not worker_argv:
        raise ValueError("no worker command")
    hosts = tuple(f"host{i}" for i in range(num_hosts))
    rendezvous = {"MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port)}
    servers, workers = [], []
    for host in hosts:
        topo = Topology(hosts=hosts, current_host=host, distribution_hosts=hosts, distribution_groups=(),
                        current_group_hosts=(), leader=hosts[0], interface="lo", processes_per_host=workers_per_host)
        server, *host_workers = build_parameter_server_processes(python, topo, tuple(worker_argv))
        for spec, into in ((server, servers), *((w, workers) for w in host_workers)):
            into.append(ProcessSpec(spec.name, spec.argv, tuple(sorted({**dict(spec.env), **rendezvous}.items()))))
    return (*servers, *workers)


def probe_free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_processes(specs: Sequence[ProcessSpec], base_env: Mapping[str, str], **popen_kwargs) -> list[subprocess.Popen]:
    return [subprocess.Popen(list(spec.argv), env={**base_env, **dict(spec.env)}, **popen_kwargs) for spec in specs]


@dataclass(frozen=True)
class Outcome:
    codes: tuple[int, ...]  # every process's exit code, in order
    first_failure: int | None  # index of the process that failed on its own, if one did

    @property
    def exit_code(self) -> int:
        """The first failure's code (those stopped after it only show SIGTERM), as a shell
        reports it (128 + signal)."""
        if self.first_failure is None:
            return 0
        code = self.codes[self.first_failure]
        return 128 - code if code < 0 else code


def wait_processes(processes: Sequence[subprocess.Popen], timeout_s: float | None = None,
                   grace_s: float = 10.0) -> Outcome:
    """Wait for all. The first process to fail (or the timeout) ends the others: the RPC
    group would otherwise wait for the missing member until its own timeout."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        codes = [p.poll() for p in processes]  # every one, each time (no short-circuit)
        failed = next((i for i, code in enumerate(codes) if code not in (None, 0)), None)
        if None not in codes or failed is not None:
            break
        if deadline is not None and time.monotonic() > deadline:
            stop_processes(processes, grace_s)
            raise subprocess.TimeoutExpired([p.args for p in processes], timeout_s)
        time.sleep(0.05)
    stop_processes(processes, grace_s)
    return Outcome(tuple(p.returncode for p in processes), failed)


def stop_processes(processes: Sequence[subprocess.Popen], grace_s: float) -> None:
    for p in processes:
        if p.poll() is None:
            p.terminate()
    end = time.monotonic() + grace_s
    for p in processes:
        try:
            p.wait(timeout=max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("usage: python -m jobs.ps_local [--hosts H] [--workers-per-host P] -- <worker command>", file=sys.stderr)
        return 2
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m jobs.ps_local")
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--workers-per-host", type=int, default=1)
    args = parser.parse_args(argv[:split])
    specs = build_ps_processes(args.hosts, args.workers_per_host, argv[split + 1:], "127.0.0.1", probe_free_port())
    outcome = wait_processes(start_processes(specs, os.environ))
    if outcome.first_failure is not None:
        print(f"jobs.ps_local: {specs[outcome.first_failure].name} failed with exit code"
              f" {outcome.codes[outcome.first_failure]}; stopped the others", file=sys.stderr)
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(main())

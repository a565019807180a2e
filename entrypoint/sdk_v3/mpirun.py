"""`mpirun` as SageMaker Python SDK v3's MPI driver calls it, with its two bugs corrected.

v3 (3.27.0, mpi_utils.get_mpirun_command) runs, on the leader:

    mpirun --host algo-1:P,algo-2:P -np P … -mca btl_tcp_if_include ethwe
           -mca oob_tcp_if_include ethwe … -x NCCL_SOCKET_IFNAME=ethwe … python -m mpi4py entry.py

(`--host algo-1,algo-2 -np 1` when P is 1). Two bugs:
- `-np P` is the processes of ONE host: Open MPI fills algo-1's slots and starts nothing on
  the other hosts, so a "2-host" job is a 1-host job. The right count is the sum of the slots.
- the interface is resourceconfig.json's `network_interface_name`, which v3's local mode
  writes as "ethwe", an interface no local container has: Open MPI's out-of-band TCP finds
  no network and mpirun fails before starting a rank.

/etc/byoc/bash-env.sh puts /usr/local/byoc/sdk-v3/bin (this module as `mpirun`) first on PATH
only in a v3 MPI job. It rewrites exactly those two things and execs the image's real mpirun:
- `-np` when argv starts `--host <h1[:s]>,<h2[:s]>,… -np <n>` (v3's shape), there are at least
  two hosts with the same slot count s, and n == s: n becomes the sum of the slots;
- the value of `-mca btl_tcp_if_include` / `-mca oob_tcp_if_include` / `-x NCCL_SOCKET_IFNAME=`
  when it is one interface name that does not exist here: the interface our launcher would use
  instead (entrypoint.decide.topology.choose_interface: eth0, else the first non-loopback one).
Anything else passes through untouched; each change is one line on stderr. `-x BYOC_WHOLE_LINES=1`
goes first: every host's Python ranks write whole lines (record_errors.start_whole_lines). v3's
`-x NCCL_PROTO=simple` (EFA instances) gives way to the job's own choice (sdk_v3/nccl_proto.py).
"""

from __future__ import annotations

import os
import sys
from typing import Sequence

from entrypoint.decide.topology import choose_interface
from entrypoint.job.probe import probe_interfaces
from entrypoint.sdk_v3.nccl_proto import build_mpirun_argv

SHIM_DIR = "/usr/local/byoc/sdk-v3/bin"
INTERFACE_PARAMS = ("btl_tcp_if_include", "oob_tcp_if_include")
NCCL_IFNAME = "NCCL_SOCKET_IFNAME="
LOG_PREFIX = "byoc sdk-v3 mpirun:"


# --- deciding (pure) ------------------------------------------------------------------------


def parse_host_slots(hosts: str) -> list[int] | None:
    """`algo-1:2,algo-2:2` -> [2, 2]; `algo-1,algo-2` -> [1, 1]; None when it is not that shape."""
    slots = []
    for entry in hosts.split(","):
        name, _, count = entry.partition(":")
        if not name or (count and not count.isdigit()):
            return None
        slots.append(int(count) if count else 1)
    return slots


def fix_interface(value: str, present: tuple[str, ...]) -> str | None:
    """The replacement for one missing interface name; None to leave the value alone (a list,
    an exclusion, a CIDR, or an interface that exists)."""
    if not value or any(c in value for c in ",/^") or value in present or not present:
        return None
    chosen, _why = choose_interface(value, present)
    return chosen if chosen != value else None


def decide_mpirun_argv(argv: Sequence[str], interfaces: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """v3's mpirun arguments with the process count and a missing interface corrected, and one
    note per change."""
    out = list(argv)
    notes: list[str] = []
    if len(out) >= 4 and out[0] in ("--host", "-host", "-H") and out[2] in ("-np", "-n", "--np"):
        slots = parse_host_slots(out[1])
        if slots and len(slots) > 1 and len(set(slots)) == 1 and out[3] == str(slots[0]):
            out[3] = str(sum(slots))
            notes.append(
                f"-np {argv[3]} -> {out[3]}: SDK v3 passes the processes of one host; "
                f"--host {out[1]} has {out[3]} slots"
            )
    for i in range(len(out) - 1):
        if out[i] in ("-mca", "--mca") and i + 2 < len(out) and out[i + 1] in INTERFACE_PARAMS:
            fixed = fix_interface(out[i + 2], interfaces)
            if fixed:
                notes.append(f"{out[i + 1]} {out[i + 2]} -> {fixed}: there is no interface {out[i + 2]} here")
                out[i + 2] = fixed
        elif out[i] == "-x" and out[i + 1].startswith(NCCL_IFNAME):
            value = out[i + 1][len(NCCL_IFNAME):]
            fixed = fix_interface(value, interfaces)
            if fixed:
                notes.append(f"NCCL_SOCKET_IFNAME {value} -> {fixed}: there is no interface {value} here")
                out[i + 1] = NCCL_IFNAME + fixed
    return out, notes


def build_whole_lines_argv(argv: Sequence[str]) -> list[str]:
    """Every host's ranks write whole lines (record_errors.start_whole_lines, through the
    image's .pth): mpirun passes the setting to the other hosts' ranks only when told to."""
    return ["-x", "BYOC_WHOLE_LINES=1", *argv]


def probe_real_program(name: str, path: str, shim_dir: str, is_executable) -> str | None:
    """The first `name` on PATH that is not in the shims' folder."""
    shim = os.path.realpath(shim_dir)
    for folder in path.split(os.pathsep):
        if not folder or os.path.realpath(folder) == shim:
            continue
        candidate = os.path.join(folder, name)
        if is_executable(candidate):
            return candidate
    return None


# --- acting -----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    real = probe_real_program(
        "mpirun", os.environ.get("PATH", ""), SHIM_DIR, lambda p: os.path.isfile(p) and os.access(p, os.X_OK)
    )
    if real is None:
        print(f"{LOG_PREFIX} no mpirun on PATH besides this shim ({SHIM_DIR})", file=sys.stderr)
        return 127
    fixed, notes = decide_mpirun_argv(args, probe_interfaces())
    fixed, proto_note = build_mpirun_argv(fixed, os.environ)
    for note in notes + ([proto_note] if proto_note else []):
        print(f"{LOG_PREFIX} {note}", file=sys.stderr, flush=True)
    os.execv(real, [real, *build_whole_lines_argv(fixed)])
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())

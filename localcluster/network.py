"""The thin layer that builds and removes a cluster's network with `ip`.

One bridge with no address, one veth pair per host (the inner end is eth0 in the host's
network namespace), one private address per host, `lo` up, no default route: nothing routes
out of the cluster. Names come from plan.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

from localcluster.errors import ClusterError
from localcluster.plan import ClusterPlan, build_hosts_file

NETNS_ETC = "/etc/netns"
NETNS_RUN = "/run/netns"


def run_ip_batch(lines: list[str], netns: str | None = None, force: bool = False) -> subprocess.CompletedProcess:
    """Run many `ip` commands in one process (about 5 ms for a whole cluster)."""
    argv = ["ip"]
    if netns is not None:
        argv += ["-n", netns]
    if force:
        argv.append("-force")
    argv += ["-batch", "-"]
    done = subprocess.run(argv, input="\n".join(lines) + "\n", capture_output=True, text=True)
    if done.returncode != 0 and not force:
        where = f" in network namespace {netns}" if netns else ""
        raise ClusterError(f"`ip -batch` failed{where}: {done.stderr.strip()}\ncommands:\n" + "\n".join(lines))
    return done


def build_up_commands(plan: ClusterPlan) -> tuple[list[str], dict[str, list[str]]]:
    """(commands in the root namespace, commands per host namespace) that bring the network up."""
    root = [
        f"link add name {plan.bridge} type bridge",
        # No IPv6 link-local address either: the bridge carries the hosts' traffic only.
        f"link set dev {plan.bridge} addrgenmode none",
        f"link set dev {plan.bridge} up",
    ]
    inner: dict[str, list[str]] = {}
    for h in plan.hosts:
        root += [
            f"netns add {h.netns}",
            f"link add name {h.veth} type veth peer name eth0 netns {h.netns}",
            f"link set dev {h.veth} addrgenmode none",
            f"link set dev {h.veth} master {plan.bridge}",
            f"link set dev {h.veth} up",
        ]
        inner[h.netns] = [
            f"addr add {h.address}/{plan.prefix_len} dev eth0",
            "link set dev eth0 up",
            "link set dev lo up",
        ]
    return root, inner


def build_down_commands(bridge: str | None, netns: list[str], veths: list[str]) -> list[str]:
    # veths go before their namespaces: a namespace kept alive by a straggler would keep
    # the pair (and its name) alive too, and a quick re-create would hit "File exists".
    lines = [f"link del dev {v}" for v in veths] + [f"netns del {n}" for n in netns]
    if bridge:
        lines.append(f"link del dev {bridge}")
    return lines


def write_netns_files(plan: ClusterPlan) -> None:
    """`ip netns exec` bind-mounts /etc/netns/<ns>/* over /etc/*: the hosts file every host sees,
    and an empty resolv.conf so that unknown names fail at once instead of asking a DNS server."""
    hosts_text = build_hosts_file(plan)
    for h in plan.hosts:
        folder = os.path.join(NETNS_ETC, h.netns)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "hosts"), "w") as f:
            f.write(hosts_text)
        with open(os.path.join(folder, "resolv.conf"), "w") as f:
            f.write("")


def start_network(plan: ClusterPlan) -> None:
    write_netns_files(plan)
    root, inner = build_up_commands(plan)
    run_ip_batch(root)
    for netns, lines in inner.items():
        run_ip_batch(lines, netns=netns)


def stop_network(bridge: str, netns: list[str], veths: list[str]) -> None:
    """Remove whatever of these exists; missing pieces are fine (a half-built cluster)."""
    present_links = probe_link_names()
    present_netns = probe_netns_names()
    lines = build_down_commands(
        bridge if bridge in present_links else None,
        [n for n in netns if n in present_netns],
        [v for v in veths if v in present_links],
    )
    if lines:
        run_ip_batch(lines, force=True)
    for n in netns:
        shutil.rmtree(os.path.join(NETNS_ETC, n), ignore_errors=True)
    try:
        os.rmdir(NETNS_ETC)  # only when no other cluster (or user) has entries there
    except OSError:
        pass
    left = [x for x in [bridge, *veths] if x in probe_link_names()] + [n for n in netns if n in probe_netns_names()]
    if left:
        raise ClusterError(f"could not remove {', '.join(left)}")


def set_link(veth: str, up: bool) -> None:
    """Cut (or restore) one host's cable: its bridge-side veth end goes down."""
    run_ip_batch([f"link set dev {veth} {'up' if up else 'down'}"])


def probe_link_names() -> set[str]:
    done = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True, check=True)
    return {link["ifname"] for link in json.loads(done.stdout or "[]")}


def probe_netns_link(name: str) -> str | None:
    """The network namespace `ip netns` calls name, as /proc/<pid>/ns/net names it; None when gone."""
    try:
        return f"net:[{os.stat(os.path.join(NETNS_RUN, name)).st_ino}]"
    except OSError:
        return None


def probe_netns_names() -> set[str]:
    try:
        return set(os.listdir(NETNS_RUN))
    except FileNotFoundError:
        return set()


def probe_networks_in_use() -> list[str]:
    """Networks configured on this machine's own interfaces (so a cluster avoids them)."""
    done = subprocess.run(["ip", "-j", "addr", "show"], capture_output=True, text=True, check=True)
    nets = []
    for link in json.loads(done.stdout or "[]"):
        for a in link.get("addr_info", []):
            if a.get("family") == "inet":
                nets.append(f"{a['local']}/{a['prefixlen']}")
    return nets

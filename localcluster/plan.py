"""The cluster plan: host names, network names and addresses (pure).

Nothing here touches the machine; `network.py` and `cluster.py` carry the plan out.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

# A host name is one DNS label: SageMaker's are `algo-N` (SDK v3, real jobs) or
# `algo-N-xxxxx` (SDK v2 local mode); anything else a user picks must still be a name
# that /etc/hosts, sethostname() and MPI accept.
_HOST_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_CLUSTER_ID = re.compile(r"^[0-9a-f]{6}$")

# Network interface names are limited to 15 bytes (IFNAMSIZ - 1).
_IFNAME_MAX = 15
MAX_HOSTS = 250

DEFAULT_BASE_SUBNET = "10.213.0.0/16"
SUBNET_PREFIX = 24


@dataclass(frozen=True)
class HostPlan:
    name: str  # the host's name: hostname, /etc/hosts entry, resourceconfig entry
    index: int  # creation order, 0-based
    address: str  # eth0's address inside the host's network namespace
    netns: str  # `ip netns` name
    veth: str  # the bridge-side end of the host's veth pair (the inside end is eth0)


@dataclass(frozen=True)
class ClusterPlan:
    cluster_id: str
    subnet: str  # e.g. 10.213.4.0/24
    bridge: str
    hosts: tuple[HostPlan, ...]

    @property
    def prefix_len(self) -> int:
        return ipaddress.ip_network(self.subnet).prefixlen

    @property
    def names(self) -> tuple[str, ...]:
        """Host names in creation order (algo-1, algo-2, ..., algo-10)."""
        return tuple(h.name for h in self.hosts)

    @property
    def sagemaker_hosts(self) -> tuple[str, ...]:
        """Host names as SageMaker lists them: sorted as strings (algo-10 before algo-2)."""
        return build_sagemaker_host_order(self.names)

    def host(self, name: str) -> HostPlan:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(f"no host named {name!r} in this cluster (hosts: {', '.join(self.names)})")


def build_default_host_names(count: int) -> tuple[str, ...]:
    if count < 1:
        raise ValueError(f"need at least one host, got {count}")
    if count > MAX_HOSTS:
        raise ValueError(f"at most {MAX_HOSTS} hosts per cluster, got {count}")
    return tuple(f"algo-{i}" for i in range(1, count + 1))


def parse_host_names(text: str) -> tuple[str, ...]:
    """`algo-1,algo-2` -> ("algo-1", "algo-2"), validated."""
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    validate_host_names(names)
    return names


def validate_host_names(names: tuple[str, ...] | list[str]) -> None:
    if not names:
        raise ValueError("need at least one host name")
    if len(names) > MAX_HOSTS:
        raise ValueError(f"at most {MAX_HOSTS} hosts per cluster, got {len(names)}")
    for name in names:
        if not isinstance(name, str) or not _HOST_NAME.match(name):
            raise ValueError(
                f"invalid host name {name!r}: use lower-case letters, digits and '-', "
                "1-63 characters, not starting or ending with '-'"
            )
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"host name {name!r} appears twice")
        seen.add(name)


def build_sagemaker_host_order(names: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """SageMaker's `hosts` list: plain string sort, so algo-10 sorts before algo-2."""
    return tuple(sorted(names))


def build_cluster_names(cluster_id: str, host_names: tuple[str, ...]) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """(bridge, netns names, veth names) for one cluster; every name carries the cluster id
    so that two clusters on one machine never collide."""
    if not _CLUSTER_ID.match(cluster_id):
        raise ValueError(f"cluster id must be 6 lower-case hex digits, got {cluster_id!r}")
    bridge = f"lc{cluster_id}-br"
    netns = tuple(f"lc-{cluster_id}-{name}" for name in host_names)
    # The veth name uses the host's position, not its name: names can be 63 characters long.
    veths = tuple(f"lc{cluster_id}-{i + 1}" for i in range(len(host_names)))
    for ifname in (bridge, *veths):
        assert len(ifname) <= _IFNAME_MAX, ifname
    return bridge, netns, veths


def build_cluster_plan(cluster_id: str, host_names: tuple[str, ...] | list[str], subnet: str) -> ClusterPlan:
    host_names = tuple(host_names)
    validate_host_names(host_names)
    network = ipaddress.ip_network(subnet)
    usable = network.num_addresses - 2  # network and broadcast addresses
    if len(host_names) > usable:
        raise ValueError(f"{len(host_names)} hosts do not fit in {subnet} ({usable} addresses)")
    bridge, netns, veths = build_cluster_names(cluster_id, host_names)
    hosts = tuple(
        HostPlan(
            name=name,
            index=i,
            # .1 for the first host created: nothing else on the bridge has an address.
            address=str(network.network_address + i + 1),
            netns=netns[i],
            veth=veths[i],
        )
        for i, name in enumerate(host_names)
    )
    return ClusterPlan(cluster_id=cluster_id, subnet=str(network), bridge=bridge, hosts=hosts)


def build_hosts_file(plan: ClusterPlan) -> str:
    """/etc/hosts for every host: every host name maps to its namespace address. A host's own
    name must not map to loopback, or gloo/NCCL/Open MPI advertise 127.0.0.1 to their peers."""
    lines = [
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
    ]
    lines += [f"{h.address}\t{h.name}" for h in plan.hosts]
    return "\n".join(lines) + "\n"


def decide_subnet(
    base: str,
    taken: set[str] | frozenset[str],
    in_use: list[str] | tuple[str, ...],
    prefix_len: int = SUBNET_PREFIX,
) -> str:
    """The first /prefix_len inside `base` that no other cluster has claimed (`taken`) and
    that overlaps no network configured on the machine (`in_use`)."""
    base_net = ipaddress.ip_network(base)
    taken_nets = [ipaddress.ip_network(t) for t in taken]
    used_nets = [ipaddress.ip_network(u, strict=False) for u in in_use]
    for candidate in base_net.subnets(new_prefix=prefix_len):
        if any(candidate.overlaps(t) for t in taken_nets):
            continue
        if any(candidate.version == u.version and candidate.overlaps(u) for u in used_nets):
            continue
        return str(candidate)
    raise ValueError(
        f"no free /{prefix_len} left in {base} ({len(taken_nets)} claimed by other clusters); "
        "run `python -m localcluster cleanup` to drop clusters whose owner died"
    )

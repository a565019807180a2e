"""The cluster plan by value: names, addresses, hosts file, subnets (pure, no machine)."""

import pytest

from localcluster.network import build_down_commands, build_up_commands
from localcluster.plan import (
    build_cluster_names,
    build_cluster_plan,
    build_default_host_names,
    build_hosts_file,
    build_sagemaker_host_order,
    decide_subnet,
    parse_host_names,
)

pytestmark = pytest.mark.quick  # the quick tier: scripts/run-tests.sh --quick


def test_two_hosts_names_and_addresses():
    plan = build_cluster_plan("0a1b2c", ["algo-1", "algo-2"], "10.213.7.0/24")
    assert plan.bridge == "lc0a1b2c-br"
    assert [(h.name, h.address, h.netns, h.veth) for h in plan.hosts] == [
        ("algo-1", "10.213.7.1", "lc-0a1b2c-algo-1", "lc0a1b2c-1"),
        ("algo-2", "10.213.7.2", "lc-0a1b2c-algo-2", "lc0a1b2c-2"),
    ]
    assert plan.prefix_len == 24
    assert plan.host("algo-2").address == "10.213.7.2"


def test_hosts_file_maps_every_name_to_its_namespace_address():
    plan = build_cluster_plan("0a1b2c", ["algo-1", "algo-2"], "10.213.7.0/24")
    assert build_hosts_file(plan) == (
        "127.0.0.1\tlocalhost\n"
        "::1\tlocalhost ip6-localhost ip6-loopback\n"
        "10.213.7.1\talgo-1\n"
        "10.213.7.2\talgo-2\n"
    )


def test_eleven_hosts_sort_as_sagemaker_lists_them():
    names = build_default_host_names(11)
    assert names[-1] == "algo-11"
    plan = build_cluster_plan("abcdef", names, "10.213.0.0/24")
    assert plan.names == names  # creation order: addresses follow the numbers
    assert plan.host("algo-10").address == "10.213.0.10"
    assert plan.sagemaker_hosts == (
        "algo-1", "algo-10", "algo-11", "algo-2", "algo-3", "algo-4",
        "algo-5", "algo-6", "algo-7", "algo-8", "algo-9",
    )  # fmt: skip


def test_sdk_v2_style_names_are_accepted():
    assert build_sagemaker_host_order(("algo-2-x1y2z", "algo-1-x1y2z")) == ("algo-1-x1y2z", "algo-2-x1y2z")
    assert parse_host_names("algo-1-ab12c, algo-2-ab12c") == ("algo-1-ab12c", "algo-2-ab12c")


@pytest.mark.parametrize(
    "names, message",
    [
        ("", "at least one host"),
        ("algo-1,algo-1", "appears twice"),
        ("Algo-1", "invalid host name"),
        ("algo_1", "invalid host name"),
        ("-algo", "invalid host name"),
        ("a" * 64, "invalid host name"),
    ],
)
def test_bad_host_names(names, message):
    with pytest.raises(ValueError, match=message):
        parse_host_names(names)


def test_interface_names_fit_the_kernel_limit_for_the_largest_cluster():
    names = build_default_host_names(250)
    bridge, netns, veths = build_cluster_names("ffffff", names)
    assert max(len(n) for n in (bridge, *veths)) <= 15
    assert veths[-1] == "lcffffff-250"
    with pytest.raises(ValueError, match="at most 250"):
        build_default_host_names(251)


def test_two_clusters_never_share_a_name():
    a = build_cluster_plan("aaaaaa", ["algo-1", "algo-2"], "10.213.0.0/24")
    b = build_cluster_plan("bbbbbb", ["algo-1", "algo-2"], "10.213.1.0/24")
    names_a = {a.bridge, *(h.netns for h in a.hosts), *(h.veth for h in a.hosts)}
    names_b = {b.bridge, *(h.netns for h in b.hosts), *(h.veth for h in b.hosts)}
    assert not names_a & names_b


def test_bad_cluster_id():
    with pytest.raises(ValueError, match="6 lower-case hex"):
        build_cluster_names("xyz", ("algo-1",))


def test_decide_subnet_skips_claimed_and_machine_networks():
    assert decide_subnet("10.213.0.0/16", set(), []) == "10.213.0.0/24"
    assert decide_subnet("10.213.0.0/16", {"10.213.0.0/24", "10.213.1.0/24"}, []) == "10.213.2.0/24"
    # The machine itself uses 10.213.2.5/23 (covers .2 and .3): skip both.
    assert decide_subnet("10.213.0.0/16", {"10.213.0.0/24"}, ["10.213.2.5/23", "172.16.0.1/12"]) == "10.213.1.0/24"
    assert decide_subnet("10.213.0.0/16", {"10.213.0.0/24", "10.213.1.0/24"}, ["10.213.2.5/23"]) == "10.213.4.0/24"


def test_decide_subnet_when_everything_is_taken():
    with pytest.raises(ValueError, match="no free /24.*localcluster cleanup"):
        decide_subnet("10.213.0.0/23", {"10.213.0.0/24", "10.213.1.0/24"}, [])


def test_too_many_hosts_for_the_subnet():
    with pytest.raises(ValueError, match="do not fit"):
        build_cluster_plan("abcdef", build_default_host_names(7), "10.213.0.0/29")


def test_ip_commands_golden():
    plan = build_cluster_plan("0a1b2c", ["algo-1", "algo-2"], "10.213.7.0/24")
    root, inner = build_up_commands(plan)
    assert root == [
        "link add name lc0a1b2c-br type bridge",
        "link set dev lc0a1b2c-br addrgenmode none",
        "link set dev lc0a1b2c-br up",
        "netns add lc-0a1b2c-algo-1",
        "link add name lc0a1b2c-1 type veth peer name eth0 netns lc-0a1b2c-algo-1",
        "link set dev lc0a1b2c-1 addrgenmode none",
        "link set dev lc0a1b2c-1 master lc0a1b2c-br",
        "link set dev lc0a1b2c-1 up",
        "netns add lc-0a1b2c-algo-2",
        "link add name lc0a1b2c-2 type veth peer name eth0 netns lc-0a1b2c-algo-2",
        "link set dev lc0a1b2c-2 addrgenmode none",
        "link set dev lc0a1b2c-2 master lc0a1b2c-br",
        "link set dev lc0a1b2c-2 up",
    ]
    assert inner["lc-0a1b2c-algo-2"] == [
        "addr add 10.213.7.2/24 dev eth0",
        "link set dev eth0 up",
        "link set dev lo up",
    ]
    # veths before namespaces, the bridge last
    assert build_down_commands("lc0a1b2c-br", ["lc-0a1b2c-algo-1"], ["lc0a1b2c-1"]) == [
        "link del dev lc0a1b2c-1",
        "netns del lc-0a1b2c-algo-1",
        "link del dev lc0a1b2c-br",
    ]
    assert build_down_commands(None, [], ["lc0a1b2c-1"]) == ["link del dev lc0a1b2c-1"]

"""Fixtures for tests that bring up real emulated hosts (root needed), and the check that a
cluster left nothing behind."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from localcluster import registry
from localcluster.network import NETNS_ETC, probe_link_names, probe_netns_names



@dataclass(frozen=True)
class Footprint:
    """Everything one cluster put on the machine, noted while it runs."""

    cluster_id: str
    bridge: str
    netns: tuple[str, ...]
    veths: tuple[str, ...]
    workdir: str
    namespace_links: frozenset[str]  # /proc/<init>/ns/{pid,net} of every host


def footprint_from_record(record: dict) -> Footprint:
    links = set()
    for pid, *_ in record["inits"]:
        for kind in ("pid", "net"):
            links.add(os.readlink(f"/proc/{pid}/ns/{kind}"))
    return Footprint(
        cluster_id=record["id"],
        bridge=record["bridge"],
        netns=tuple(record["netns"]),
        veths=tuple(record["veths"]),
        workdir=record["workdir"],
        namespace_links=frozenset(links),
    )


def load_record(cluster_id: str) -> dict:
    records = {r["id"]: r for r in registry.load_records()}
    return records[cluster_id]


def processes_in(links: frozenset[str]) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        for kind in ("pid", "net"):
            try:
                if os.readlink(f"/proc/{entry}/ns/{kind}") in links:
                    found.append(int(entry))
                    break
            except OSError:
                pass
    return found


def leftovers(fp: Footprint, workdir_kept: bool = False) -> list[str]:
    """What of the cluster is still on the machine (empty: nothing)."""
    left = []
    links = probe_link_names()
    left += [f"link {name}" for name in (fp.bridge, *fp.veths) if name in links]
    netns = probe_netns_names()
    left += [f"netns {name}" for name in fp.netns if name in netns]
    left += [f"{NETNS_ETC}/{name}" for name in fp.netns if os.path.exists(os.path.join(NETNS_ETC, name))]
    left += [f"process {pid}" for pid in processes_in(fp.namespace_links)]
    if not workdir_kept and os.path.exists(fp.workdir):
        left.append(f"workdir {fp.workdir}")
    if any(r["id"] == fp.cluster_id for r in registry.load_records()):
        left.append(f"registry record {fp.cluster_id}")
    return left


@pytest.fixture
def machine_files():
    """The real machine's files a cluster must never write: checked unchanged after the test."""
    paths = ["/etc/ssh", "/root/.ssh", "/etc/environment", "/opt", "/etc/hosts"]

    def snapshot():
        state = {}
        for p in paths:
            if os.path.isdir(p):
                state[p] = sorted(os.listdir(p))
            elif os.path.isfile(p):
                state[p] = Path(p).read_bytes()
            else:
                state[p] = None
        return state

    before = snapshot()
    yield
    assert snapshot() == before


@pytest.fixture
def footprint():
    """footprint(cluster_or_id) -> Footprint, noted while the cluster runs."""

    def take(cluster_or_id) -> Footprint:
        cluster_id = cluster_or_id if isinstance(cluster_or_id, str) else cluster_or_id.cluster_id
        return footprint_from_record(load_record(cluster_id))

    return take


@pytest.fixture
def assert_no_leftovers():
    def check(fp: Footprint, workdir_kept: bool = False) -> None:
        assert leftovers(fp, workdir_kept) == []

    return check


@pytest.fixture
def wait_for_text():
    """wait_for_text(host_process, text, timeout=10): until the process has printed text."""

    def wait(proc, text: str, timeout: float = 10.0) -> None:
        if not proc.wait_for_text(text, timeout):
            ended = "" if proc.poll() is None else f" (it ended: {proc.poll()})"
            raise AssertionError(f"{proc.host}: no {text!r} within {timeout} s{ended}:\n{proc.output}")

    return wait

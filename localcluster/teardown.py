"""Removing what a cluster record names: after a normal run, and for clusters whose owner
died. Callers hold the registry lock."""

from __future__ import annotations

import shutil
import subprocess
import sys

from localcluster import network, registry
from localcluster.errors import ClusterError
from localcluster.processes import wait_for_namespaces_to_empty


def remove_cluster_resources(record: dict) -> None:
    """Kill the host inits (every process of every host dies with them), delete the network,
    the /etc/netns entries, the workdir unless kept, and finally the record itself."""
    errors = []
    inits = [(int(init[0]), init[1]) for init in record.get("inits", [])]
    left = registry.kill_processes(inits)
    if left:
        errors.append(f"processes {left} survived SIGKILL")
    # Every host's processes gone, not only its init: the kernel ends a namespace's members a
    # moment after its init, and the init's `unshare` after that, later under load (seen: one
    # still in a host's network after `cleanup` returned).
    namespaces = {init[2] for init in record.get("inits", []) if len(init) > 2 and init[2]}
    namespaces |= {network.probe_netns_link(name) for name in record["netns"]} - {None}
    members = wait_for_namespaces_to_empty(namespaces)
    if members:
        errors.append(f"processes {members} still in the hosts' namespaces")
    try:
        network.stop_network(record["bridge"], record["netns"], record["veths"])
    except (ClusterError, subprocess.CalledProcessError) as e:
        errors.append(str(e))
    if not record.get("keep"):
        shutil.rmtree(record["workdir"], ignore_errors=True)
    if errors:
        raise ClusterError(f"cluster {record['id']}: teardown left something behind: {'; '.join(errors)}")
    registry.remove_record(record["id"])


def remove_stale_clusters() -> list[str]:
    """Remove clusters whose owner process is gone; returns their ids."""
    records = registry.load_records()
    alive = {r["id"]: registry.is_alive(r["owner_pid"], r.get("owner_start")) for r in records}
    removed = []
    for record in registry.decide_stale(records, alive):
        try:
            remove_cluster_resources(record)
        except ClusterError as e:
            # Its record stays (with its subnet claimed): a leftover must not block new clusters.
            print(f"localcluster: warning: {e}", file=sys.stderr)
            continue
        removed.append(record["id"])
    return removed

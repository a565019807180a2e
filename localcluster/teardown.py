"""Removing what a cluster record names: after a normal run, and for clusters whose owner
died. Callers hold the registry lock."""

from __future__ import annotations

import shutil
import subprocess
import sys

from localcluster import network, registry
from localcluster.errors import ClusterError


def remove_cluster_resources(record: dict) -> None:
    """Kill the host inits (every process of every host dies with them), delete the network,
    the /etc/netns entries, the workdir unless kept, and finally the record itself."""
    errors = []
    inits = [(int(p), s) for p, s in record.get("inits", [])]
    left = registry.kill_processes(inits)
    if left:
        errors.append(f"processes {left} survived SIGKILL")
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

"""An emulated multi-host SageMaker cluster on one machine (namespaces, no Docker).

    from localcluster import EmulatedCluster, JobSpec
    with EmulatedCluster(["algo-1", "algo-2"], JobSpec(program="train.py")) as cluster:
        cluster.run_on("algo-2", ["hostname"])

CLI: python -m localcluster run --hosts 2 ...  (see docs/local-cluster.md)
"""

from localcluster.cluster import EmulatedCluster
from localcluster.errors import ClusterError
from localcluster.optml import Channel, InstanceGroupSpec, JobSpec
from localcluster.outcome import ClusterResult
from localcluster.processes import HostProcess, HostResult

__all__ = [
    "Channel",
    "ClusterError",
    "ClusterResult",
    "EmulatedCluster",
    "HostProcess",
    "HostResult",
    "InstanceGroupSpec",
    "JobSpec",
]

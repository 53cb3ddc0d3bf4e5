"""A local Ray cluster for the Ray backend tests, shared by the package (shut down after
its last test): a head node without slots and two worker nodes with 2 slots (custom
resource ``slot``) and 2 CPUs each.

Ray is configured before it is imported: no usage stats, 127.0.0.1 kept as the node
address, a fast health check (a removed node is seen dead within a second), a small
object store and a short temp dir. The cluster is shut down with ``cluster.shutdown()``
(never ``ray stop``, which would kill every Ray process on the machine).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

SLOT = "slot"
SLOTS_PER_NODE = 2
NODE_ARGS: dict[str, Any] = {"num_cpus": SLOTS_PER_NODE, "resources": {SLOT: SLOTS_PER_NODE},
                             "object_store_memory": 80 * 2**20}
HEAD_ARGS: dict[str, Any] = {
    "num_cpus": 1, "object_store_memory": 80 * 2**20, "include_dashboard": False,
    "_system_config": {"health_check_period_ms": 200, "health_check_failure_threshold": 3}}


@dataclass
class RayTestCluster:
    """The running cluster and its worker nodes (``ray._private.node.Node`` objects)."""

    cluster: Any
    address: str
    workers: list[Any] = field(default_factory=list)

    def add_worker(self) -> Any:
        node = self.cluster.add_node(wait=True, **NODE_ARGS)
        self.workers.append(node)
        return node

    def remove_worker(self, node: Any, graceful: bool = False) -> None:
        """Remove a worker node (not gracefully: like a machine that crashed)."""
        self.workers.remove(node)
        self.cluster.remove_node(node, allow_graceful=graceful)

    def worker_by_id(self, node_id_prefix: str) -> Any:
        return next(n for n in self.workers if n.node_id.startswith(node_id_prefix))

    def restore(self, num_workers: int) -> None:
        """Add workers until there are ``num_workers`` again (after a node-loss test)."""
        while len(self.workers) < num_workers:
            self.add_worker()


@pytest.fixture(scope="package")
def ray_cluster() -> Iterator[RayTestCluster]:
    ray = pytest.importorskip("ray", reason="the Ray backend needs ray: pip install "
                                            "'pollux[ray]'")
    from ray.cluster_utils import Cluster

    os.makedirs("/tmp/ray", exist_ok=True)  # ray records the current cluster there
    temp_dir = tempfile.mkdtemp(prefix="prt", dir="/tmp")
    started = time.monotonic()
    cluster = Cluster(initialize_head=True,
                      head_node_args={**HEAD_ARGS, "temp_dir": temp_dir})
    test_cluster = RayTestCluster(cluster, cluster.address)
    try:
        for _ in range(2):
            test_cluster.add_worker()
        ray.init(address=cluster.address, log_to_driver=False,
                 logging_level="warning")
        print(f"ray test cluster up in {time.monotonic() - started:.1f} s")
        yield test_cluster
    finally:
        with contextlib.suppress(Exception):
            ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture
def ray_workers(ray_cluster: RayTestCluster) -> Iterator[RayTestCluster]:
    """The session cluster, with its two worker nodes restored after the test."""
    yield ray_cluster
    ray_cluster.restore(2)

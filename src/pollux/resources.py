"""The node and resource vocabulary shared by policies, drivers and backends.

Resource names and the node record live here, below every layer that uses them, so a
backend can describe its nodes without importing the policies and a policy can read them
without importing a backend.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

GPU = "gpu"
"""Device slots: GPUs, or CPU slots on a backend without GPUs."""
CPU = "cpu"
"""CPU cores."""
MEMORY = "memory"
"""Bytes of host memory."""
DEFAULT_GPU_TYPE = "default"
"""The GPU type of a node whose type nobody declared (an untyped, homogeneous cluster)."""


@dataclass(frozen=True)
class NodeInfo:
    """One node as a policy sees it."""

    name: str
    resources: Mapping[str, float]
    """Total resources, e.g. ``{"gpu": 4, "cpu": 48, "memory": 192e9}``."""
    preemptible: bool = False
    """Cloud spot/preemptible node: used last."""
    gpu_type: str = DEFAULT_GPU_TYPE
    """The kind of device behind the node's ``gpu`` slots (any name: ``"a100"``, ``"t4"``,
    ``"cpu"``); a job's allocation never spans types
    (:func:`pollux.cluster_spec.allocation_gpu_type`)."""

    @property
    def num_gpus(self) -> int:
        return int(self.resources.get(GPU, 0))

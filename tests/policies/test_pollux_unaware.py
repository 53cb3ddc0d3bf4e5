"""Heterogeneity-unaware Pollux: virtual identical nodes, one type kept per job."""

from __future__ import annotations

from types import MappingProxyType

from pollux.cluster_spec import allocation_gpu_type, parse_cluster_spec
from pollux.policies.base import JobInfo, facts_by_type
from pollux.policies.pollux_unaware import PolluxUnawarePolicy

NODES = parse_cluster_spec("aws:6x4,dgx-ext:2x8,rtx:3x8").node_infos()
BY_NAME = {node.name: node for node in NODES}


def perfect(nodes: object, replicas: object) -> object:
    import numpy as np

    return np.asarray(replicas, dtype=np.float64)


def test_sixteen_virtual_nodes_of_four() -> None:
    virtual = PolluxUnawarePolicy()._virtual_nodes(NODES)
    assert len(virtual) == 16 and {v.num_gpus for v in virtual} == {4}
    assert [v.name for v in virtual][6:8] == ["dgx-ext-0#0", "dgx-ext-0#1"]


def test_most_common_type_is_kept_ties_by_preference() -> None:
    policy = PolluxUnawarePolicy()
    type_of = {n.name: n.gpu_type for n in NODES}
    assert policy._one_type(("aws-0", "aws-0", "rtx-0"), type_of) == ("aws-0", "aws-0")
    assert policy._one_type(("aws-0", "rtx-0"), type_of) == ("rtx-0",)
    assert policy._one_type(("aws-0", "dgx-ext-1"), type_of) == ("dgx-ext-1",)


def test_decisions_use_real_nodes_within_one_type_and_capacity() -> None:
    jobs = [JobInfo(f"j{i}", MappingProxyType({"gpu": 1.0}),
                    by_type=facts_by_type(64, perfect), age_s=600.0) for i in range(12)]
    policy = PolluxUnawarePolicy()
    previous: dict[str, tuple[str, ...]] = {}
    for _ in range(3):
        allocations = policy.optimize(jobs, NODES, previous).allocations
        used: dict[str, int] = {}
        for alloc in allocations.values():
            assert len(alloc) <= 16
            allocation_gpu_type(alloc, BY_NAME)
            for node in alloc:
                used[node] = used.get(node, 0) + 1
        assert all(count <= BY_NAME[node].num_gpus for node, count in used.items())
        previous = {k: v for k, v in allocations.items() if v}
    assert sum(len(a) for a in previous.values()) > 32

"""Typed clusters: the ``type:NODESxGPUS,...`` spec, and the rule that a job's allocation
never spans GPU types.

A cluster spec lists groups of identical nodes, e.g. ``aws:6x4,dgx-ext:2x8,rtx:3x8``:
six nodes of type ``aws`` with 4 GPUs each, two ``dgx-ext`` nodes with 8, three ``rtx``
nodes with 8. A group without a type (``16x4``) has :data:`DEFAULT_GPU_TYPE`, so an
untyped spec describes the homogeneous cluster every earlier layer assumed. Like
``resources``, this module sits below every layer that uses it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from pollux.errors import ConfigError, MixedGpuTypesError, PolluxError
from pollux.resources import DEFAULT_GPU_TYPE, GPU, NodeInfo

__all__ = [
    "ClusterSpec", "MixedGpuTypesError", "NodeGroup", "allocation_gpu_type", "gpu_types_of",
    "parse_cluster_spec", "parse_type_speeds",
]

_GROUP = re.compile(r"^(?:(?P<type>[^:]+):)?(?P<nodes>\d+)x(?P<gpus>\d+)$")
_TYPE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
SPEC_FIELD = "cluster"
"""The field name errors report (the ``--cluster`` flag)."""
SPEC_EXAMPLE = "aws:6x4,dgx-ext:2x8,rtx:3x8"


@dataclass(frozen=True)
class NodeGroup:
    """``num_nodes`` identical nodes of one GPU type."""

    gpu_type: str
    num_nodes: int
    gpus_per_node: int

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node


@dataclass(frozen=True)
class ClusterSpec:
    """A cluster as groups of identical nodes, in the order the spec lists them."""

    groups: tuple[NodeGroup, ...]

    @property
    def num_gpus(self) -> int:
        return sum(group.num_gpus for group in self.groups)

    @property
    def num_nodes(self) -> int:
        return sum(group.num_nodes for group in self.groups)

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(group.gpu_type for group in self.groups)

    @property
    def is_typed(self) -> bool:
        """True unless every group has the default (undeclared) type."""
        return any(group.gpu_type != DEFAULT_GPU_TYPE for group in self.groups)

    def node_infos(self) -> tuple[NodeInfo, ...]:
        """One record per node, named ``<type>-<i>`` (``node-<i>`` for untyped groups), the
        index zero-padded within its group."""
        nodes: list[NodeInfo] = []
        for group in self.groups:
            prefix = "node" if group.gpu_type == DEFAULT_GPU_TYPE else group.gpu_type
            width = len(str(group.num_nodes - 1))
            resources = MappingProxyType({GPU: float(group.gpus_per_node)})
            nodes.extend(NodeInfo(f"{prefix}-{i:0{width}d}", resources, gpu_type=group.gpu_type)
                         for i in range(group.num_nodes))
        return tuple(nodes)

    def __str__(self) -> str:
        return ",".join(
            (f"{g.num_nodes}x{g.gpus_per_node}" if g.gpu_type == DEFAULT_GPU_TYPE
             else f"{g.gpu_type}:{g.num_nodes}x{g.gpus_per_node}") for g in self.groups)


def parse_cluster_spec(text: str, field: str = SPEC_FIELD) -> ClusterSpec:
    """Parse ``type:NODESxGPUS[,type:NODESxGPUS...]``; the type may be left out.

    Errors name the offending group and the fix: counts must be whole numbers >= 1, a type
    name starts with a letter or digit and holds only letters, digits, ``.``, ``_``, ``-``,
    and a type appears once (list all its nodes in one group).
    """
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(field, text, f"give groups of type:NODESxGPUS, e.g. {SPEC_EXAMPLE}")
    groups: list[NodeGroup] = []
    seen: set[str] = set()
    for part in (p.strip() for p in text.split(",")):
        match = _GROUP.match(part)
        if match is None:
            raise ConfigError(field, part, "each group is type:NODESxGPUS (or NODESxGPUS "
                              f"without a type), e.g. {SPEC_EXAMPLE}")
        gpu_type = (match.group("type") or DEFAULT_GPU_TYPE).strip()
        if not _TYPE_NAME.match(gpu_type):
            raise ConfigError(field, part, f"GPU type {gpu_type!r}: use letters, digits, "
                              "'.', '_' or '-', starting with a letter or digit")
        if gpu_type in seen:
            raise ConfigError(field, part, f"GPU type {gpu_type!r} appears twice; give all "
                              "its nodes in one group")
        seen.add(gpu_type)
        num_nodes, gpus = int(match.group("nodes")), int(match.group("gpus"))
        if num_nodes < 1 or gpus < 1:
            raise ConfigError(field, part, "nodes and GPUs per node must be whole numbers >= 1")
        groups.append(NodeGroup(gpu_type, num_nodes, gpus))
    return ClusterSpec(tuple(groups))


def allocation_gpu_type(allocation: Iterable[str], nodes: Mapping[str, NodeInfo]) -> str | None:
    """The one GPU type of an allocation's nodes; None for an empty allocation.

    Raises :class:`MixedGpuTypesError` when the nodes have different types and
    :class:`~pollux.errors.PolluxError` for a node not in ``nodes``: every driver (the
    simulator and the service) checks a policy's decision with this.
    """
    found: str | None = None
    for name in allocation:
        node = nodes.get(name)
        if node is None:
            raise PolluxError(f"allocation uses unknown node {name!r}")
        if found is None:
            found = node.gpu_type
        elif node.gpu_type != found:
            raise MixedGpuTypesError(f"allocation spans GPU types {found!r} and "
                                     f"{node.gpu_type!r} (node {name!r}); a job's replicas "
                                     "must all run on one type")
    return found


def gpu_types_of(nodes: Sequence[NodeInfo]) -> dict[str, tuple[NodeInfo, ...]]:
    """Nodes grouped by GPU type, types in order of first appearance."""
    by_type: dict[str, list[NodeInfo]] = {}
    for node in nodes:
        by_type.setdefault(node.gpu_type, []).append(node)
    return {gpu_type: tuple(group) for gpu_type, group in by_type.items()}


SPEEDS_FIELD = "gpu_type_speeds"
SPEEDS_EXAMPLE = "t4=1,a100=6.9"


def parse_type_speeds(text: str, field: str = SPEEDS_FIELD) -> dict[str, float]:
    """``type=SPEED,...`` (e.g. ``t4=1,a100=6.9``): how fast one GPU of each type trains
    relative to the others (only ratios matter)."""
    speeds: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or not _TYPE_NAME.match(name):
            raise ConfigError(field, part, f"each entry is type=SPEED, e.g. {SPEEDS_EXAMPLE}")
        try:
            speed = float(value)
        except ValueError:
            speed = float("nan")
        if not (speed > 0 and speed < float("inf")):
            raise ConfigError(field, part, "a speed is a finite number > 0")
        if name in speeds:
            raise ConfigError(field, part, f"GPU type {name!r} appears twice")
        speeds[name] = speed
    if not speeds:
        raise ConfigError(field, text, f"give type=SPEED entries, e.g. {SPEEDS_EXAMPLE}")
    return speeds

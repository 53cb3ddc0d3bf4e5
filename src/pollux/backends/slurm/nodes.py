"""Slurm's nodes as the policies see them (:class:`~pollux.resources.NodeInfo`).

From ``sinfo --json``: a node's GPUs are its ``gpu`` GRES (``gpu:a100:8`` -> 8 GPUs of
type ``a100``; ``gpu:8`` -> type ``default``), its CPUs and memory Slurm's. A node is
schedulable only in a base state that runs jobs (idle, mixed, allocated, completing)
with no flag that keeps jobs off it (DRAIN, NOT_RESPONDING, FAIL, maintenance, reboot,
power saving...). GPUs that Slurm jobs other than Pollux's hold (``squeue --json``'s
``gres_detail``) are taken off the node's count, so the policies never place a replica
on them. A node with GPUs of several types offers its most numerous type only.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from pollux.errors import ConfigError
from pollux.resources import CPU, DEFAULT_GPU_TYPE, GPU, MEMORY, NodeInfo

logger = logging.getLogger(__name__)

MIB = 2**20
SCHEDULABLE_STATES = frozenset({"idle", "mixed", "allocated", "completing"})
BLOCKING_FLAGS = frozenset({
    "DRAIN", "DRAINING", "DRAINED", "NOT_RESPONDING", "FAIL", "FAILING", "MAINTENANCE",
    "REBOOT_REQUESTED", "REBOOT_ISSUED", "POWERED_DOWN", "POWERING_DOWN", "POWER_DOWN",
    "POWERING_UP", "POWER_UP", "INVALID_REG", "NO_RESPOND", "DOWN", "FUTURE", "UNKNOWN",
    "PLANNED", "CLOUD",
})
_GRES_RE = re.compile(r"^(?P<name>[^:()]+)(?::(?P<type>[^:()]+))?:(?P<count>\d+)")
_RANGE_RE = re.compile(r"^(\d+)-(\d+)$")


def expand_hostlist(hostlist: str) -> list[str]:
    """A Slurm host list (``n[1-3,5],gpu-a[01-02]``) as node names, in order."""
    names: list[str] = []
    for part in _split_top_level(hostlist.strip()):
        if not part:
            continue
        match = re.match(r"^([^\[]*)\[([^\]]*)\](.*)$", part)
        if match is None:
            names.append(part)
            continue
        prefix, ranges, suffix = match.groups()
        for item in ranges.split(","):
            bounds = _RANGE_RE.match(item.strip())
            if bounds is None:
                if not item.strip().isdigit():
                    raise ConfigError("slurm_nodes", hostlist, f"bad host range {item!r}")
                values = [item.strip()]
            else:
                first, last = bounds.groups()
                if int(last) < int(first):
                    raise ConfigError("slurm_nodes", hostlist, f"bad host range {item!r}")
                values = [str(i).zfill(len(first)) for i in range(int(first), int(last) + 1)]
            for value in values:
                names.extend(expand_hostlist(f"{prefix}{value}{suffix}"))
    return names


def _split_top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return parts


def gpu_gres(gres: str) -> dict[str, int]:
    """GPU type -> count in a GRES string (``gpu:a100:8(S:0-1),gpu:t4:2,nic:1``)."""
    found: dict[str, int] = {}
    for item in _split_top_level(gres or ""):
        item = re.sub(r"\([^)]*\)", "", item.strip())
        match = _GRES_RE.match(item)
        if match is None or match.group("name") != "gpu":
            continue
        gpu_type = match.group("type") or DEFAULT_GPU_TYPE
        found[gpu_type] = found.get(gpu_type, 0) + int(match.group("count"))
    return found


def main_gpu_type(gres: str) -> tuple[str, int]:
    """The node's GPU type (its most numerous; ties: by name) and its count."""
    counts = gpu_gres(gres)
    if not counts:
        return DEFAULT_GPU_TYPE, 0
    gpu_type = min(counts, key=lambda t: (-counts[t], t))
    return gpu_type, counts[gpu_type]


def is_schedulable(node: Mapping[str, object]) -> bool:
    state = str(node.get("state", "")).lower()
    raw_flags = node.get("state_flags")
    flags = {str(f).upper() for f in raw_flags} if isinstance(raw_flags, list) else set()
    return state in SCHEDULABLE_STATES and not flags & BLOCKING_FLAGS


def held_gpus(jobs: Iterable[Mapping[str, object]], is_ours: Callable[[str], bool]
              ) -> dict[str, int]:
    """Node -> GPUs held by the running jobs that ``is_ours`` (by job name) rejects."""
    held: dict[str, int] = {}
    for job in jobs:
        if is_ours(str(job.get("name", ""))):
            continue
        details = job.get("gres_detail")
        nodes = job.get("nodes")
        if not isinstance(details, list) or not details or not isinstance(nodes, str):
            continue
        for node, detail in zip(expand_hostlist(nodes), details):
            count = sum(gpu_gres(str(detail)).values())
            if count:
                held[node] = held.get(node, 0) + count
    return held


@dataclass(frozen=True)
class NodeView:
    """One schedulable Slurm node: its NodeInfo and the address replicas reach it at."""

    info: NodeInfo
    address: str


def node_views(nodes: Sequence[Mapping[str, object]], jobs: Sequence[Mapping[str, object]],
               is_ours: Callable[[str], bool], partition: str | None = None,
               allowed: Sequence[str] | None = None) -> list[NodeView]:
    """The schedulable nodes (of ``partition``, among ``allowed`` when given), their
    GPUs less those held by other jobs; nodes without GPUs are left out."""
    held = held_gpus(jobs, is_ours)
    allowed_set = None if allowed is None else set(allowed)
    views = []
    for node in nodes:
        name = str(node.get("name", ""))
        partitions = node.get("partitions")
        if (not name or (allowed_set is not None and name not in allowed_set)
                or (partition is not None and isinstance(partitions, list)
                    and partition not in partitions)
                or not is_schedulable(node)):
            continue
        gpu_type, gpus = main_gpu_type(str(node.get("gres", "")))
        free = max(0, gpus - held.get(name, 0))
        if gpus == 0:
            continue
        cpus = _number(node.get("cpus"))
        memory = _number(node.get("real_memory")) * MIB
        views.append(NodeView(NodeInfo(name, {GPU: float(free), CPU: cpus, MEMORY: memory},
                                       gpu_type=gpu_type),
                              str(node.get("address") or node.get("hostname") or name)))
    return views


def allocation_views(job: Mapping[str, object], nodes: Sequence[Mapping[str, object]]
                     ) -> list[NodeView]:
    """The nodes of one allocation (allocation mode): each node's GPUs are the ones the
    allocation holds there (``gres_detail``), its CPUs the node's; nodes Slurm marks
    unschedulable are left out."""
    by_name = {str(n.get("name", "")): n for n in nodes}
    names = expand_hostlist(str(job.get("nodes") or ""))
    details = job.get("gres_detail")
    details = details if isinstance(details, list) else []
    views = []
    for index, name in enumerate(names):
        node = by_name.get(name, {})
        if node and not is_schedulable(node):
            continue
        detail = str(details[index]) if index < len(details) else ""
        gpu_type, gpus = main_gpu_type(detail)
        if gpus == 0:
            continue
        views.append(NodeView(
            NodeInfo(name, {GPU: float(gpus), CPU: _number(node.get("cpus")),
                            MEMORY: _number(node.get("real_memory")) * MIB},
                     gpu_type=gpu_type),
            str(node.get("address") or node.get("hostname") or name)))
    return views


def _number(value: object) -> float:
    if isinstance(value, bool):
        return 0.0
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, dict) and isinstance(value.get("number"), (int, float)):
        return float(value["number"])  # newer Slurm: {"set": true, "number": N}
    return 0.0

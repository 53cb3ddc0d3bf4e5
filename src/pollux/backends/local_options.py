"""The local backend's options, each with the help text of its ``pollux server`` flag
(:mod:`pollux.options`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pollux.options import option


@dataclass(frozen=True)
class LocalOptions:
    """The virtual nodes of the local backend (``--backend local``, the default)."""

    num_nodes: int = option(
        1, flag="--nodes", type=int,
        help="local backend: virtual nodes (default: %(default)s)")
    slots_per_node: int | None = option(
        None, flag="--slots-per-node", type=int,
        help="local backend: GPU or CPU slots per virtual node (default: all GPUs, else "
             "all CPUs, split over the nodes)")
    virtual_nodes: str | None = option(
        None, flag="--virtual-nodes", metavar="SPEC",
        help="local backend: typed virtual nodes, type:NODESxSLOTS groups, e.g. "
             "aws:2x2,rtx:1x4 (instead of --nodes/--slots-per-node)")
    device: str = option(
        "auto", flag="--device", choices=("auto", "gpu", "cpu"),
        help="local backend: slots are GPUs or CPU slots (default: auto)")

    def backend_kwargs(self) -> dict[str, Any]:
        """The keyword options of :class:`~pollux.backends.local.LocalBackend` (the log
        budget, shared with the Slurm backend, comes from the backend section)."""
        return {"num_nodes": self.num_nodes, "slots_per_node": self.slots_per_node,
                "device": self.device, "virtual_nodes": self.virtual_nodes}

"""The Ray backend's options, each with the help text of its ``pollux server`` flag
(:mod:`pollux.options`); imports no Ray."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pollux.options import option


@dataclass(frozen=True)
class RayOptions:
    """How the server reaches Ray and reads its nodes (``--backend ray``)."""

    address: str | None = option(
        None, flag="--ray-address", metavar="ADDR",
        help="an existing Ray cluster (auto, HOST:PORT); default: start a local Ray instance")
    slot_resource: str | None = option(
        None, flag="--ray-slot-resource", metavar="NAME",
        help="the Ray resource that is a replica's device slot: GPU, CPU or a custom "
             "resource (default: GPU when the cluster has GPUs, else CPU)")
    gpu_type_prefix: str | None = option(
        None, flag="--ray-gpu-type-prefix", metavar="PREFIX",
        help="a node's resource PREFIX<T> names its GPU type <T> (default: Ray's "
             "accelerator_type:)")
    autoscale: bool = option(
        False, flag="--ray-autoscale", store_true=True,
        help="pass the policy's desired cluster size to Ray's autoscaler")

    def backend_kwargs(self) -> dict[str, Any]:
        """The keyword options of :class:`~pollux.backends.ray.RayBackend`."""
        return {"address": self.address, "slot_resource": self.slot_resource or "auto",
                "autoscale": self.autoscale,
                **({} if self.gpu_type_prefix is None
                   else {"gpu_type_prefix": self.gpu_type_prefix})}

"""The Ray backend: the policy's nodes are Ray's nodes, a job's allocation is a placement
group with one bundle per replica pinned to the node the policy chose, and each replica
is a Ray actor that runs the training command (see :mod:`pollux.backends.ray.launch`).

Ray's actors and placement groups share the fate of the server process that created
them: when the server exits (or dies), Ray removes them and the replicas' watchdogs kill
the replicas, so a restarted server finds nothing running and resumes every job from
its last checkpoint. Checkpoint and log directories live under the server's data
directory and must be on a filesystem every node mounts at the same path.
"""

from __future__ import annotations

import ipaddress
import logging
import signal
import threading
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlparse

import ray
from ray.util.placement_group import (
    PlacementGroup,
    placement_group_table,
    remove_placement_group,
)

from pollux.backends.base import Backend, LaunchedReplica, LaunchRequest, ReplicaStatus
from pollux.backends.ray.launch import (
    RayLaunch,
    create_placement_group,
    replica_actor_class,
    replica_env,
)
from pollux.backends.ray.nodes import (
    AUTO_SLOT,
    GPU_TYPE_PREFIX,
    RayNode,
    alive_nodes,
    autoscaler_bundles,
    check_ray_amount,
    choose_slot_resource,
    node_info,
    offers_slots,
    replica_bundle,
    typed_autoscaler_bundles,
)
from pollux.backends.replica_log import DEFAULT_LOG_BUDGET_BYTES, check_log_budget
from pollux.errors import BackendError, ConfigError
from pollux.job_spec import JobSpec
from pollux.resources import NodeInfo

logger = logging.getLogger(__name__)

LOCAL_OBJECT_STORE_BYTES = 256 * 2**20
"""Object store of a Ray instance the backend starts itself (Pollux stores nothing big)."""
RECOVER_KILL_WAIT_S = 10.0


class RayBackend(Backend):
    """Replicas as Ray actors in per-job placement groups on a Ray cluster."""

    name = "ray"

    def __init__(self, instance_id: str, address: str | None = None,
                 slot_resource: str = AUTO_SLOT, autoscale: bool = False,
                 placement_timeout_s: float = 300.0,
                 gpu_type_prefix: str = GPU_TYPE_PREFIX,
                 log_budget_bytes: int = DEFAULT_LOG_BUDGET_BYTES) -> None:
        """``address``: an existing cluster (``auto``, ``HOST:PORT``); None starts a
        local Ray instance. ``slot_resource``: the Ray resource that is a replica's
        device slot (``GPU``, ``CPU``, a custom resource, or ``auto``). ``autoscale``:
        pass the policy's desired cluster size to Ray's autoscaler. ``gpu_type_prefix``:
        a node's resource ``<prefix><T>`` gives its GPU type ``<T>`` (Ray's own
        ``accelerator_type:``, or a custom prefix the nodes declare).
        ``log_budget_bytes``: each replica's log budget (its two parts together)."""
        if placement_timeout_s <= 0:
            raise ConfigError("placement_timeout_s", placement_timeout_s, "must be > 0")
        if not slot_resource:
            raise ConfigError("slot_resource", slot_resource, "name a Ray resource or auto")
        if not gpu_type_prefix:
            raise ConfigError("gpu_type_prefix", gpu_type_prefix,
                              "name a resource prefix, e.g. accelerator_type:")
        try:
            check_log_budget(log_budget_bytes)
        except ValueError as exc:
            raise ConfigError("log_budget", log_budget_bytes, str(exc)) from None
        self.log_budget_bytes = log_budget_bytes
        self.gpu_type_prefix = gpu_type_prefix
        self.instance_id = instance_id
        self.namespace = f"pollux-{instance_id}"
        self.autoscale = autoscale
        self.placement_timeout_s = placement_timeout_s
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            self._connect(address)
        self._lock = threading.Lock()
        self._nodes: dict[str, RayNode] = {}
        self._launches: dict[str, RayLaunch] = {}
        self._actor_class = replica_actor_class()
        self._requested_num_nodes: int | None = None
        self._requested_by_type: dict[str, int] | None = None
        self._warned_hints = False
        self._driver_address = str(ray.util.get_node_ip_address())
        self.slot_resource = choose_slot_resource(slot_resource, self._read_nodes())
        logger.info("ray backend: %d nodes, slot resource %s", len(self._nodes),
                    self.slot_resource)

    def _connect(self, address: str | None) -> None:
        options: dict[str, Any] = {"namespace": self.namespace, "log_to_driver": False,
                                   "logging_level": logging.WARNING}
        if address is None:
            options.update(address="local", include_dashboard=False,
                           object_store_memory=LOCAL_OBJECT_STORE_BYTES)
        else:
            options["address"] = address
        try:
            ray.init(**options)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ConfigError("ray_address", address,
                              f"cannot connect to Ray ({exc}); start a cluster with "
                              "`ray start --head` or pass its address") from exc

    # --- nodes ------------------------------------------------------------------------

    def _read_nodes(self) -> list[RayNode]:
        nodes = alive_nodes(ray.nodes())
        with self._lock:
            self._nodes = {node.name: node for node in nodes}
        return nodes

    def nodes(self) -> list[NodeInfo]:
        return [node_info(node, self.slot_resource, self.gpu_type_prefix)
                for node in self._read_nodes()
                if offers_slots(node, self.slot_resource)]

    def validate(self, spec: JobSpec) -> None:
        check_ray_amount("resources.gpu", spec.resources.gpu)
        check_ray_amount("resources.cpu", spec.resources.cpu)

    # --- launching --------------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> list[LaunchedReplica]:
        previous = self._launches.get(request.job_id)
        if previous is not None:
            if not previous.ended:
                raise BackendError(f"job {request.job_id} still has live replicas")
            self.release(request.job_id)
        with self._lock:
            known = dict(self._nodes)
        if any(name not in known for name in request.allocation):
            known = {node.name: node for node in self._read_nodes()}
        unknown = [name for name in request.allocation if name not in known]
        if unknown:
            raise BackendError(f"node {unknown[0]!r} is not (or no longer) in the Ray cluster")
        nodes = tuple(known[name] for name in request.allocation)
        bundle = replica_bundle(request.spec.resources, self.slot_resource)
        prefix = f"{request.job_id}-{request.generation}"
        try:
            placement = create_placement_group(f"{self.namespace}-{prefix}", bundle, nodes)
        except (ray.exceptions.RayError, ValueError) as exc:
            raise BackendError(f"cannot create the placement group: {exc}") from exc
        launch = RayLaunch(request=request, nodes=nodes, bundle=bundle, placement=placement,
                           actor_names=tuple(f"{prefix}-{r}" for r in range(len(nodes))),
                           namespace=self.namespace, actor_class=self._actor_class,
                           env=replica_env(request, bundle, self.instance_id),
                           log_budget_bytes=self.log_budget_bytes)
        launch.begin()
        self._launches[request.job_id] = launch
        self._warn_unreachable_hints(request, nodes)
        return [LaunchedReplica(rank, node.name, {
            "backend": self.name, "instance": self.instance_id, "namespace": self.namespace,
            "actor": name, "placement_group": placement.id.hex(), "node_id": node.node_id})
            for rank, (node, name) in enumerate(zip(nodes, launch.actor_names))]

    def _warn_unreachable_hints(self, request: LaunchRequest, nodes: Sequence[RayNode]) -> None:
        if self._warned_hints or not request.hints_target:
            return
        host = urlparse(request.hints_target).hostname or ""
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = host == "localhost"
        if loopback and any(node.address != self._driver_address for node in nodes):
            self._warned_hints = True
            logger.warning("replicas on other machines cannot reach the hints URL %s; bind "
                           "the server to an address they reach (--host, with a token) or "
                           "pass --advertise-address", request.hints_target)

    # --- watching and stopping --------------------------------------------------------

    def poll(self, job_id: str) -> list[ReplicaStatus]:
        launch = self._launches.get(job_id)
        if launch is None:
            return []
        with self._lock:
            alive = {node.node_id for node in self._nodes.values()}
        launch.advance(alive, self.placement_timeout_s)
        return launch.statuses()

    def stop(self, job_id: str, force: bool = False) -> None:
        launch = self._launches.get(job_id)
        if launch is not None:
            launch.stop(force)

    def release(self, job_id: str) -> None:
        launch = self._launches.get(job_id)
        if launch is not None and launch.ended:
            launch.dispose()
            del self._launches[job_id]

    def recover(self, handles: Sequence[Mapping[str, Any]], grace_s: float) -> list[str]:
        """Stop the replica actors and placement groups of a previous server on this data
        directory (normally Ray has already removed them with their dead owner)."""
        names = sorted(entry["name"] for entry in ray.util.list_named_actors(all_namespaces=True)
                       if entry.get("namespace") == self.namespace)
        actors = []
        for name in names:
            try:
                actors.append(ray.get_actor(name, namespace=self.namespace))
            except ValueError:  # gone in the meantime
                continue
        if actors:
            for actor in actors:
                actor.signal.remote(int(signal.SIGTERM))
            ray.wait([a.wait.remote() for a in actors], num_returns=len(actors),
                     timeout=grace_s)
            for actor in actors:
                try:
                    ray.kill(actor, no_restart=True)
                except (ray.exceptions.RayError, ValueError):
                    pass
        stale = [pg_id for pg_id, entry in placement_group_table().items()
                 if str(entry.get("name", "")).startswith(f"{self.namespace}-")
                 and entry.get("state") != "REMOVED"]
        for pg_id in stale:
            try:
                remove_placement_group(PlacementGroup(ray.PlacementGroupID(
                    bytes.fromhex(pg_id))))
            except (ray.exceptions.RayError, ValueError):
                pass
        return [f"actor {name}" for name in names] + [f"placement group {p}" for p in stale]

    # --- cluster size -----------------------------------------------------------------

    def request_cluster_size(self, num_nodes: int | None) -> None:
        """Pass the policy's desired number of nodes to Ray's autoscaler (when enabled
        and changed); None keeps the previous request."""
        if not self.autoscale or num_nodes is None or num_nodes == self._requested_num_nodes:
            return
        from ray.autoscaler.sdk import request_resources

        with self._lock:
            nodes = list(self._nodes.values())
        bundles = autoscaler_bundles(num_nodes, nodes, self.slot_resource)
        request_resources(bundles=bundles)
        self._requested_num_nodes = num_nodes
        logger.info("asked Ray's autoscaler for %d nodes (%s each)", num_nodes,
                    bundles[0] if bundles else "-")

    def request_nodes_by_type(self, num_nodes_by_type: Mapping[str, int]) -> None:
        """Pass the nodes wanted per GPU type to Ray's autoscaler (when enabled and
        changed): one bundle per node carrying the type's ``accelerator_type:<T>`` marker,
        so that Ray launches nodes of that type. One type: :meth:`request_cluster_size`."""
        wanted = {t: int(n) for t, n in num_nodes_by_type.items()}
        if len(wanted) <= 1:
            self.request_cluster_size(sum(wanted.values()))
            return
        if not self.autoscale or wanted == self._requested_by_type:
            return
        from ray.autoscaler.sdk import request_resources

        with self._lock:
            nodes = list(self._nodes.values())
        bundles = typed_autoscaler_bundles(wanted, nodes, self.slot_resource,
                                           self.gpu_type_prefix)
        request_resources(bundles=bundles)
        self._requested_by_type = wanted
        logger.info("asked Ray's autoscaler for nodes by GPU type: %s", wanted)

    def close(self) -> None:
        for job_id in list(self._launches):
            self._launches.pop(job_id).dispose()
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()

"""One launch of a job on Ray: a placement group, one actor per replica, and the
replicas' processes, driven forward without blocking the allocation loop.

A launch moves through :class:`LaunchPhase` as :meth:`RayLaunch.advance` finds each
step done: once the placement group is placed (every bundle pinned to the node the
policy chose), Ray creates the actors in their bundles and rank 0 reports its node
address and a free port (the torch.distributed master); then every actor starts its
replica. Until a replica's process has started it is reported as starting.
"""

from __future__ import annotations

import inspect
import logging
import signal
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from pollux.backends.base import LaunchRequest, ReplicaState, ReplicaStatus
from pollux.backends.ray.nodes import NODE_ID_LABEL, RAY_GPU, RayNode, actor_options
from pollux.backends.ray.replica import ReplicaProcess
from pollux.backends.replica_log import DEFAULT_LOG_BUDGET_BYTES
from pollux.data_dir import replica_log

logger = logging.getLogger(__name__)

MARKER_ENV = "POLLUX_RAY_BACKEND_ID"
"""Set on every replica to the backend's instance id (to find them on a machine)."""
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
ACTOR_MAX_CONCURRENCY = 4
"""Threads per replica actor: wait() blocks one while signal() must still get through."""
PIN_FALLBACK_AMOUNT = 0.001
"""Share of a node's ``node:<ip>`` resource a bundle asks for when Ray has no per-bundle
label selectors (Ray releases whose ``placement_group`` takes no
``bundle_label_selector``); pins by address, so one node per address."""


class LaunchPhase(Enum):
    PREPARING = "preparing"
    """Placement group and actors requested; waiting for rank 0's address and port."""
    STARTED = "started"
    """Every actor was asked to start its replica."""
    ENDED = "ended"
    """Every replica has an exit status."""


def replica_actor_class() -> Any:
    """The replica actor class (created threaded: see ACTOR_MAX_CONCURRENCY)."""
    return ray.remote(ReplicaProcess)


def supports_bundle_label_selector() -> bool:
    return "bundle_label_selector" in inspect.signature(placement_group).parameters


def create_placement_group(name: str, bundle: Mapping[str, float],
                           nodes: Sequence[RayNode]) -> PlacementGroup:
    """One bundle per replica, bundle ``i`` pinned to ``nodes[i]``."""
    if supports_bundle_label_selector():
        return placement_group([dict(bundle) for _ in nodes], strategy="PACK", name=name,
                               bundle_label_selector=[{NODE_ID_LABEL: n.node_id}
                                                      for n in nodes])
    return placement_group([{**bundle, f"node:{n.address}": PIN_FALLBACK_AMOUNT}
                            for n in nodes], strategy="PACK", name=name)


def append_log(log_dir: str, rank: int, message: str) -> None:
    """A line from the backend itself in a replica's log (on the server's filesystem)."""
    try:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        with open(replica_log(log_dir, rank), "a") as log:
            log.write(f"pollux: {message}\n")
    except OSError:
        logger.warning("cannot write the log of replica %d in %s", rank, log_dir)


@dataclass
class RayLaunch:
    """The Ray side of one launch (generation) of a job."""

    request: LaunchRequest
    nodes: tuple[RayNode, ...]
    """Node of each rank."""
    bundle: Mapping[str, float]
    placement: PlacementGroup
    actor_names: tuple[str, ...]
    namespace: str
    env: Mapping[str, str]
    """Variables every replica gets besides the agent's (job env, marker, threads)."""
    actor_class: Any
    """``ray.remote(ReplicaProcess)``, made once per backend."""
    log_budget_bytes: int = DEFAULT_LOG_BUDGET_BYTES
    """Each replica's log budget (:class:`~pollux.backends.replica_log.BoundedLog`)."""
    created_at_s: float = field(default_factory=time.monotonic)
    phase: LaunchPhase = LaunchPhase.PREPARING
    ready_ref: Any = None
    """Resolves when the placement group is placed."""
    actors: list[Any] = field(default_factory=list)
    address_ref: Any = None
    start_refs: dict[int, Any] = field(default_factory=dict)
    wait_refs: dict[int, Any] = field(default_factory=dict)
    started: set[int] = field(default_factory=set)
    exit_codes: dict[int, int | None] = field(default_factory=dict)
    forced: bool = False

    @property
    def num_replicas(self) -> int:
        return len(self.nodes)

    @property
    def ended(self) -> bool:
        return len(self.exit_codes) == self.num_replicas

    # --- moving forward ---------------------------------------------------------------

    def begin(self) -> None:
        """Create the actors in their bundles (Ray places them once the placement group
        is placed) and ask rank 0 for the master address and port."""
        self.ready_ref = self.placement.ready()
        options = actor_options(self.bundle)
        for rank, name in enumerate(self.actor_names):
            self.actors.append(self.actor_class.options(
                name=name, namespace=self.namespace, max_restarts=0,
                max_concurrency=ACTOR_MAX_CONCURRENCY,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self.placement, placement_group_bundle_index=rank),
                **options).remote())
        self.address_ref = self.actors[0].address_and_port.remote()

    def advance(self, alive_node_ids: Collection[str], placement_timeout_s: float) -> None:
        """Take every step that is ready now; never blocks."""
        if self.phase is LaunchPhase.PREPARING:
            self._check_preparing(alive_node_ids, placement_timeout_s)
        if self.phase is LaunchPhase.STARTED:
            self._check_started()

    def _check_preparing(self, alive_node_ids: Collection[str], timeout_s: float) -> None:
        ready, _ = ray.wait([self.address_ref], timeout=0)
        if not ready:
            lost = [n for n in self.nodes if n.node_id not in alive_node_ids]
            if lost:
                self._kill_actors()
                self._end_all(None, f"node {lost[0].name} left the cluster during the launch")
            elif time.monotonic() - self.created_at_s > timeout_s:
                placed, _ = ray.wait([self.ready_ref], timeout=0)
                self._kill_actors()
                self._end_all(None, f"the replica actors were not up within {timeout_s:g} s ("
                              + ("placed; is pollux installed on every node?)" if placed else
                                 "not placed: resources held by something else?)"))
            return
        try:
            master_addr, master_port = ray.get(self.address_ref)
        except ray.exceptions.RayError as exc:
            self._kill_actors()
            self._end_all(None, f"the replica actor of rank 0 failed: {exc}")
            return
        request = self.request
        for env, node, actor in zip(request.environments(master_addr, master_port), self.nodes,
                                    self.actors):
            header = (f"=== pollux {time.strftime('%Y-%m-%d %H:%M:%S')}: launch "
                      f"{request.generation}, rank {env.rank} of {self.num_replicas} on "
                      f"{node.name} (ray node {node.node_id}) ===\n")
            self.start_refs[env.rank] = actor.start.remote(
                list(request.spec.command), request.spec.working_dir,
                {**self.env, **env.to_env()},
                str(replica_log(request.log_dir, env.rank)), header, self.log_budget_bytes)
            self.wait_refs[env.rank] = actor.wait.remote()
        self.phase = LaunchPhase.STARTED
        logger.info("%s launch %d: actors up after %.1f s; master %s:%d", request.job_id,
                    request.generation, time.monotonic() - self.created_at_s, master_addr,
                    master_port)

    def _check_started(self) -> None:
        pending = [ref for rank, ref in self.start_refs.items() if rank not in self.started]
        if pending:
            ready, _ = ray.wait(pending, num_returns=len(pending), timeout=0)
            done = set(ready)
            for rank, ref in self.start_refs.items():
                if ref in done:
                    self.started.add(rank)
            if len(self.started) == self.num_replicas:
                logger.info("%s launch %d: replicas started after %.1f s", self.request.job_id,
                            self.request.generation, time.monotonic() - self.created_at_s)
        waiting = [ref for rank, ref in self.wait_refs.items() if rank not in self.exit_codes]
        if not waiting:
            return
        ready, _ = ray.wait(waiting, num_returns=len(waiting), timeout=0)
        done = set(ready)
        for rank, ref in self.wait_refs.items():
            if ref in done and rank not in self.exit_codes:
                self.exit_codes[rank] = self._exit_code(rank, ref)
        if self.ended:
            self.phase = LaunchPhase.ENDED

    def _exit_code(self, rank: int, ref: Any) -> int | None:
        try:
            return int(ray.get(ref))
        except ray.exceptions.RayError as exc:
            if self.forced:
                return -int(signal.SIGKILL)
            append_log(self.request.log_dir, rank,
                       f"replica {rank} lost with its Ray actor on {self.nodes[rank].name}: "
                       f"{type(exc).__name__}")
            return None

    def _end_all(self, code: int | None, reason: str | None) -> None:
        for rank in range(self.num_replicas):
            if rank not in self.exit_codes:
                self.exit_codes[rank] = code
                if reason is not None:
                    append_log(self.request.log_dir, rank, reason)
        self.phase = LaunchPhase.ENDED

    # --- reporting and stopping -------------------------------------------------------

    def statuses(self) -> list[ReplicaStatus]:
        result = []
        for rank in range(self.num_replicas):
            if rank in self.exit_codes:
                result.append(ReplicaStatus(rank, ReplicaState.EXITED, self.exit_codes[rank]))
            elif rank in self.started:
                result.append(ReplicaStatus(rank, ReplicaState.RUNNING))
            else:
                result.append(ReplicaStatus(rank, ReplicaState.STARTING))
        return result

    def stop(self, force: bool) -> None:
        """Checkpoint-and-stop (SIGTERM to each replica's first process) or kill at once
        (SIGKILL to its process group; the actors stay until :meth:`dispose`). Replicas
        not asked to start yet are not started."""
        if self.phase is LaunchPhase.PREPARING:
            self._kill_actors()
            self._end_all(-int(signal.SIGKILL if force else signal.SIGTERM), None)
            return
        if self.phase is LaunchPhase.ENDED:
            return
        signum = signal.SIGKILL if force else signal.SIGTERM
        self.forced = self.forced or force
        for rank, actor in enumerate(self.actors):
            if rank not in self.exit_codes:
                actor.signal.remote(int(signum), force)

    def _kill_actors(self) -> None:
        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except (ray.exceptions.RayError, ValueError):
                pass

    def dispose(self) -> None:
        """Free the launch's Ray resources: its actors and its placement group."""
        self._kill_actors()
        try:
            remove_placement_group(self.placement)
        except (ray.exceptions.RayError, ValueError):
            logger.debug("placement group of %s already gone", self.request.job_id)


def replica_env(request: LaunchRequest, bundle: Mapping[str, float], instance_id: str
                ) -> dict[str, str]:
    """The variables every replica of ``request`` gets besides the agent's own."""
    env = dict(request.spec.env)
    env[MARKER_ENV] = instance_id
    if bundle.get(RAY_GPU, 0.0) <= 0:
        env["CUDA_VISIBLE_DEVICES"] = ""  # GPU slots: Ray sets the actor's devices
    threads = str(max(1, int(request.spec.resources.cpu)))
    for name in THREAD_ENV_VARS:
        if name not in request.spec.env:
            env[name] = threads
    return env


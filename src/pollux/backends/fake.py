"""An in-memory backend for tests: replicas are records whose exits the test decides.

By default a graceful stop makes every live replica exit with the rescale code (75) and
a forced stop with -9 (SIGKILL), as well-behaved agents would; tests end or crash
replicas with :meth:`FakeBackend.exit_replica` and :meth:`FakeBackend.finish`, take the
backend's evidence away with :meth:`FakeBackend.lose_track` (a replica reports UNKNOWN)
and :attr:`FakeBackend.poll_errors` (polls raise BackendError), and make recovery slow
with :attr:`FakeBackend.recover_gate`.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pollux.backends.base import (
    Backend,
    LaunchedReplica,
    LaunchRequest,
    LiveReplica,
    ReplicaState,
    ReplicaStatus,
)
from pollux.errors import BackendError
from pollux.jobenv import RESCALE_EXIT_CODE
from pollux.resources import NodeInfo


@dataclass
class _FakeLaunch:
    request: LaunchRequest
    states: list[ReplicaState]
    exit_codes: list[int | None]
    polls_left_starting: int
    stop_requests: list[bool] = field(default_factory=list)
    """``force`` flag of each stop call, in order."""


class FakeBackend(Backend):
    """Replicas in memory. Records every launch, stop and recover call for assertions."""

    name = "fake"
    recovers_alongside_launches = True

    def __init__(self, nodes: Sequence[NodeInfo], exit_on_stop: bool = True,
                 starting_polls: int = 0,
                 provider: Callable[[int], Sequence[NodeInfo]] | None = None) -> None:
        self._nodes = list(nodes)
        self.provider = provider
        """A fake node provider: the nodes there are once ``n`` are asked for (None: the
        cluster keeps its nodes whatever is asked)."""
        self.requested_sizes: list[int | None] = []
        """Every size :meth:`request_cluster_size` was asked for, in order."""
        self.requested_by_type: list[dict[str, int]] = []
        """Every per-type size :meth:`request_nodes_by_type` was asked for, in order."""
        self.exit_on_stop = exit_on_stop
        """Whether stop() makes replicas exit at once (75 graceful, -9 forced)."""
        self.starting_polls = starting_polls
        """Polls during which fresh replicas report STARTING."""
        self.launches: list[LaunchRequest] = []
        self.fail_next_launch: str | None = None
        """When set, the next launch raises BackendError with this message."""
        self.recovered: list[Mapping[str, Any]] = []
        self.poll_errors = 0
        """Polls still to fail with BackendError (an unreachable controller)."""
        self.adopts = False
        """Whether :meth:`adopt` takes over launches this fake still runs (a new
        allocator on the same fake backend: work that outlived its server)."""
        self.adopted: list[LiveReplica] = []
        self.recover_gate: threading.Event | None = None
        """When set, :meth:`recover` waits for this event (a slow stop grace)."""
        self._unknown: set[tuple[str, int]] = set()
        self._jobs: dict[str, _FakeLaunch] = {}

    def nodes(self) -> list[NodeInfo]:
        return list(self._nodes)

    def request_cluster_size(self, num_nodes: int | None) -> None:
        self.requested_sizes.append(num_nodes)
        if self.provider is not None and num_nodes is not None:
            self._nodes = list(self.provider(num_nodes))

    def request_nodes_by_type(self, num_nodes_by_type: Mapping[str, int]) -> None:
        self.requested_by_type.append(dict(num_nodes_by_type))
        super().request_nodes_by_type(num_nodes_by_type)

    def launch(self, request: LaunchRequest) -> list[LaunchedReplica]:
        if self.fail_next_launch is not None:
            message, self.fail_next_launch = self.fail_next_launch, None
            raise BackendError(message)
        previous = self._jobs.get(request.job_id)
        if previous is not None and any(s is not ReplicaState.EXITED for s in previous.states):
            raise BackendError(f"job {request.job_id} still has live replicas")
        num = len(request.allocation)
        self.launches.append(request)
        self._jobs[request.job_id] = _FakeLaunch(
            request, [ReplicaState.STARTING if self.starting_polls else ReplicaState.RUNNING]
            * num, [None] * num, self.starting_polls)
        return [LaunchedReplica(rank, node, {"fake": True, "job": request.job_id,
                                             "generation": request.generation})
                for rank, node in enumerate(request.allocation)]

    def poll(self, job_id: str) -> list[ReplicaStatus]:
        if self.poll_errors > 0:
            self.poll_errors -= 1
            raise BackendError("the fake controller is unreachable")
        launch = self._jobs.get(job_id)
        if launch is None:
            return []
        if launch.polls_left_starting > 0:
            launch.polls_left_starting -= 1
            if launch.polls_left_starting == 0:
                launch.states = [ReplicaState.RUNNING if s is ReplicaState.STARTING else s
                                 for s in launch.states]
        return [ReplicaStatus(rank, ReplicaState.UNKNOWN) if (job_id, rank) in self._unknown
                else ReplicaStatus(rank, state, code) for rank, (state, code)
                in enumerate(zip(launch.states, launch.exit_codes))]

    def stop(self, job_id: str, force: bool = False) -> None:
        launch = self._jobs.get(job_id)
        if launch is None:
            return
        launch.stop_requests.append(force)
        if self.exit_on_stop:
            code = -int(signal.SIGKILL) if force else RESCALE_EXIT_CODE
            for rank, state in enumerate(launch.states):
                if state is not ReplicaState.EXITED:
                    self.exit_replica(job_id, rank, code)

    def release(self, job_id: str) -> None:
        self._jobs.pop(job_id, None)

    def adopt(self, replicas: Sequence[LiveReplica]) -> set[str]:
        if not self.adopts:
            return set()
        self.adopted.extend(replicas)
        return {r.job_id for r in replicas if (launch := self._jobs.get(r.job_id)) is not None
                and launch.request.generation == r.generation
                and any(s is not ReplicaState.EXITED for s in launch.states)}

    def recover(self, handles: Sequence[Mapping[str, Any]], grace_s: float) -> list[str]:
        if self.recover_gate is not None:
            self.recover_gate.wait()
        self.recovered.extend(handles)
        return [f"{h.get('job')}/{h.get('generation')}" for h in handles]

    # --- test controls ----------------------------------------------------------------

    def exit_replica(self, job_id: str, rank: int, exit_code: int) -> None:
        launch = self._jobs[job_id]
        launch.states[rank] = ReplicaState.EXITED
        launch.exit_codes[rank] = exit_code

    def lose_track(self, job_id: str, rank: int, lost: bool = True) -> None:
        """Replica ``rank`` reports UNKNOWN (the backend has no evidence of it) until
        called again with ``lost=False``; its real state goes on underneath."""
        if lost:
            self._unknown.add((job_id, rank))
        else:
            self._unknown.discard((job_id, rank))

    def forget(self, job_id: str) -> None:
        """Drop every trace of the job (as a restarted backend would know nothing)."""
        self._jobs.pop(job_id, None)

    def finish(self, job_id: str, exit_code: int = 0) -> None:
        """Every live replica of the job exits with ``exit_code``."""
        launch = self._jobs[job_id]
        for rank, state in enumerate(launch.states):
            if state is not ReplicaState.EXITED:
                self.exit_replica(job_id, rank, exit_code)

    def stop_requests(self, job_id: str) -> list[bool]:
        launch = self._jobs.get(job_id)
        return [] if launch is None else list(launch.stop_requests)

    def live_replicas_per_node(self) -> dict[str, int]:
        """Replicas not yet exited on each node, over every job."""
        counts: dict[str, int] = {}
        for launch in self._jobs.values():
            for node, state in zip(launch.request.allocation, launch.states):
                if state is not ReplicaState.EXITED:
                    counts[node] = counts.get(node, 0) + 1
        return counts

    def stopping_jobs(self) -> list[str]:
        """Jobs asked to stop that still have live replicas."""
        return sorted(j for j, launch in self._jobs.items() if launch.stop_requests and any(
            s is not ReplicaState.EXITED for s in launch.states))

    def live_jobs(self) -> list[str]:
        return sorted(j for j, launch in self._jobs.items()
                      if any(s is not ReplicaState.EXITED for s in launch.states))

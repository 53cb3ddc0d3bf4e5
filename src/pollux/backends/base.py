"""The one backend interface: where a job's replicas run.

The service decides *what* runs *where* (an allocation: the node of each replica); a
backend makes it so and reports back. Implementations: :mod:`pollux.backends.local`
(local processes, optionally as several virtual nodes), :mod:`pollux.backends.fake`
(in memory, for tests) and, later, a Ray backend. A backend never touches the job
store: the service records what :meth:`Backend.launch` returns, so a restarted server
can hand the records of a dead server's replicas to :meth:`Backend.recover`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar

from pollux.job_spec import JobSpec
from pollux.jobenv import JobEnvironment
from pollux.resources import NodeInfo


class ReplicaState(str, Enum):
    STARTING = "starting"
    """Requested, not yet running (e.g. waiting for a placement group)."""
    RUNNING = "running"
    EXITED = "exited"
    UNKNOWN = "unknown"
    """The backend has no evidence now (its controller is unreachable, an exit status
    could not be recorded yet): the service neither fails nor relaunches the job on it,
    and polls again. Only the backend's own evidence (EXITED) ends a launch."""


@dataclass(frozen=True)
class ReplicaStatus:
    rank: int
    state: ReplicaState
    exit_code: int | None = None
    """Process exit status; negative -N when killed by signal N; None unless EXITED."""


@dataclass(frozen=True)
class LaunchRequest:
    """Everything a backend needs to start one launch (generation) of a job."""

    job_id: str
    generation: int
    """1 for the first launch, +1 for every relaunch (rescale, failure, server restart)."""
    spec: JobSpec
    allocation: tuple[str, ...]
    """Node of each replica in rank order (replicas of one node are contiguous)."""
    checkpoint_dir: str
    log_dir: str
    """Replica ``r`` appends its output to ``<log_dir>/replica-<r>.log``."""
    hints_target: str | None = None
    hints_token: str | None = None
    gpu_type: str | None = None
    """The GPU type of the allocation's nodes (one type: the service checks it), passed
    to every replica as ``POLLUX_GPU_TYPE``; None on a cluster without declared types."""
    account: str | None = None
    """The account the launch is charged to (Slurm: ``sbatch --account``), the job's
    team's; None: the backend's default."""

    @property
    def num_restarts(self) -> int:
        return self.generation - 1

    def environments(self, master_addr: str, master_port: int) -> list[JobEnvironment]:
        """The agent's launch environment of every replica, in rank order."""
        node_order: list[str] = []
        for node in self.allocation:
            if node not in node_order:
                node_order.append(node)
        seen: dict[str, int] = {}
        envs = []
        for rank, node in enumerate(self.allocation):
            envs.append(JobEnvironment(
                job_id=self.job_id, rank=rank, num_replicas=len(self.allocation),
                local_rank=seen.get(node, 0), node_rank=node_order.index(node),
                num_nodes=len(node_order), master_addr=master_addr, master_port=master_port,
                checkpoint_dir=self.checkpoint_dir, hints_target=self.hints_target,
                hints_token=self.hints_token, num_restarts=self.num_restarts,
                on_corrupt_checkpoint=self.spec.on_corrupt_checkpoint,
                gpu_type=self.gpu_type))
            seen[node] = seen.get(node, 0) + 1
        return envs


@dataclass(frozen=True)
class LaunchedReplica:
    """What a launch started, to be recorded in the job store."""

    rank: int
    node: str
    handle: Mapping[str, Any]
    """JSON-serializable; enough for :meth:`Backend.recover` to find the replica again."""


def rank_order(allocation: Sequence[str]) -> tuple[str, ...]:
    """The allocation with each node's replicas contiguous, nodes by first appearance."""
    counts: dict[str, int] = {}
    for node in allocation:
        counts[node] = counts.get(node, 0) + 1
    return tuple(node for node, count in counts.items() for _ in range(count))


@dataclass(frozen=True)
class LiveReplica:
    """A replica a previous server process recorded as live (for :meth:`Backend.adopt`)."""

    job_id: str
    generation: int
    rank: int
    node: str
    handle: Mapping[str, Any]
    """What :meth:`Backend.launch` returned for it."""


class Backend(ABC):
    """Launches, stops and watches the replicas of jobs.

    All methods are called from the service's allocation loop (one thread), except
    :meth:`nodes` and :meth:`validate`, which the API may also call.
    """

    name: ClassVar[str]
    recovers_alongside_launches: ClassVar[bool] = False
    """Whether :meth:`recover` may run in a thread of its own while the service
    launches other jobs (it then never touches replicas launched by this instance);
    otherwise the service waits for it before scheduling anything."""

    @abstractmethod
    def nodes(self) -> list[NodeInfo]:
        """The nodes jobs can be placed on now, with their total resources."""

    def validate(self, spec: JobSpec) -> None:
        """Raise JobSpecError when this backend could never run ``spec``."""
        return None

    @abstractmethod
    def launch(self, request: LaunchRequest) -> list[LaunchedReplica]:
        """Start every replica of ``request``; raise BackendError (having cleaned up
        whatever it started) when it cannot."""

    @abstractmethod
    def poll(self, job_id: str) -> list[ReplicaStatus]:
        """Status of each replica of the job's latest launch, by the backend's evidence
        (UNKNOWN for a replica it has none of now; raise BackendError when it cannot
        tell at all now). [] means the backend knows nothing of the job (never launched
        here, or released): the service then judges the launch from the exits it has
        recorded, never as "vanished"; a replica known to be gone is EXITED with
        ``exit_code`` None."""

    @abstractmethod
    def stop(self, job_id: str, force: bool = False) -> None:
        """Ask the job's live replicas to stop: checkpoint and exit (SIGTERM), or at once
        (``force``, SIGKILL). Returns without waiting; idempotent."""

    def release(self, job_id: str) -> None:
        """Forget a job whose replicas have all exited and been accounted for."""
        return None

    def request_cluster_size(self, num_nodes: int | None) -> None:
        """Ask for ``num_nodes`` nodes in all (None: no opinion). A backend that cannot
        resize ignores it (the default)."""
        return None

    def request_nodes_by_type(self, num_nodes_by_type: Mapping[str, int]) -> None:
        """Ask for ``num_nodes_by_type`` nodes of each GPU type: the autoscaler's desired
        size, passed on every scheduling round before the policy runs. A backend that
        cannot tell types apart asks for their sum (the default,
        :meth:`request_cluster_size`)."""
        self.request_cluster_size(sum(int(n) for n in num_nodes_by_type.values()))

    def adopt(self, replicas: Sequence[LiveReplica]) -> set[str]:
        """At startup, before :meth:`recover`: take over the launches of a previous server
        process whose replicas still run where this backend can watch and stop them
        again (their work outlives the server, as Slurm's does), instead of having them
        stopped and relaunched. ``replicas`` are the latest launch of jobs that were
        running, all of each job's live replicas. Returns the ids of the jobs adopted:
        their launches are then polled, stopped and released like this process's own,
        and :meth:`recover` leaves them alone. The default adopts nothing."""
        return set()

    @abstractmethod
    def recover(self, handles: Sequence[Mapping[str, Any]], grace_s: float) -> list[str]:
        """Make sure replicas recorded (``handles`` from :meth:`launch`) or started by a
        previous server process on this data directory are gone: ask them to
        checkpoint and stop, wait up to ``grace_s``, then kill. Returns what was stopped,
        for the log. Called once at startup, before any launch."""

    def close(self) -> None:
        """Release the backend's own resources (live replicas are left to the caller)."""
        return None

"""Wiring of the scheduler service: its configuration, the service facade the API calls,
and :func:`build_service`, which puts store, backend, policy and allocation loop together.
Running it as a process (HTTP server, signals, data-directory lock) is
:mod:`pollux.service.runner`."""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pollux.backends.base import Backend
from pollux.backends.registry import make_backend
from pollux.capacity import RESOURCE_TOLERANCE
from pollux.data_dir import log_dir, replica_log
from pollux.errors import ConfigError, JobSpecError, UnknownJobError
from pollux.job_spec import JobSpec
from pollux.models.hints import JobHints
from pollux.policies.autoscaling import Autoscaler, autoscaler_for_nodes, scaling_view
from pollux.policies.base import NodeInfo, Policy
from pollux.policies.registry import make_policy
from pollux.service.config import AutoscalingConfig, ServerConfig
from pollux.service.http.team_usage import load_service_teams, team_usage
from pollux.service.http.views import job_detail, job_summary, node_views
from pollux.service.loop.allocator import Allocator, AllocatorConfig
from pollux.service.loop.explain import batch_change_event
from pollux.service.loop.retention import Pruner
from pollux.service.loop.telemetry import History, RoundRecorder
from pollux.service.storage.records import JobRecord
from pollux.service.storage.states import ACTIVE_STATES
from pollux.service.storage.store import JobStore
from pollux.service.storage.store_check import backup, keep_instance_id, open_checked_store
from pollux.service.storage.users import UserStore
from pollux.teams import Teams

if TYPE_CHECKING:
    from pollux.service.http.metrics import ServiceMetrics

logger = logging.getLogger(__name__)

POLICY_SEED = 0
"""Seed of the service's policy (the simulator's default seed too)."""
MAX_LOG_CHUNK_BYTES = 1 << 20
PART_HEAD_BYTES = 512
"""Bytes of a log's start that :func:`log_part` reads for its marker line."""
DEFAULT_FINISHED_LISTED = 100
"""Finished jobs ``GET /api/jobs`` lists by default (the newest; every active job too)."""
MAX_LISTED = 10000
"""The most finished jobs (or events) one page may ask for."""
DEFAULT_EVENTS_LISTED = 500
"""Events ``GET /api/jobs/{ref}`` returns by default (the newest)."""


def check_fits_cluster(spec: JobSpec, nodes: Sequence[NodeInfo]) -> None:
    """Refuse a job whose min_replicas could never run on these nodes together (on a
    typed cluster: on the nodes of one GPU type, as a job never spans types)."""
    needed = spec.resources.as_policy_resources()
    fitting: dict[str, int] = {}
    for node in nodes:
        per_node = [node.resources.get(name, 0.0) / amount for name, amount in needed.items()]
        fitting[node.gpu_type] = (fitting.get(node.gpu_type, 0)
                                  + int(min(per_node, default=0.0) + RESOURCE_TOLERANCE))
    most = max(fitting.values(), default=0)
    if spec.min_replicas > most:
        where = "the cluster" if len(fitting) < 2 else "one GPU type of the cluster"
        raise JobSpecError("min_replicas", spec.min_replicas,
                           f"{where} fits at most {most} replicas of this size")


def log_part(inode: int, head: bytes) -> str:
    """The name of one part of a replica's log: its inode and the digest of its first
    line when that is a marker or header line (``=== pollux <time>: ...``, written at
    once when the part starts). The marker tells a part apart from one that took the
    inode of a part dropped meanwhile (a follower two rotations behind)."""
    first = head.split(b"\n", 1)
    marker = first[0] if len(first) == 2 and first[0].startswith(b"=== pollux ") else b""
    return f"{inode:x}-{hashlib.blake2b(marker, digest_size=6).hexdigest()}"


class SchedulerService:
    """What the API calls: submissions, queries, cancellations, hints and logs. State
    changes of jobs are left to the allocation loop."""

    def __init__(self, store: JobStore, backend: Backend, allocator: Allocator,
                 data_dir: Path, policy_name: str,
                 clock: Callable[[], float] = time.time, autoscaler: str = "none",
                 history: History | None = None, metrics: ServiceMetrics | None = None,
                 pruner: Pruner | None = None) -> None:
        self.store = store
        self.backend = backend
        self.allocator = allocator
        self.data_dir = data_dir
        self.policy_name = policy_name
        self.clock = clock
        self.autoscaler_name = autoscaler
        self.history = history if history is not None else History()
        """Recent per-round samples of jobs and the cluster (the dashboard's charts)."""
        self.metrics = metrics
        """Prometheus metrics (``/metrics``); None without prometheus_client."""
        self.pruner = pruner
        """Removes finished jobs past retention (None: keeps every job)."""
        self.users = UserStore(store.db)
        """The registered users (:mod:`pollux.service.storage.users`)."""
        self.teams: Teams | None = None
        """The server's teams file (None: no file, any team name)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- API operations ---------------------------------------------------------------

    def submit(self, data: Any, owner: str | None = None, team: str | None = None
               ) -> dict[str, Any]:
        """Accept the job spec ``data`` of ``owner`` (None: the server's own account)
        into ``team`` (checked by the caller: :func:`~pollux.service.http.authorization.
        submit_team`)."""
        spec = JobSpec.from_dict(data)
        self.backend.validate(spec)
        check_fits_cluster(spec, self.backend.nodes())
        record = self.store.add_job(spec, self.clock(), owner, team)
        self.allocator.request_round()
        return job_summary(record, self.clock())

    def list_jobs(self, limit: int = DEFAULT_FINISHED_LISTED, offset: int = 0
                  ) -> list[dict[str, Any]]:
        """Every job not finished and a page of the finished ones (the newest ``limit``
        after skipping the ``offset`` newest), in submission order."""
        return self.summaries(self.store.list_recent(limit, offset))

    def summaries(self, records: Sequence[JobRecord]) -> list[dict[str, Any]]:
        now, recovering = self.clock(), self.allocator.recovering_jobs
        return [job_summary(r, now, r.id in recovering) for r in records]

    def describe(self, ref: str, events_limit: int = DEFAULT_EVENTS_LISTED,
                 events_offset: int = 0) -> dict[str, Any]:
        """One job in detail with a page of its events: the newest ``events_limit``
        after skipping the ``events_offset`` newest, oldest first."""
        record = self.store.find_job(ref)
        return job_detail(record, self.clock(),
                          self.store.events(record.id, events_limit, events_offset),
                          self.store.replicas(record.id),
                          record.id in self.allocator.recovering_jobs)

    def cancel(self, ref: str) -> dict[str, Any]:
        record = self.store.request_cancel(self.store.find_job(ref).id, self.clock())
        self.allocator.wake()
        return job_summary(record, self.clock())

    @property
    def team_names(self) -> tuple[str, ...] | None:
        """The teams a job may go into (None: any name: no teams file)."""
        return None if self.teams is None else self.teams.names

    def team_usage(self) -> list[dict[str, Any]]:
        """Each team's quota and GPUs in use, lent, borrowed and pending."""
        return [usage.to_dict() for usage in
                team_usage(self.store.list_jobs(ACTIVE_STATES), self.teams)]

    def job_for_hints(self, job_id: str) -> JobRecord:
        return self.store.get_job(job_id)

    def post_hints(self, job_id: str, data: Any) -> None:
        try:
            hints = JobHints.from_dict(data)
        except ConfigError:
            raise
        except (ValueError, TypeError, OverflowError, AttributeError) as exc:
            raise ConfigError("hints", data, f"a field has the wrong type ({exc})") from exc
        before = self.store.get_job(job_id)
        now = self.clock()
        self.store.set_hints(job_id, hints, now)
        event = batch_change_event(before, hints)
        if event is not None:
            self.store.add_event(job_id, now, "Batch size", event)

    def nodes(self, records: Sequence[JobRecord] | None = None) -> list[dict[str, Any]]:
        """Nodes with the jobs holding them (``records``: the active jobs, if read)."""
        return node_views(self.backend.nodes(),
                          self.store.list_jobs(ACTIVE_STATES) if records is None else records)

    def cluster(self) -> dict[str, Any]:
        """Nodes now and, with an autoscaler, the size it asked for in the latest round;
        the GPU type speeds the latest round used (declared and learned)."""
        autoscaler, scaling = self.allocator.autoscaler, self.allocator.last_scaling
        view = ({} if autoscaler is None or scaling is None
                else scaling_view(autoscaler, scaling))
        view.update(autoscaler=self.autoscaler_name, num_nodes=len(self.backend.nodes()),
                    desired_num_nodes=None if scaling is None else scaling.num_nodes,
                    gpu_type_speeds=dict(self.allocator.type_speeds))
        return view

    def health(self) -> dict[str, Any]:
        return {"status": "ok", "policy": self.policy_name, "backend": self.backend.name,
                "interval_s": self.allocator.config.interval_s,
                "rounds": self.allocator.num_rounds, "time": self.clock()}

    def read_log(self, ref: str, replica: int, offset: int, limit: int,
                 rotated: bool = False) -> dict[str, Any]:
        """Up to ``limit`` bytes of a replica's log from ``offset`` (< 0: from the end);
        ``rotated``: of its older part. ``part`` names the file read (:func:`log_part`),
        which a rotation keeps, so a follower sees when the part it read rotated away."""
        record = self.store.find_job(ref)
        path = replica_log(log_dir(self.data_dir, record.id), replica, rotated)
        if not path.is_file():
            raise UnknownJobError(f"{record.id} replica {replica}",
                                  "no rotated log for" if rotated else "no log (yet) for")
        limit = max(1, min(limit, MAX_LOG_CHUNK_BYTES))
        with open(path, "rb") as handle:
            part = log_part(os.fstat(handle.fileno()).st_ino, handle.read(PART_HEAD_BYTES))
            size = handle.seek(0, os.SEEK_END)
            # offset < 0 reads the tail: the last -offset bytes
            start = max(0, size + offset) if offset < 0 else min(offset, size)
            handle.seek(start)
            data = handle.read(limit)
        return {"job": record.id, "replica": replica, "offset": start,
                "next_offset": start + len(data), "size": size,
                "text": data.decode("utf-8", errors="replace"),
                "part": part, "final": record.state.is_final}

    # --- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        """Start the allocation loop; it first recovers what a previous server left
        (in the background: the API answers meanwhile, showing those jobs as
        recovering)."""
        self._thread = threading.Thread(target=self.allocator.recover_and_run,
                                        args=(self._stop,), name="pollux-allocator",
                                        daemon=True)
        self._thread.start()
        if self.pruner is not None:
            self.pruner.start()

    def shutdown(self, grace_s: float) -> None:
        if self.pruner is not None:
            self.pruner.stop()
        self._stop.set()
        self.allocator.wake()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.allocator.shutdown(grace_s)
        self.backend.close()


def autoscaler_for(config: AutoscalingConfig, nodes: Sequence[NodeInfo]) -> Autoscaler | None:
    """``config``'s autoscaler (None for "none"), the simulator's for the same nodes: new
    nodes copy the most common node; on nodes of several GPU types it decides the nodes
    of each type (:func:`~pollux.policies.autoscaling.autoscaler_for_nodes`)."""
    return autoscaler_for_nodes(config.name, nodes, config.node_price_per_hour,
                                config.min_nodes, config.max_nodes)


def build_service(config: ServerConfig, hints_url: str | None,
                  backend: Backend | None = None) -> SchedulerService:
    """Store, backend, policy and allocation loop for ``config`` (no HTTP)."""
    store = open_checked_store(config.data_dir, recover=config.store.recover)
    instance_id = keep_instance_id(store, config.data_dir)
    if backend is None:
        backend = make_backend(config.backend.name, instance_id=instance_id,
                               **config.backend.options())
    policy: Policy = make_policy(config.policy.spec, seed=POLICY_SEED)
    teams = (None if config.teams_file is None else load_service_teams(
        config.teams_file, backend.nodes(), check_cluster=config.backend.name == "local"))
    history = History()
    metrics = service_metrics(store, backend, history, teams)
    recorder = RoundRecorder(history, lambda: store.list_jobs(ACTIVE_STATES),
                             backend.nodes, time.time,
                             None if metrics is None else metrics.round_duration.observe)
    allocator = Allocator(store, backend, policy, AllocatorConfig(
        data_dir=config.data_dir, interval_s=config.loop.interval_s,
        poll_interval_s=config.loop.poll_interval_s, stop_grace_s=config.loop.stop_grace_s,
        hints_url=hints_url, gpu_type_speeds=config.policy.type_speeds(),
        teams=teams,
        team_accounts={} if teams is None else {
            team.name: team.slurm_account for team in teams if team.slurm_account}),
        autoscaler=autoscaler_for(config.autoscaling, backend.nodes()),
        on_round=recorder)
    service = SchedulerService(store, backend, allocator, config.data_dir, policy.name,
                               autoscaler=config.autoscaling.name, history=history,
                               metrics=metrics,
                               pruner=Pruner(store, config.data_dir, config.store.retention(),
                                             time.time,
                                             backup=lambda: backup(store, config.data_dir)))
    service.teams = teams
    return service


def service_metrics(store: JobStore, backend: Backend, history: History,
                    teams: Teams | None = None) -> ServiceMetrics | None:
    """This service's own Prometheus registry, or None without prometheus_client."""
    try:
        from pollux.service.http.metrics import (
            ClusterCollector,
            JobFiguresCollector,
            ServiceMetrics,
            TeamCollector,
        )
    except ImportError:
        logger.warning("prometheus_client is not installed: no /metrics")
        return None
    metrics = ServiceMetrics()
    metrics.watch_cluster(ClusterCollector(lambda: store.list_jobs(ACTIVE_STATES),
                                           backend.nodes, time.time,
                                           count_by_state=store.count_by_state))
    metrics.watch_cluster(TeamCollector(lambda: store.list_jobs(ACTIVE_STATES), teams))
    metrics.job_figures = JobFiguresCollector(lambda: store.list_jobs(ACTIVE_STATES),
                                              time.time)
    return metrics

"""Wiring of the scheduler service: its configuration, the service facade the API calls,
and :func:`build_service`, which puts store, backend, policy and allocation loop together.
Running it as a process (HTTP server, signals, data-directory lock) is
:mod:`pollux.service.runner`."""

from __future__ import annotations

import ipaddress
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pollux.backends.base import Backend
from pollux.backends.registry import make_backend
from pollux.backends.replica_log import DEFAULT_LOG_BUDGET_BYTES, check_log_budget
from pollux.cluster_spec import parse_cluster_spec, parse_type_speeds
from pollux.data_dir import log_dir, replica_log
from pollux.errors import ConfigError, JobSpecError, UnknownJobError
from pollux.job_spec import JobSpec
from pollux.models.hints import JobHints
from pollux.policies.autoscaling import (
    DEFAULT_NODE_PRICE_PER_HOUR,
    Autoscaler,
    AutoscalerConfig,
    check_autoscaler_name,
    make_autoscaler,
    scaling_view,
    template_from_nodes,
)
from pollux.policies.base import NodeInfo, Policy
from pollux.policies.registry import make_policy
from pollux.service.http.team_usage import load_service_teams, team_usage
from pollux.service.http.views import job_detail, job_summary, node_views
from pollux.service.loop.allocator import Allocator, AllocatorConfig
from pollux.service.loop.explain import batch_change_event
from pollux.service.loop.retention import Pruner, Retention
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

DEFAULT_PORT = 8470
POLICY_SEED = 0
"""Seed of the service's policy (the simulator's default seed too)."""
MAX_LOG_CHUNK_BYTES = 1 << 20
DEFAULT_FINISHED_LISTED = 100
"""Finished jobs ``GET /api/jobs`` lists by default (the newest; every active job too)."""
MAX_LISTED = 10000
"""The most finished jobs (or events) one page may ask for."""
DEFAULT_EVENTS_LISTED = 500
"""Events ``GET /api/jobs/{ref}`` returns by default (the newest)."""


@dataclass(frozen=True)
class ServerConfig:
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    """0 picks a free port (written to server.json)."""
    token: str | None = None
    """Required on every request; None: the token in ``<data_dir>/token``, generated on
    first start (mode 0600)."""
    token_file: str | None = None
    """Where the token came from (recorded in server.json so the CLI can read it)."""
    policy: str = "pollux"
    """A policy spec: a registered name or ``module:Class``, with options, e.g.
    ``pollux(p=-0.5)`` (:mod:`pollux.policies.registry`)."""
    interval_s: float = 30.0
    backend: str = "local"
    num_nodes: int = 1
    slots_per_node: int | None = None
    virtual_nodes: str | None = None
    """Local backend: typed virtual nodes as a cluster spec (``aws:2x2,rtx:1x4``) instead
    of ``num_nodes`` x ``slots_per_node``."""
    gpu_type_speeds: str | None = None
    """Relative speed of one GPU of each type, ``t4=1,a100=6.9``: projects a job's model
    onto types it has not run on (types not given are learned from jobs that ran on
    several)."""
    device: str = "auto"
    stop_grace_s: float = 60.0
    poll_interval_s: float = 0.5
    backend_options: Mapping[str, Any] = field(default_factory=dict)
    """Extra keyword options of the backend class (e.g. a cluster address)."""
    advertise_host: str | None = None
    """Address replicas use to reach the server (hints URL); default: the bound address,
    or 127.0.0.1 when binding every interface."""
    tls_cert: str | None = None
    """PEM certificate (chain) to serve HTTPS with; needs ``tls_key``."""
    tls_key: str | None = None
    """PEM private key of ``tls_cert``."""
    autoscaler: str = "none"
    """Registered autoscaler computing the desired cluster size every round ("none": no
    desired size); the size goes to the backend's ``request_cluster_size``."""
    min_nodes: int = 1
    """Autoscaling: the fewest nodes to ask for."""
    max_nodes: int | None = None
    """Autoscaling: the most nodes to ask for (None: the nodes there are at startup)."""
    node_price_per_hour: float = DEFAULT_NODE_PRICE_PER_HOUR
    """Autoscaling: price of a node-hour (shown with the desired size)."""
    keep_finished: int = Retention.keep_count
    """Finished jobs kept (the newest); older ones are pruned with their files."""
    recover: bool = False
    """Before starting: set the job store aside, restore its newest backup and move the
    directories of jobs it lacks to ``<data dir>/lost`` (:mod:`pollux.service.storage.store_check`)."""
    keep_finished_days: float = Retention.keep_s / 86_400.0
    """Finished jobs are pruned (with their files) this many days after they finished."""
    log_budget_bytes: int = DEFAULT_LOG_BUDGET_BYTES
    """Local and slurm backends: each replica's log budget (the newest output kept,
    :mod:`pollux.backends.replica_log`)."""
    teams_file: str | None = None
    """The teams file (YAML, :mod:`pollux.teams`): each team's GPU quota, weight and
    Slurm account; jobs are submitted into one of their owner's teams."""

    def __post_init__(self) -> None:
        check_autoscaler_name(self.autoscaler)
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("tls_cert" if self.tls_cert is None else "tls_key", None,
                              "give both --tls-cert and --tls-key")
        for name in ("tls_cert", "tls_key"):
            path = getattr(self, name)
            if path is not None and not os.access(path, os.R_OK):
                raise ConfigError(name, path, "no such readable file")
        if self.interval_s <= 0:
            raise ConfigError("interval", self.interval_s, "must be > 0 seconds")
        if self.gpu_type_speeds is not None:
            parse_type_speeds(self.gpu_type_speeds, "--gpu-type-speeds")
        if self.virtual_nodes is not None:
            if self.backend != "local":
                raise ConfigError("virtual_nodes", self.virtual_nodes,
                                  "typed virtual nodes need --backend local (a Ray node "
                                  "declares its type with an accelerator_type:<T> resource)")
            parse_cluster_spec(self.virtual_nodes, field="virtual_nodes")
        try:
            check_log_budget(self.log_budget_bytes)
        except ValueError as exc:
            raise ConfigError("log_budget", self.log_budget_bytes, str(exc)) from None
        if not 0 <= self.port < 65536:
            raise ConfigError("port", self.port, "must be in 0..65535")
        self.retention()  # checks the bounds

    def retention(self) -> Retention:
        return Retention(keep_count=self.keep_finished,
                         keep_s=self.keep_finished_days * 86_400.0)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_fits_cluster(spec: JobSpec, nodes: Sequence[NodeInfo]) -> None:
    """Refuse a job whose min_replicas could never run on these nodes together (on a
    typed cluster: on the nodes of one GPU type, as a job never spans types)."""
    needed = spec.resources.as_policy_resources()
    fitting: dict[str, int] = {}
    for node in nodes:
        per_node = [node.resources.get(name, 0.0) / amount for name, amount in needed.items()]
        fitting[node.gpu_type] = (fitting.get(node.gpu_type, 0)
                                  + int(min(per_node, default=0.0) + 1e-9))
    most = max(fitting.values(), default=0)
    if spec.min_replicas > most:
        where = "the cluster" if len(fitting) < 2 else "one GPU type of the cluster"
        raise JobSpecError("min_replicas", spec.min_replicas,
                           f"{where} fits at most {most} replicas of this size")


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

    def read_log(self, ref: str, replica: int, offset: int, limit: int) -> dict[str, Any]:
        record = self.store.find_job(ref)
        path = replica_log(log_dir(self.data_dir, record.id), replica)
        if not path.is_file():
            raise UnknownJobError(f"{record.id} replica {replica}", "no log (yet) for")
        limit = max(1, min(limit, MAX_LOG_CHUNK_BYTES))
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            # offset < 0 reads the tail: the last -offset bytes
            start = max(0, size + offset) if offset < 0 else min(offset, size)
            handle.seek(start)
            data = handle.read(limit)
        return {"job": record.id, "replica": replica, "offset": start,
                "next_offset": start + len(data), "size": size,
                "text": data.decode("utf-8", errors="replace"),
                "final": record.state.is_final}

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


def autoscaler_for(config: ServerConfig, nodes: Sequence[NodeInfo]) -> Autoscaler | None:
    """``config``'s autoscaler (None for "none"); new nodes copy the most common node."""
    if config.autoscaler == "none":
        return None
    max_nodes = (max(config.min_nodes, 1, len(nodes)) if config.max_nodes is None
                 else config.max_nodes)
    scaling = AutoscalerConfig(template_from_nodes(nodes, config.node_price_per_hour),
                               config.min_nodes, max_nodes)
    return make_autoscaler(config.autoscaler, scaling)


def build_service(config: ServerConfig, hints_url: str | None,
                  backend: Backend | None = None) -> SchedulerService:
    """Store, backend, policy and allocation loop for ``config`` (no HTTP)."""
    store = open_checked_store(config.data_dir, recover=config.recover)
    instance_id = keep_instance_id(store, config.data_dir)
    if backend is None:
        options = dict(config.backend_options)
        if config.backend == "local":
            options.update(num_nodes=config.num_nodes, slots_per_node=config.slots_per_node,
                           device=config.device, virtual_nodes=config.virtual_nodes)
        if config.backend in ("local", "slurm"):
            options.update(log_budget_bytes=config.log_budget_bytes)
        backend = make_backend(config.backend, instance_id=instance_id, **options)
    policy: Policy = make_policy(config.policy, seed=POLICY_SEED)
    teams = (None if config.teams_file is None else load_service_teams(
        config.teams_file, backend.nodes(), check_cluster=config.backend == "local"))
    history = History()
    metrics = service_metrics(store, backend, history, teams)
    recorder = RoundRecorder(history, lambda: store.list_jobs(ACTIVE_STATES),
                             backend.nodes, time.time,
                             None if metrics is None else metrics.round_duration.observe)
    allocator = Allocator(store, backend, policy, AllocatorConfig(
        data_dir=config.data_dir, interval_s=config.interval_s,
        poll_interval_s=config.poll_interval_s, stop_grace_s=config.stop_grace_s,
        hints_url=hints_url,
        gpu_type_speeds=({} if config.gpu_type_speeds is None
                         else parse_type_speeds(config.gpu_type_speeds, "--gpu-type-speeds")),
        teams=teams,
        team_accounts={} if teams is None else {
            team.name: team.slurm_account for team in teams if team.slurm_account}),
        autoscaler=autoscaler_for(config, backend.nodes()),
        on_round=recorder)
    service = SchedulerService(store, backend, allocator, config.data_dir, policy.name,
                               autoscaler=config.autoscaler, history=history,
                               metrics=metrics,
                               pruner=Pruner(store, config.data_dir, config.retention(),
                                             time.time,
                                             backup=lambda: backup(store, config.data_dir)))
    service.teams = teams
    return service


def service_metrics(store: JobStore, backend: Backend, history: History,
                    teams: Teams | None = None) -> ServiceMetrics | None:
    """This service's own Prometheus registry, or None without prometheus_client."""
    try:
        from pollux.service.http.metrics import ClusterCollector, ServiceMetrics, TeamCollector
    except ImportError:
        logger.warning("prometheus_client is not installed: no /metrics")
        return None
    metrics = ServiceMetrics()
    metrics.watch_cluster(ClusterCollector(lambda: store.list_jobs(ACTIVE_STATES),
                                           backend.nodes, time.time,
                                           count_by_state=store.count_by_state))
    metrics.watch_cluster(TeamCollector(lambda: store.list_jobs(ACTIVE_STATES), teams))
    return metrics

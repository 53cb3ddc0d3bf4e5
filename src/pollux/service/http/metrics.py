"""Prometheus metrics of one scheduler service (``GET /metrics``).

Each service owns its own :class:`CollectorRegistry` (never the process-global one), so
several services in one process (tests) do not collide. Gauges about jobs and slots are
read from the store at scrape time by :class:`ClusterCollector`; the round duration and
API request latency are histograms observed as they happen.

Names (all prefixed ``pollux_``):

- ``jobs{state}``: jobs in each state (every state listed, 0 included);
- ``slots{status}``: slots (GPUs, or CPU slots) ``allocated``/``free``, and
  ``slots_total``; ``gpus_allocated``/``gpus_free`` are the same counts under the
  names operators look for;
- ``job_replicas{job}``, ``job_restarts_total{job}``: per active job, in every scrape
  (what every user sees of every job, as ``squeue`` shows);
- ``job_goodput_samples_per_second{job}``, ``job_batch_size{job}``: per active job whose
  figures the requester may read (:class:`JobFiguresCollector`: the server's account and
  admins every job, a team admin its teams', a user its own), as ``/api/jobs`` shows them;
- ``team_quota_gpus{team}``, ``team_gpus_in_use{team}``, ``team_gpus_lent{team}``,
  ``team_gpus_borrowed{team}``, ``team_gpus_pending{team}``, ``team_jobs{team}``: per
  team (:mod:`pollux.service.http.team_usage`);
- ``policy_round_duration_seconds``: histogram of the policy's ``optimize`` wall time;
- ``api_request_duration_seconds{method,route,status}``: histogram of request latency,
  labelled by the route template (``/api/jobs/{ref}``), not the raw path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pollux.policies.base import NodeInfo
from pollux.service.http.team_usage import team_usage
from pollux.service.loop.telemetry import job_sample, slots_used_and_total
from pollux.service.storage.records import JobRecord
from pollux.service.storage.states import JobState
from pollux.teams import Teams

ROUND_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0, 30.0)
REQUEST_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                     2.5, 5.0)


class ClusterCollector(Collector):
    """Job and slot gauges computed from the store and the backend at each scrape."""

    def __init__(self, list_jobs: Callable[[], Sequence[JobRecord]],
                 list_nodes: Callable[[], Sequence[NodeInfo]],
                 clock: Callable[[], float],
                 count_by_state: Callable[[], Mapping[JobState, int]] | None = None) -> None:
        """``count_by_state``: the jobs in each state, counted by the store (then
        ``list_jobs`` need only list the active jobs; else counted from its list)."""
        self.list_jobs = list_jobs
        self.count_by_state = count_by_state
        self.list_nodes = list_nodes
        self.clock = clock

    def collect(self) -> Iterator[Metric]:
        records = self.list_jobs()
        nodes = self.list_nodes()
        now = self.clock()
        by_state = GaugeMetricFamily("pollux_jobs", "Jobs in each state", labels=["state"])
        counts = (None if self.count_by_state is None else self.count_by_state())
        for state in JobState:
            by_state.add_metric([state.value], sum(r.state is state for r in records)
                                if counts is None else counts.get(state, 0))
        yield by_state

        active = [r for r in records if not r.state.is_final]
        used, total = slots_used_and_total(active, nodes)
        slots = GaugeMetricFamily("pollux_slots", "Slots (GPUs or CPU slots) by status",
                                  labels=["status"])
        slots.add_metric(["allocated"], used)
        slots.add_metric(["free"], max(0, total - used))
        yield slots
        yield GaugeMetricFamily("pollux_slots_total", "Slots of every node", value=total)
        yield GaugeMetricFamily("pollux_gpus_allocated", "GPUs (slots) held by jobs",
                                value=used)
        yield GaugeMetricFamily("pollux_gpus_free", "GPUs (slots) held by no job",
                                value=max(0, total - used))
        yield GaugeMetricFamily("pollux_nodes", "Nodes of the cluster", value=len(nodes))

        replicas = GaugeMetricFamily("pollux_job_replicas", "Replicas running",
                                     labels=["job"])
        restarts = CounterMetricFamily("pollux_job_restarts", "Launches after the first "
                                       "(rescales, failures, server restarts)", labels=["job"])
        for record in active:
            replicas.add_metric([record.id], job_sample(record, now).replicas)
            restarts.add_metric([record.id], record.num_restarts)
        yield from (replicas, restarts)


class JobFiguresCollector:
    """Per-job goodput and batch size (what the job's own hints say), for one scrape of
    one requester: only of the jobs ``may_read`` admits. Not registered in the shared
    registry (whose collectors know no requester): :meth:`ServiceMetrics.exposition`
    renders it per scrape."""

    def __init__(self, list_jobs: Callable[[], Sequence[JobRecord]],
                 clock: Callable[[], float]) -> None:
        self.list_jobs = list_jobs
        self.clock = clock

    def collect(self, may_read: Callable[[JobRecord], bool]) -> list[Metric]:
        now = self.clock()
        goodput = GaugeMetricFamily("pollux_job_goodput_samples_per_second",
                                    "Goodput of the running configuration (useful "
                                    "samples/s), from the job's own model", labels=["job"])
        batch = GaugeMetricFamily("pollux_job_batch_size", "Total batch size the job "
                                  "reported", labels=["job"])
        for record in self.list_jobs():
            if record.state.is_final or not may_read(record):
                continue
            sample = job_sample(record, now)
            if sample.goodput is not None:
                goodput.add_metric([record.id], sample.goodput)
            if sample.batch_size is not None:
                batch.add_metric([record.id], sample.batch_size)
        return [goodput, batch]


class _Collected(Collector):
    """Metrics already collected, for one rendering."""

    def __init__(self, metrics: Sequence[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return iter(self.metrics)


TEAM_GAUGES = (
    ("quota_gpus", "pollux_team_quota_gpus", "GPUs guaranteed to the team (its quota)"),
    ("in_use_gpus", "pollux_team_gpus_in_use", "GPUs held by the team's jobs"),
    ("lent_gpus", "pollux_team_gpus_lent", "Idle quota of the team that others borrow"),
    ("borrowed_gpus", "pollux_team_gpus_borrowed", "GPUs the team holds beyond its quota"),
    ("pending_gpus", "pollux_team_gpus_pending", "GPUs the team's waiting jobs need to "
                                                 "start"),
    ("num_jobs", "pollux_team_jobs", "Active jobs of the team"),
)
"""Per-team gauges: (field of :class:`TeamUsage`, metric name, help)."""


class TeamCollector(Collector):
    """Per-team gauges computed from the active jobs and the teams file at each scrape."""

    def __init__(self, list_jobs: Callable[[], Sequence[JobRecord]],
                 teams: Teams | None) -> None:
        self.list_jobs = list_jobs
        self.teams = teams

    def collect(self) -> Iterator[Metric]:
        usage = team_usage(self.list_jobs(), self.teams)
        for field, name, help_text in TEAM_GAUGES:
            gauge = GaugeMetricFamily(name, help_text, labels=["team"])
            for team in usage:
                gauge.add_metric([team.team], float(getattr(team, field)))
            yield gauge


class ServiceMetrics:
    """The registry of one service and the histograms it observes into."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.round_duration = Histogram(
            "pollux_policy_round_duration_seconds", "Wall time of the policy's optimize "
            "call per scheduling round", buckets=ROUND_BUCKETS_S, registry=self.registry)
        self.request_duration = Histogram(
            "pollux_api_request_duration_seconds", "Latency of HTTP requests to the server",
            labelnames=("method", "route", "status"), buckets=REQUEST_BUCKETS_S,
            registry=self.registry)
        self.job_figures: JobFiguresCollector | None = None
        """The per-job figures only some requesters may read (None: none shown)."""

    def watch_cluster(self, collector: Collector) -> None:
        self.registry.register(collector)

    def exposition(self, may_read: Callable[[JobRecord], bool] = lambda record: True
                   ) -> bytes:
        """The registry in Prometheus' text format, then the per-job figures of the jobs
        ``may_read`` admits (default: every job)."""
        text = generate_latest(self.registry)
        if self.job_figures is None:
            return text
        figures = CollectorRegistry(auto_describe=False)
        figures.register(_Collected(self.job_figures.collect(may_read)))
        return text + generate_latest(figures)

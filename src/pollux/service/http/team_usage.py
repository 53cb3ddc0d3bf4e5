"""Each team's GPUs now: its quota, what its jobs hold, what it lends and borrows, and
what its waiting jobs ask for (``pollux teams``, ``GET /api/teams``, ``/metrics``).

* ``in_use_gpus``: GPUs held by the team's jobs (replicas x GPUs per replica);
* ``borrowed_gpus``: what it holds beyond its quota (``in_use - quota``, at least 0);
* ``lent_gpus``: the part of its idle quota (``quota - in_use``, at least 0) that other
  teams are borrowing: all teams' borrowed GPUs, shared among the lenders in proportion
  to their idle quota (so lent and borrowed GPUs add up to the same total);
* ``pending_gpus``: GPUs that its jobs waiting without replicas need to start (their
  minimum replicas x GPUs per replica).

A job without a team counts under :data:`~pollux.teams.DEFAULT_TEAM`; a team that has
jobs but is not in the teams file is listed with a quota of 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from pollux.capacity import RESOURCE_TOLERANCE
from pollux.policies.base import NodeInfo
from pollux.resources import DEFAULT_GPU_TYPE, GPU
from pollux.service.storage.records import JobRecord
from pollux.teams import DEFAULT_TEAM, Teams, load_teams

__all__ = ["TeamUsage", "load_service_teams", "team_usage"]


@dataclass(frozen=True)
class TeamUsage:
    team: str
    quota_gpus: int
    weight: float
    in_use_gpus: float
    lent_gpus: float
    borrowed_gpus: float
    pending_gpus: float
    num_jobs: int
    """Active jobs (not finished)."""
    slurm_account: str | None = None
    by_gpu_type: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """Where quotas are per GPU type: each type's ``quota_gpus``, ``in_use_gpus``,
    ``lent_gpus`` and ``borrowed_gpus`` (empty otherwise)."""

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _gpus(record: JobRecord, replicas: int) -> float:
    return float(record.spec.resources.gpu) * replicas


def team_usage(records: Sequence[JobRecord], teams: Teams | None) -> list[TeamUsage]:
    """The usage of every team of ``teams`` (in the file's order), then of the other
    teams the active ``records`` name (by name). Where the teams file gives quotas per
    GPU type, lending and borrowing are counted per type (a team holding more T4s than
    its T4 quota borrows T4s, whatever its A100 quota) and summed; ``by_gpu_type`` then
    holds the figures of each type."""
    typed = teams is not None and any(t != DEFAULT_GPU_TYPE for t in teams.gpu_types)
    in_use: dict[tuple[str, str], float] = {}
    pending: dict[str, float] = {}
    num_jobs: dict[str, int] = {}
    for record in records:
        if record.state.is_final:
            continue
        name = record.team or DEFAULT_TEAM
        num_jobs[name] = num_jobs.get(name, 0) + 1
        held = len(record.allocation) if record.state.has_replicas else 0
        kind = (record.gpu_type or DEFAULT_GPU_TYPE) if typed else DEFAULT_GPU_TYPE
        if held:
            in_use[name, kind] = in_use.get((name, kind), 0.0) + _gpus(record, held)
        else:
            pending[name] = pending.get(name, 0.0) + _gpus(record, record.spec.min_replicas)
    listed = (teams or Teams(())).with_teams_named(sorted(num_jobs))
    names = listed.names
    kinds = sorted({kind for _, kind in in_use} | set(listed.gpu_types if typed else ())
                   | {DEFAULT_GPU_TYPE})

    def quota(name: str, kind: str) -> float:
        return float(listed[name].quota(kind) if typed else listed[name].total_quota_gpus)

    figures: dict[tuple[str, str], dict[str, float]] = {}
    for kind in kinds:
        holding = {name: in_use.get((name, kind), 0.0) for name in names}
        borrowed = {name: max(0.0, holding[name] - quota(name, kind)) for name in names}
        idle = {name: max(0.0, quota(name, kind) - holding[name]) for name in names}
        total_borrowed, total_idle = sum(borrowed.values()), sum(idle.values())
        for name in names:
            lent = (0.0 if total_idle <= 0 else
                    min(idle[name], total_borrowed * idle[name] / total_idle))
            figures[name, kind] = {"quota_gpus": quota(name, kind), "in_use_gpus": holding[name],
                                   "lent_gpus": lent, "borrowed_gpus": borrowed[name]}
    usage = []
    for team in listed:
        mine = {kind: figures[team.name, kind] for kind in kinds}
        total = {key: sum(f[key] for f in mine.values()) for key in
                 ("in_use_gpus", "lent_gpus", "borrowed_gpus")}
        usage.append(TeamUsage(
            team=team.name, quota_gpus=team.total_quota_gpus, weight=team.weight, **total,
            pending_gpus=pending.get(team.name, 0.0), num_jobs=num_jobs.get(team.name, 0),
            slurm_account=team.slurm_account,
            by_gpu_type={kind: dict(f) for kind, f in mine.items()
                         if any(f.values())} if typed else {}))
    return usage


def load_service_teams(path: str, nodes: Sequence[NodeInfo], check_cluster: bool) -> Teams:
    """The teams file of a server; with ``check_cluster`` its quotas are checked against
    ``nodes`` (the local backend's: other backends' clusters change size)."""
    cluster: dict[str, int] = {}
    for node in nodes:
        cluster[node.gpu_type] = cluster.get(node.gpu_type, 0) + int(
            node.resources.get(GPU, 0.0) + RESOURCE_TOLERANCE)
    return load_teams(path, cluster if check_cluster else None)

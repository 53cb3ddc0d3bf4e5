"""Teams: the YAML file that the simulator and the service share, with each team's GPU
quota, its weight and (for Slurm) its account.

```yaml
teams:
  vision: {quota_gpus: 24, weight: 1}
  nlp:    {quota_gpus: 32, weight: 2, slurm_account: nlp-lab}
```

On a typed cluster a quota is given per GPU type (``quota_gpus: {a100: 8, t4: 16}``); on
an untyped one it is a number. A team's quota is guaranteed while it has demand; what a
team leaves idle is lent to the others, and what lies beyond all quotas is shared in
proportion to the weights (the policies implement that; this module only reads, checks
and describes the file). A job without a team is in :data:`DEFAULT_TEAM`.

Like :mod:`pollux.cluster_spec`, this module sits below every layer that uses it: it
imports only the standard library, ``yaml`` and Pollux's neutral modules.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from pollux.cluster_spec import ClusterSpec
from pollux.errors import ConfigError
from pollux.resources import DEFAULT_GPU_TYPE

__all__ = [
    "DEFAULT_TEAM", "MAX_PRIORITY", "MIN_PRIORITY", "TEAMS_FIELD", "TEAM_FIELDS", "Team", "Teams", "cluster_gpus",
    "load_teams", "parse_teams",
]

DEFAULT_TEAM = "default"
"""The team of a job that names none (and of every job of a workload without teams)."""
MIN_PRIORITY, MAX_PRIORITY = -100, 100
"""The bounds of a job's ``priority`` within its team (a whole number; default 0)."""
TEAMS_FIELD = "teams"
"""The file's one top-level key, and the prefix of every field an error names."""
TEAM_FIELDS: tuple[str, ...] = ("quota_gpus", "weight", "slurm_account")
"""The keys a team may have."""
EXAMPLE = "teams: {vision: {quota_gpus: 24, weight: 1}, nlp: {quota_gpus: 32, weight: 2}}"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_SLURM_ACCOUNT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MAX_TEAMS = 1000


@dataclass(frozen=True)
class Team:
    """One team of the file."""

    name: str
    quota_gpus: Mapping[str, int]
    """GPUs guaranteed per GPU type while the team has demand (an untyped cluster has
    the one type :data:`~pollux.resources.DEFAULT_GPU_TYPE`); a type absent: 0."""
    weight: float = 1.0
    """Share of what lies beyond the quotas, relative to the other teams' weights."""
    slurm_account: str | None = None
    """The Slurm account its jobs' launches are charged to; None: the server's default."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "quota_gpus", MappingProxyType(dict(self.quota_gpus)))

    def __reduce__(self) -> tuple[type[Team], tuple[str, dict[str, int], float, str | None]]:
        return (Team, (self.name, dict(self.quota_gpus), self.weight, self.slurm_account))

    def quota(self, gpu_type: str = DEFAULT_GPU_TYPE) -> int:
        """The team's quota of ``gpu_type`` GPUs (0 where it has none)."""
        return int(self.quota_gpus.get(gpu_type, 0))

    @property
    def total_quota_gpus(self) -> int:
        """The team's quota over all GPU types."""
        return sum(self.quota_gpus.values())

    def to_dict(self) -> dict[str, Any]:
        """The team as its file would write it (a number where the quota is untyped)."""
        quota: int | dict[str, int] = dict(self.quota_gpus)
        if set(self.quota_gpus) <= {DEFAULT_GPU_TYPE}:
            quota = self.quota()
        data: dict[str, Any] = {"quota_gpus": quota, "weight": self.weight}
        if self.slurm_account is not None:
            data["slurm_account"] = self.slurm_account
        return data


@dataclass(frozen=True)
class Teams:
    """The teams of a file, in the file's order."""

    teams: tuple[Team, ...]

    def __post_init__(self) -> None:
        names = [team.name for team in self.teams]
        if len(set(names)) != len(names):
            raise ConfigError(TEAMS_FIELD, names, "each team appears once")

    def __iter__(self) -> Iterator[Team]:
        return iter(self.teams)

    def __len__(self) -> int:
        return len(self.teams)

    def __contains__(self, name: object) -> bool:
        return any(team.name == name for team in self.teams)

    def __getitem__(self, name: str) -> Team:
        for team in self.teams:
            if team.name == name:
                return team
        raise KeyError(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(team.name for team in self.teams)

    @property
    def gpu_types(self) -> tuple[str, ...]:
        """The GPU types any quota names, in order of first appearance."""
        seen: dict[str, None] = {}
        for team in self.teams:
            seen.update(dict.fromkeys(team.quota_gpus))
        return tuple(seen)

    def total_quota(self, gpu_type: str = DEFAULT_GPU_TYPE) -> int:
        """The quotas of ``gpu_type`` summed over the teams."""
        return sum(team.quota(gpu_type) for team in self.teams)

    def with_teams_named(self, names: Iterable[str]) -> Teams:
        """These teams and, after them in the order given, a team of no quota (weight 1)
        for each of ``names`` that is not one of them (a job's team missing from the
        file: a team since removed, or jobs stored before the file was given)."""
        missing = [name for name in dict.fromkeys(names) if name not in self]
        return Teams(self.teams + tuple(Team(name, {}) for name in missing)) if missing else self

    def team_of(self, name: str | None, field: str = "team") -> Team:
        """The team a job names (None or empty: :data:`DEFAULT_TEAM`); an unknown name is
        refused with the choices."""
        key = name or DEFAULT_TEAM
        if key not in self:
            raise ConfigError(field, key, f"not a team of the teams file; choose from: "
                              f"{', '.join(self.names)}" + (
                                  f" (jobs without a team are in {DEFAULT_TEAM!r}: add it "
                                  "to the file, or give each job a team)"
                                  if key == DEFAULT_TEAM else ""))
        return self[key]

    def check_cluster(self, cluster: ClusterSpec | Mapping[str, int]) -> None:
        """Refuse quotas the cluster cannot hold: a GPU type it lacks, a number where it
        has types (or a per-type quota where it has none), or quotas of a type that sum
        above its GPUs."""
        capacity = cluster_gpus(cluster)
        typed = set(capacity) != {DEFAULT_GPU_TYPE}
        for team in self.teams:
            field = f"{TEAMS_FIELD}.{team.name}.quota_gpus"
            untyped_quota = set(team.quota_gpus) <= {DEFAULT_GPU_TYPE}
            if typed and untyped_quota and team.total_quota_gpus > 0:
                raise ConfigError(field, team.quota(), "the cluster has GPU types ("
                                  f"{', '.join(capacity)}): give a quota per type, e.g. "
                                  f"{{{', '.join(f'{t}: 0' for t in capacity)}}}")
            if not typed and not untyped_quota:
                raise ConfigError(field, dict(team.quota_gpus), "the cluster has no GPU "
                                  "types: give one number of GPUs, e.g. quota_gpus: 8")
            for gpu_type in team.quota_gpus:
                if gpu_type not in capacity and team.quota_gpus[gpu_type] > 0:
                    raise ConfigError(f"{field}.{gpu_type}", team.quota_gpus[gpu_type],
                                      f"the cluster has no GPU type {gpu_type!r}; its types "
                                      f"are: {', '.join(capacity)}")
        for gpu_type, num_gpus in capacity.items():
            total = self.total_quota(gpu_type)
            if total > num_gpus:
                where = "" if gpu_type == DEFAULT_GPU_TYPE else f" of type {gpu_type!r}"
                parts = ", ".join(f"{team.name} {team.quota(gpu_type)}" for team in self.teams
                                  if team.quota(gpu_type))
                raise ConfigError(f"{TEAMS_FIELD}.*.quota_gpus", total,
                                  f"the quotas{where} sum to {total} GPUs ({parts}) but the "
                                  f"cluster has {num_gpus}: lower them to fit")

    def to_dict(self) -> dict[str, Any]:
        """The file's content (``yaml.safe_dump(..., sort_keys=False)`` of it reads back as these
        teams, in their order)."""
        return {TEAMS_FIELD: {team.name: team.to_dict() for team in self.teams}}


def cluster_gpus(cluster: ClusterSpec | Mapping[str, int]) -> dict[str, int]:
    """GPUs per type of a cluster spec (or of a mapping that already says so)."""
    if isinstance(cluster, ClusterSpec):
        capacity: dict[str, int] = {}
        for group in cluster.groups:
            capacity[group.gpu_type] = capacity.get(group.gpu_type, 0) + group.num_gpus
        return capacity
    return {str(gpu_type): int(num) for gpu_type, num in cluster.items()}


def load_teams(path: str | Path, cluster: ClusterSpec | Mapping[str, int] | None = None,
               field: str = "teams_file") -> Teams:
    """Read and check a teams file (see :func:`parse_teams`); a file that cannot be read
    or is not YAML is refused naming the path."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(field, str(path), f"cannot read the teams file ({exc}); give "
                          "the path of a YAML file") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(field, str(path), f"not valid YAML ({exc}); the file reads "
                          f"like: {EXAMPLE}") from exc
    return parse_teams(data, cluster=cluster)


def parse_teams(data: object, cluster: ClusterSpec | Mapping[str, int] | None = None) -> Teams:
    """Teams from a file's parsed content; with ``cluster`` also checked against it
    (:meth:`Teams.check_cluster`). Every error names the field (``teams.nlp.weight``) and
    the fix. A quota is a whole number of GPUs >= 0 (or a mapping GPU type -> number);
    a weight a finite number > 0 (default 1); unknown keys are refused."""
    if not isinstance(data, Mapping) or set(data) != {TEAMS_FIELD}:
        keys = sorted(map(str, data)) if isinstance(data, Mapping) else type(data).__name__
        raise ConfigError(TEAMS_FIELD, keys, f"the file has one key, 'teams', mapping each "
                          f"team's name to its fields, e.g. {EXAMPLE}")
    body = data[TEAMS_FIELD]
    if not isinstance(body, Mapping) or not body:
        raise ConfigError(TEAMS_FIELD, body, f"map each team's name to its fields, e.g. "
                          f"{EXAMPLE}")
    if len(body) > MAX_TEAMS:
        raise ConfigError(TEAMS_FIELD, len(body), f"at most {MAX_TEAMS} teams")
    teams = Teams(tuple(_team(name, fields) for name, fields in body.items()))
    if cluster is not None:
        teams.check_cluster(cluster)
    return teams


def _team(name: object, fields: object) -> Team:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(f"{TEAMS_FIELD}.{name}", name, "a team's name is 1-64 letters, "
                          "digits, '.', '_' or '-', starting with a letter or digit")
    prefix = f"{TEAMS_FIELD}.{name}"
    if fields is None:
        fields = {}
    if not isinstance(fields, Mapping):
        raise ConfigError(prefix, fields, "give the team's fields as a mapping, e.g. "
                          "{quota_gpus: 8, weight: 1}")
    unknown = sorted(str(key) for key in fields if key not in TEAM_FIELDS)
    if unknown:
        raise ConfigError(f"{prefix}.{unknown[0]}", fields[unknown[0]],
                          f"not a team field; a team has: {', '.join(TEAM_FIELDS)}")
    return Team(name=name, quota_gpus=_quota(prefix, fields.get("quota_gpus", 0)),
                weight=_weight(prefix, fields.get("weight", 1)),
                slurm_account=_account(prefix, fields.get("slurm_account")))


def _gpu_count(field: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(field, value, "a quota is a whole number of GPUs >= 0")
    return value


def _quota(prefix: str, value: object) -> Mapping[str, int]:
    field = f"{prefix}.quota_gpus"
    if isinstance(value, Mapping):
        quota: dict[str, int] = {}
        for gpu_type, num in value.items():
            if not isinstance(gpu_type, str) or not _NAME.match(gpu_type):
                raise ConfigError(f"{field}.{gpu_type}", gpu_type, "a GPU type is a name "
                                  "of the cluster's, e.g. quota_gpus: {a100: 8, t4: 16}")
            quota[gpu_type] = _gpu_count(f"{field}.{gpu_type}", num)
        return MappingProxyType(quota)
    return MappingProxyType({DEFAULT_GPU_TYPE: _gpu_count(field, value)})


def _weight(prefix: str, value: object) -> float:
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or value <= 0):
        raise ConfigError(f"{prefix}.weight", value, "a weight is a finite number > 0 "
                          "(its share beyond the quotas, relative to the other teams')")
    return float(value)


def _account(prefix: str, value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _SLURM_ACCOUNT.match(value):
        raise ConfigError(f"{prefix}.slurm_account", value, "a Slurm account is 1-64 "
                          "letters, digits, '.', '_' or '-'")
    return value

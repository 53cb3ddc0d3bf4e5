"""What the job store holds, as frozen records, and how a stored job row reads back."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from pollux.errors import ConfigError
from pollux.job_spec import JobSpec
from pollux.models.hints import JobHints
from pollux.service.storage.states import JobState


@dataclass(frozen=True)
class JobRecord:
    """One job as stored."""

    id: str
    seq: int
    spec: JobSpec
    state: JobState
    reason: str | None
    allocation: tuple[str, ...]
    """Node of each replica of the current (or last) launch."""
    target_allocation: tuple[str, ...] | None
    """The policy's latest decision when it differs from ``allocation``, until applied."""
    num_launches: int
    num_failures: int
    num_rescales: int
    cancel_requested: bool
    hints: Mapping[str, Any] | None
    hints_updated_at: float | None
    hints_token: str
    attained_service_s: float
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    updated_at: float
    gpu_type: str | None = None
    """GPU type of the current (or last) launch's nodes; None before any launch or on a
    cluster without declared types."""

    @cached_property
    def parsed_hints(self) -> JobHints | None:
        """The hints as :class:`JobHints`; None without hints or when they do not parse
        (computed once per record: a record never changes)."""
        if self.hints is None:
            return None
        try:
            return JobHints.from_dict(dict(self.hints))
        except ConfigError:
            return None

    @property
    def num_restarts(self) -> int:
        """Launches after the first one (rescales, failures, server restarts)."""
        return max(0, self.num_launches - 1)


@dataclass(frozen=True)
class ReplicaRecord:
    """One replica started by one launch (generation) of a job."""

    job_id: str
    generation: int
    rank: int
    node: str
    handle: Mapping[str, Any]
    """Backend-specific, JSON-serializable (local: pid, process group, start time)."""
    started_at: float
    exit_code: int | None
    exited_at: float | None

    @property
    def is_intent(self) -> bool:
        """Recorded before its launch started it and not confirmed by the backend since
        (the server may have died in between: the replica may or may not run)."""
        return bool(self.handle.get("intent"))


@dataclass(frozen=True)
class JobEvent:
    job_id: str
    time: float
    kind: str
    message: str
    repeats: int = 0
    """How many more times the same event happened since (coalesced into this one)."""
    last_time: float | None = None
    """When it last happened (None unless repeated)."""


JOB_COLUMNS = ("id", "seq", "spec", "state", "reason", "allocation", "target_allocation",
               "num_launches", "num_failures", "num_rescales", "cancel_requested", "hints",
               "hints_updated_at", "hints_token", "attained_service_s", "submitted_at",
               "started_at", "finished_at", "updated_at", "gpu_type")
UPDATABLE_COLUMNS = frozenset(JOB_COLUMNS) - {"id", "seq", "spec", "state", "hints_token",
                                              "submitted_at"}


def job_from_row(row: Sequence[Any]) -> JobRecord:
    data = dict(zip(JOB_COLUMNS, row))
    target = data["target_allocation"]
    return JobRecord(
        id=data["id"], seq=data["seq"], spec=JobSpec.from_dict(json.loads(data["spec"])),
        state=JobState(data["state"]), reason=data["reason"],
        allocation=tuple(json.loads(data["allocation"])),
        target_allocation=None if target is None else tuple(json.loads(target)),
        num_launches=data["num_launches"], num_failures=data["num_failures"],
        num_rescales=data["num_rescales"], cancel_requested=bool(data["cancel_requested"]),
        hints=None if data["hints"] is None else json.loads(data["hints"]),
        hints_updated_at=data["hints_updated_at"], hints_token=data["hints_token"],
        attained_service_s=data["attained_service_s"], submitted_at=data["submitted_at"],
        started_at=data["started_at"], finished_at=data["finished_at"],
        updated_at=data["updated_at"], gpu_type=data["gpu_type"])


def encode_column(column: str, value: Any) -> Any:
    if column in ("allocation", "target_allocation"):
        return None if value is None else json.dumps(list(value))
    if column == "hints":
        return None if value is None else json.dumps(value)
    if column == "cancel_requested":
        return int(bool(value))
    return value

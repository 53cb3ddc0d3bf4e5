"""What the job store holds, as frozen records, and how a stored job row reads back
(parsed once: :class:`JobDecoder`) and is written (serialized once: :func:`encode_column`)."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pollux.errors import ConfigError
from pollux.job_spec import JobSpec
from pollux.models.hints import JobHints
from pollux.service.storage.states import JobState

logger = logging.getLogger(__name__)


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
    hints: JobHints | None
    """What its agent last reported, parsed; None before any report or when the stored
    hints no longer parse (see :func:`decode_hints`)."""
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
    hints_problem: str | None = None
    """Why the stored hints are not used (they no longer parse), naming the field; None
    when they are used or there are none."""
    owner: str | None = None
    """The registered user who submitted it; None: the server's own account (a job
    submitted with the server token, or stored before users were configured)."""
    team: str | None = None
    """The team it runs in (one of its owner's teams); None: no team."""

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
               "started_at", "finished_at", "updated_at", "gpu_type", "owner", "team")
UPDATABLE_COLUMNS = frozenset(JOB_COLUMNS) - {"id", "seq", "spec", "state", "hints_token",
                                              "submitted_at", "owner", "team"}


DECODED_JOBS_KEPT = 50_000
"""Jobs whose parsed spec and hints :class:`JobDecoder` keeps at most (it starts over
when full)."""


class JobDecoder:
    """Stored job rows as records, each job's spec and hints parsed once.

    A spec is parsed when the API receives it (or at the job's first read), hints when
    posted (or at the first read of their stored text); a row changes every round but its
    record reuses the parsed objects, so the model built from the hints is built once per
    hints version for all its readers.

    **Stored hints that do not parse** (written by an older version, or a damaged row):
    the job reads as one without hints (as before its first report), its record says why
    in ``hints_problem`` (naming the field), one warning is logged per job and hints
    version, and the allocation loop adds one event per job and hints version
    (:func:`pollux.service.loop.snapshot.hints_problems`). Nothing raises: every reader sees
    ``hints=None``. A spec or a state that does not read back raises (a damaged record).
    Thread-safe."""

    def __init__(self, max_jobs: int = DECODED_JOBS_KEPT) -> None:
        self.max_jobs = max_jobs
        self._lock = threading.Lock()
        self._specs: dict[str, tuple[str, JobSpec]] = {}
        self._hints: dict[str, tuple[str, JobHints | None, str | None]] = {}

    def record(self, row: Sequence[Any]) -> JobRecord:
        """``row`` (of :data:`JOB_COLUMNS`) as a record; raises ValueError, TypeError,
        KeyError or JobSpecError when its spec, state or allocation do not read back."""
        data = dict(zip(JOB_COLUMNS, row))
        target = data["target_allocation"]
        hints, problem = self.hints(data["id"], data["hints"])
        return JobRecord(
            id=data["id"], seq=data["seq"], spec=self.spec(data["id"], data["spec"]),
            state=JobState(data["state"]), reason=data["reason"],
            allocation=tuple(json.loads(data["allocation"])),
            target_allocation=None if target is None else tuple(json.loads(target)),
            num_launches=data["num_launches"], num_failures=data["num_failures"],
            num_rescales=data["num_rescales"], cancel_requested=bool(data["cancel_requested"]),
            hints=hints, hints_updated_at=data["hints_updated_at"],
            hints_token=data["hints_token"], attained_service_s=data["attained_service_s"],
            submitted_at=data["submitted_at"], started_at=data["started_at"],
            finished_at=data["finished_at"], updated_at=data["updated_at"],
            gpu_type=data["gpu_type"], hints_problem=problem, owner=data["owner"],
            team=data["team"])

    def remember_spec(self, job_id: str, text: str, spec: JobSpec) -> None:
        """``text`` (as stored) is ``spec``: a read of it needs no parse."""
        with self._lock:
            self._keep(self._specs)[job_id] = (text, spec)

    def remember_hints(self, job_id: str, text: str, hints: JobHints) -> None:
        """``text`` (as stored) is ``hints``: a read of it needs no parse, and the record
        shares the hints object (and its model) the API parsed."""
        with self._lock:
            self._keep(self._hints)[job_id] = (text, hints, None)

    def spec(self, job_id: str, text: str) -> JobSpec:
        with self._lock:
            cached = self._specs.get(job_id)
        if cached is not None and cached[0] == text:
            return cached[1]
        spec = JobSpec.from_dict(json.loads(text))
        with self._lock:
            self._keep(self._specs)[job_id] = (text, spec)
        return spec

    def hints(self, job_id: str, text: str | None) -> tuple[JobHints | None, str | None]:
        """The job's stored hints and, when they do not parse, why (see the class)."""
        if text is None:
            return None, None
        with self._lock:
            cached = self._hints.get(job_id)
            if cached is not None and cached[0] == text:
                return cached[1], cached[2]
            hints, problem = decode_hints(text)
            self._keep(self._hints)[job_id] = (text, hints, problem)
        if problem is not None:
            logger.warning("job %s: stored hints not used (%s); it is scheduled as a job "
                           "without hints until it posts new ones", job_id, problem)
        return hints, problem

    def _keep(self, entries: dict[str, Any]) -> dict[str, Any]:
        if len(entries) >= self.max_jobs:
            entries.clear()
        return entries


def decode_hints(text: str) -> tuple[JobHints | None, str | None]:
    """Stored hints JSON as (hints, None), or (None, why not) naming the field."""
    try:
        return JobHints.from_dict(json.loads(text)), None
    except ConfigError as exc:
        return None, f"its stored hints do not parse: field {exc.field}: {exc.fix}"
    except json.JSONDecodeError as exc:
        return None, f"its stored hints are not valid JSON: field hints: {exc.msg}"
    except (ValueError, TypeError, ArithmeticError, AttributeError, RecursionError) as exc:
        return None, f"its stored hints do not parse: field hints: {type(exc).__name__}"


def encode_column(column: str, value: Any) -> Any:
    if column in ("allocation", "target_allocation"):
        return None if value is None else json.dumps(list(value))
    if column == "hints":
        return None if value is None else encode_hints(value)
    if column == "cancel_requested":
        return int(bool(value))
    return value


def encode_hints(hints: JobHints) -> str:
    """Hints as stored: their JSON (the one serialization; :func:`decode_hints` reads it)."""
    return json.dumps(hints.to_dict(), allow_nan=False)

"""JSON views of jobs and nodes for the API (and so for the CLI)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from pollux.policies.base import NodeInfo
from pollux.resources import DEFAULT_GPU_TYPE
from pollux.service.loop.snapshot import held_allocation
from pollux.service.loop.telemetry import running_goodput
from pollux.service.storage.records import JobEvent, JobRecord, ReplicaRecord

logger = logging.getLogger(__name__)


def job_summary(record: JobRecord, now: float, recovering: bool = False) -> dict[str, Any]:
    """One row of ``pollux ls``; ``recovering``: a restarted server is still stopping the
    replicas its predecessor left (the state is the one recorded before the restart)."""
    hints = record.hints
    running = record.allocation if record.state.has_replicas else ()
    return {
        "id": record.id,
        "name": record.spec.name,
        "owner": record.owner,
        "team": record.team,
        "state": record.state.value,
        "recovering": recovering,
        "reason": record.reason,
        "replicas": len(running),
        "nodes": len(set(running)),
        "allocation": list(running),
        "gpu_type": record.gpu_type,
        "target_allocation": (None if record.target_allocation is None
                              else list(record.target_allocation)),
        "batch_size": None if hints is None else hints.batch_size,
        "epoch": None if hints is None else hints.epoch,
        "goodput": running_goodput(record),
        "restarts": record.num_restarts,
        "failures": record.num_failures,
        "rescales": record.num_rescales,
        "cancel_requested": record.cancel_requested,
        "submitted_at": record.submitted_at,
        "started_at": record.started_at,
        "finished_at": record.finished_at,
        "age_s": max(0.0, now - record.submitted_at),
        "run_time_s": (None if record.started_at is None else
                       max(0.0, (record.finished_at or now) - record.started_at)),
    }


def job_detail(record: JobRecord, now: float, events: Sequence[JobEvent],
               replicas: Sequence[ReplicaRecord], recovering: bool = False) -> dict[str, Any]:
    """Everything ``pollux describe`` shows."""
    detail = job_summary(record, now, recovering)
    detail.update({
        "spec": record.spec.to_dict(),
        "attained_service_s": record.attained_service_s,
        "launches": record.num_launches,
        "hints": None if record.hints is None else record.hints.to_dict(),
        "hints_updated_at": record.hints_updated_at,
        "events": [{"time": e.time, "kind": e.kind, "message": event_message(e)}
                   for e in events],
        "replicas_of_launch": [
            {"rank": r.rank, "node": r.node, "generation": r.generation,
             "started_at": r.started_at, "exit_code": r.exit_code, "exited_at": r.exited_at,
             **slurm_ids(r)}
            for r in replicas if r.generation == record.num_launches],
    })
    launches = {r.generation: slurm_ids(r) for r in replicas if slurm_ids(r)}
    if launches:  # the slurm backend's work: each launch's Slurm job id
        detail["slurm_job_id"] = launches.get(record.num_launches, {}).get("slurm_job_id")
        detail["slurm_launches"] = [{"generation": g, **ids} for g, ids in sorted(launches.items())]
    return detail


def event_message(event: JobEvent) -> str:
    """An event's message, saying how often it repeated (coalesced) and when last."""
    if not event.repeats or event.last_time is None:
        return event.message
    last = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(event.last_time))
    times = "once more" if event.repeats == 1 else f"{event.repeats} more times"
    return f"{event.message} (repeated {times}, last at {last} UTC)"


def slurm_ids(replica: ReplicaRecord) -> dict[str, Any]:
    """The Slurm job id (and step name) of a replica the slurm backend launched; {} for
    the other backends' replicas."""
    job_id = replica.handle.get("slurm_job_id") if replica.handle else None
    if job_id is None:
        return {}
    return {"slurm_job_id": str(job_id), "slurm_step": replica.handle.get("slurm_step")}


def node_views(nodes: Sequence[NodeInfo], records: Sequence[JobRecord]) -> list[dict[str, Any]]:
    """Nodes with their GPU type (None when undeclared) and the replicas each job holds
    (or was promised) on them."""
    views = []
    for node in nodes:
        jobs = {}
        for record in records:
            count = held_allocation(record).count(node.name)
            if count and not record.state.is_final:
                jobs[record.id] = count
        views.append({"name": node.name, "resources": dict(node.resources),
                      "gpu_type": None if node.gpu_type == DEFAULT_GPU_TYPE else node.gpu_type,
                      "preemptible": node.preemptible, "jobs": jobs})
    return views

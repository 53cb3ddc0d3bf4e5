"""What a restarted server does about the Slurm work its predecessor left.

In cluster mode, a launch whose Slurm job still runs is adopted (:func:`adoptable`): the
new server watches, rescales and ends it as its own, and the replicas never notice the
restart. Everything else is stopped: the work is found by name (every piece is named after the data directory's instance,
:func:`pollux.backends.slurm.script.work_prefix`) and by the Slurm job ids the job
store recorded, so work submitted just before a crash, never recorded, is found too. It
is asked to checkpoint and stop (SIGTERM to every replica; work not started yet is
withdrawn), and whatever still runs after the grace is killed: the service then resumes
each job from its checkpoint in one new launch, never beside the old one. Each replica's
real exit status is in the file its wrapper wrote.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from pollux.backends.base import LiveReplica
from pollux.backends.slurm.commands import SlurmCommands, SlurmUnavailable
from pollux.backends.slurm.launches import ALLOCATION, CLUSTER, SlurmLaunch, SlurmReplica
from pollux.backends.slurm.states import Phase, UnknownSlurmState, job_state
from pollux.errors import BackendError

logger = logging.getLogger(__name__)

REACH_TIMEOUT_S = 120.0
"""How long recovery keeps trying to reach Slurm before giving up."""
KILL_WAIT_S = 30.0
WAIT_INTERVAL_S = 0.5


def _phase(job: Mapping[str, Any]) -> Phase:
    try:
        return job_state(job.get("job_state")).phase
    except UnknownSlurmState:
        return Phase.RUNNING  # unknown: treat as live, so it is stopped


def _reach(read: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + REACH_TIMEOUT_S
    while True:
        try:
            return read()
        except SlurmUnavailable as exc:
            if time.monotonic() > deadline:
                raise BackendError(f"cannot reach Slurm to find the previous server's work "
                                   f"({exc})") from exc
            logger.warning("recovery: Slurm unreachable (%s); retrying", exc)
            time.sleep(2.0)


def _wait(still_live: Callable[[], set[str]], timeout_s: float) -> set[str]:
    deadline = time.monotonic() + timeout_s
    live = still_live()
    while live and time.monotonic() < deadline:
        time.sleep(WAIT_INTERVAL_S)
        live = still_live()
    return live


def adoptable(commands: SlurmCommands, instance_id: str, replicas: Sequence[LiveReplica],
              allocation: str | None = None) -> list[SlurmLaunch]:
    """The launches among ``replicas`` that a new server process can take over, rebuilt
    from what the job store recorded. A job's launch is adopted whole or not at all:
    every replica recorded by this data directory's instance, ranks 0..n-1 of one
    launch; in cluster mode (``allocation`` None) one Slurm job that Slurm lists RUNNING
    under the recorded name and never requeued; in allocation mode steps of
    ``allocation`` that all still run. Slurm unreachable: nothing is adopted (the work is
    stopped and resumed instead, as before)."""
    mode = CLUSTER if allocation is None else ALLOCATION
    by_job: dict[str, list[LiveReplica]] = {}
    for replica in replicas:
        by_job.setdefault(replica.job_id, []).append(replica)
    candidates: dict[str, tuple[str, list[LiveReplica]]] = {}
    for job_id, found in by_job.items():
        found.sort(key=lambda r: r.rank)
        handles = [r.handle for r in found]
        ids = {str(h.get("slurm_job_id")) for h in handles}
        if (len(ids) == 1 and [r.rank for r in found] == list(range(len(found)))
                and len({r.generation for r in found}) == 1
                and len({h.get("slurm_job_name") for h in handles}) == 1
                and (allocation is None or ids == {allocation})
                and all(h.get("backend") == "slurm" and h.get("instance") == instance_id
                        and h.get("mode") == mode and h.get("status_file")
                        and h.get("slurm_step") for h in handles)):
            candidates[job_id] = (ids.pop(), found)
    if not candidates:
        return []
    try:
        if allocation is None:
            entries = {str(j.get("job_id")): j
                       for j in commands.jobs(sorted({sid for sid, _ in candidates.values()}))}
        else:
            steps = commands.steps(allocation)
    except BackendError as exc:
        logger.warning("recovery: cannot read Slurm to adopt the previous server's work "
                       "(%s); it is stopped and resumed instead", exc)
        return []
    launches = []
    for job_id, (slurm_id, found) in sorted(candidates.items()):
        name = str(found[0].handle["slurm_job_name"])
        if allocation is None:
            running = _runs_as(entries.get(slurm_id), name)
        else:
            running = all(str(r.handle["slurm_step"]) in steps for r in found)
        if running:
            launches.append(SlurmLaunch(
                job_id, found[0].generation, name, mode, slurm_id,
                [SlurmReplica(r.rank, r.node, str(r.handle["slurm_step"]),
                              Path(str(r.handle["status_file"]))) for r in found],
                submitted_at=time.monotonic(), adopted=True))
    return launches


def _runs_as(entry: Mapping[str, Any] | None, name: str) -> bool:
    """Whether ``squeue``'s ``entry`` is a job named ``name`` running, never requeued."""
    try:
        return (entry is not None and str(entry.get("name")) == name
                and job_state(entry.get("job_state")).phase is Phase.RUNNING
                and int(entry.get("restart_cnt") or 0) == 0)
    except (UnknownSlurmState, TypeError, ValueError):
        return False


def recover_cluster(commands: SlurmCommands, prefix: str, job_ids: Collection[str],
                    grace_s: float, keep: Collection[str] = ()) -> list[str]:
    """Stop the live Slurm jobs named ``prefix...`` or listed in ``job_ids``, except the
    adopted ones in ``keep``."""

    def ours() -> dict[str, dict[str, Any]]:
        jobs = _reach(commands.jobs)
        return {str(j.get("job_id")): j for j in jobs
                if (str(j.get("name", "")).startswith(prefix) or str(j.get("job_id")) in job_ids)
                and str(j.get("job_id")) not in keep}

    found = ours()
    live = {jid: job for jid, job in found.items() if _phase(job) is not Phase.ENDED}
    for jid, job in live.items():
        phase = _phase(job)
        try:
            if phase in (Phase.WAITING, Phase.REQUEUED):
                commands.cancel(jid)
            elif phase is Phase.RUNNING:
                commands.signal(jid, "TERM")
        except BackendError as exc:
            logger.warning("recovery: cannot signal Slurm job %s: %s", jid, exc)

    def still_live() -> set[str]:
        now = ours()
        return {jid for jid in live if jid in now and _phase(now[jid]) is not Phase.ENDED}

    survivors = _wait(still_live, grace_s)
    for jid in survivors:
        try:
            commands.signal(jid, "KILL", full=True)
            commands.cancel(jid)
        except BackendError as exc:
            logger.warning("recovery: cannot cancel Slurm job %s: %s", jid, exc)
    left = _wait(still_live, KILL_WAIT_S) if survivors else set()
    if left:
        logger.error("recovery: Slurm jobs %s did not end", ", ".join(sorted(left)))
    return [f"Slurm job {jid} ({live[jid].get('name')})" for jid in sorted(live, key=int)]


def recover_allocation(commands: SlurmCommands, allocation: str, prefix: str,
                       grace_s: float, keep: Collection[str] = ()) -> list[str]:
    """Stop the steps of ``allocation`` named ``prefix...``, except the adopted ones
    named in ``keep``."""

    def ours() -> dict[str, str]:
        steps = _reach(lambda: commands.steps(allocation))
        return {name: step for name, step in steps.items()
                if name.startswith(prefix) and name not in keep}

    found = ours()
    for step in found.values():
        try:
            commands.signal(step, "TERM")
        except BackendError as exc:
            logger.warning("recovery: cannot signal step %s: %s", step, exc)

    def still_live() -> set[str]:
        return set(ours()) & set(found)

    survivors = _wait(still_live, grace_s)
    for name in survivors:
        try:
            commands.signal(found[name], "KILL")
        except BackendError as exc:
            logger.warning("recovery: cannot kill step %s: %s", found[name], exc)
    if survivors:
        _wait(still_live, KILL_WAIT_S)
    return [f"step {step} ({name})" for name, step in sorted(found.items())]

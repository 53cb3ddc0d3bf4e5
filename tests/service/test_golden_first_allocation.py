"""Golden test: a job's first allocation in the service equals the simulator's.

In the simulator an adaptive job reports hints from its first round, having profiled
nothing, so it may get at most one replica (AdaptDL's ``max(2 * profiled, 1)``). In the
service a job has no hints until its agent posts them; it is bounded the same way (it
once got its spec's ``max_replicas`` and walked down over restarts). For every round of
the golden workload (:mod:`tests.service.test_golden_sim`) in which a job arrives, the
service is put in the simulator's state, the new job without any hints, and runs one
round: the new job's record is the simulator's, a fresh policy answers both questions
alike, and the simulator's decision becomes the same allocations in the service.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from pollux.policies.registry import make_policy
from pollux.service.loop.snapshot import held_allocation
from tests.service.test_golden_sim import (
    FIXED,
    ReplayPolicy,
    canonical,
    same_job_info,
    service_in_state,
    simulate,
)


def test_a_new_jobs_first_allocation_in_the_service_is_the_simulators() -> None:
    rounds = [r for r in simulate(autoscaled=False) if r.jobs]
    seen: set[str] = set()
    arrivals = 0
    for round_ in rounds:
        new = sorted(set(round_.job_state) - seen)
        seen.update(round_.job_state)
        if not new:
            continue
        arrivals += len(new)
        for name in new:  # nothing profiled: at most one replica, in the simulator too
            assert round_.job_state[name]["hints"].max_profiled_replicas == 0
            assert len(round_.decision.get(name, ())) <= 1, (name, round_.decision)
            round_.job_state[name] = {**round_.job_state[name], "hints": None}
        with tempfile.TemporaryDirectory() as tmp:
            replay = ReplayPolicy()
            allocator, _, ids = service_in_state(round_, Path(tmp), replay, FIXED)
            by_name = {v: k for k, v in ids.items()}
            replay.decision = {by_name[n]: a for n, a in round_.decision.items() if n in by_name}
            allocator.schedule_round(round_.time_s)
            assert replay.question is not None
            jobs, nodes, previous = replay.question
            assert [ids[j.name] for j in jobs] == [j.name for j in round_.jobs]
            for service_job, sim_job in zip(jobs, round_.jobs):
                same_job_info(service_job, sim_job, sim_job.name)
            fresh_service = make_policy("pollux", seed=0).optimize(jobs, nodes, previous)
            fresh_sim = make_policy("pollux", seed=0).optimize(
                list(round_.jobs), list(round_.nodes), round_.previous)
            assert {ids[k]: sorted(v) for k, v in fresh_service.allocations.items() if v} == \
                canonical(fresh_sim.allocations)
            applied = {ids[r.id]: sorted(held_allocation(r))
                       for r in allocator.store.list_jobs() if held_allocation(r)}
            assert applied == canonical(round_.decision), round_.time_s
            allocator.store.close()
    assert arrivals == 4

"""How the service starts a new job, as the simulator does (issue 33, item 7): under a
policy whose jobs adapt, a job whose agent has posted no hints yet is bounded as one that
has profiled nothing (one replica), and grows as it profiles; a rigid job (its fewest
replicas its most) gets its declared replicas; under a policy whose jobs do not adapt, a
job is bounded by its spec from the start."""

from __future__ import annotations

import time
from typing import Any

from pollux.models.hints import JobHints
from pollux.models.throughput import ThroughputParams
from pollux.service.loop.snapshot import held_allocation
from tests.service.service_builders import make_spec

PARAMS = ThroughputParams(0.05, 0.001, 0.1, 0.01, 0.02, 0.002, 1.5)


def bounds(service: Any) -> dict[str, int]:
    snapshot = service.allocator.last_snapshot
    assert snapshot is not None
    return {job.name: job.max_replicas for job in snapshot.jobs}


def test_a_new_job_starts_on_what_profiling_nothing_allows(make_service) -> None:
    service = make_service(policy="pollux")  # 2 nodes x 2 slots
    job = service.submit(make_spec("digits", max_replicas=4).to_dict())["id"]
    now = time.time() + 60.0  # a minute after the submission (restarts are worth it)
    service.allocator.tick(now)
    assert bounds(service) == {job: 1}
    assert len(held_allocation(service.store.get_job(job))) == 1  # was 3 before
    service.post_hints(job, JobHints(init_batch_size=64, max_batch_size=1024,
                                     local_bsz_bounds=(32, 256), throughput_params=PARAMS,
                                     max_profiled_replicas=1).to_dict())
    service.allocator.request_round()
    service.allocator.tick(now + 40.0)
    assert bounds(service) == {job: 2}  # twice what it profiled


def test_a_rigid_job_gets_its_declared_replicas(make_service) -> None:
    service = make_service(policy="pollux")
    job = service.submit(make_spec("rigid", min_replicas=3, max_replicas=3).to_dict())["id"]
    service.allocator.tick(time.time() + 60.0)
    assert bounds(service) == {job: 3}
    assert len(held_allocation(service.store.get_job(job))) == 3


def test_a_policy_whose_jobs_do_not_adapt_bounds_them_by_their_specs(make_service) -> None:
    service = make_service(policy="tiresias")
    job = service.submit(make_spec("tuned", max_replicas=4).to_dict())["id"]
    service.allocator.tick(time.time() + 60.0)
    assert bounds(service) == {job: 4}

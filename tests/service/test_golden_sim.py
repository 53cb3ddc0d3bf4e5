"""Golden test: for the same snapshots, the service (with the fake backend) and the
simulator ask the policy the same question, and apply the same allocations.

The simulator runs a small workload under the Pollux policy, recording every round's
question (jobs, nodes, previous allocations), its decision, and each job's state (profile,
restarts, service, allocation). For each round the service is put in the same state the
way it would be in production (job specs, the job's posted hints, its running replicas)
and asked to schedule; its question must match the simulator's field by field (speedup
functions on a grid), a fresh policy must answer both alike, and the simulator's decision,
fed to the service, must become the same allocations.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pollux.backends.fake import FakeBackend
from pollux.models.hints import JobHints
from pollux.policies.base import Allocations, JobInfo, NodeInfo, Policy, PolicyDecision
from pollux.policies.registry import make_policy
from pollux.service.allocator import Allocator, AllocatorConfig
from pollux.service.snapshot import held_allocation
from pollux.service.states import JobState
from pollux.service.store import JobStore
from pollux.sim import ClusterConfig, JobSpec, Simulator, Workload
from pollux.sim.catalog import load_builtin_applications
from tests.service.service_builders import make_spec

CONFIG = ClusterConfig(num_nodes=2, gpus_per_node=4, interval_s=60.0, restart_delay_s=30.0,
                       max_time_s=900.0)
WORKLOAD = Workload("golden", (
    JobSpec("cifar-a", 0.0, "cifar10", 2, 256), JobSpec("ncf-b", 30.0, "ncf", 1, 32768),
    JobSpec("cifar-c", 200.0, "cifar10", 4, 512), JobSpec("ds2-d", 400.0, "deepspeech2", 2, 40),
))
GRID_NODES, GRID_REPLICAS = np.array([1, 1, 1, 2, 2, 2, 0]), np.array([1, 2, 4, 2, 4, 8, 0])


@dataclass(frozen=True)
class Round:
    time_s: float
    jobs: tuple[JobInfo, ...]
    nodes: tuple[NodeInfo, ...]
    previous: dict[str, tuple[str, ...]]
    decision: dict[str, tuple[str, ...]]
    job_state: dict[str, dict[str, Any]]


class RecordingPolicy(Policy):
    """Delegates to a real policy and records each question, answer and job state."""

    name = "recording"

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.simulator: Simulator | None = None
        self.rounds: list[Round] = []

    def optimize(self, jobs: Sequence[JobInfo], nodes: Sequence[NodeInfo],
                 previous_allocations: Allocations) -> PolicyDecision:
        decision = self.inner.optimize(jobs, nodes, previous_allocations)
        assert self.simulator is not None
        names = {job.name for job in jobs}
        state = {}
        for sim_job in self.simulator.jobs:
            if sim_job.name in names:
                profile = sim_job.profile
                state[sim_job.name] = {
                    "app": sim_job.app.spec, "params": profile.params,
                    "max_replicas": (sim_job.app.spec.pinned_replicas
                                     or min(64, sim_job.app.spec.max_useful_replicas)),
                    "grad_stats": profile.grad_stats,
                    "max_profiled": profile.max_profiled_replicas,
                    "num_restarts": sim_job.num_restarts, "allocation": sim_job.allocation,
                    "service_s": sim_job.attained_service_s}
        self.rounds.append(Round(
            time_s=jobs[0].age_s + jobs[0].submission_time_s, jobs=tuple(jobs),
            nodes=tuple(nodes), previous=dict(previous_allocations),
            decision={k: tuple(v) for k, v in decision.allocations.items()}, job_state=state))
        return decision


class ReplayPolicy(Policy):
    """Answers with a given decision; remembers the question it was asked."""

    name = "replay"

    def __init__(self, decision: dict[str, tuple[str, ...]]) -> None:
        self.decision = decision
        self.question: tuple[list[JobInfo], list[NodeInfo], dict[str, Any]] | None = None

    def optimize(self, jobs: Sequence[JobInfo], nodes: Sequence[NodeInfo],
                 previous_allocations: Allocations) -> PolicyDecision:
        self.question = (list(jobs), list(nodes), dict(previous_allocations))
        return PolicyDecision(allocations=dict(self.decision))


def run_simulation() -> list[Round]:
    recorder = RecordingPolicy(make_policy("pollux"))
    simulator = Simulator(WORKLOAD, load_builtin_applications(), recorder, CONFIG,
                          adaptive_jobs=True)
    recorder.simulator = simulator
    simulator.run()
    return recorder.rounds


def service_in_state(round_: Round, tmp: Path, policy: Policy) -> tuple[Allocator, dict]:
    """A service whose store holds the round's jobs as the service would have them."""
    store = JobStore(tmp / "db", synchronous="OFF")
    backend = FakeBackend(list(round_.nodes))
    allocator = Allocator(store, backend, policy,
                          AllocatorConfig(tmp, interval_s=CONFIG.interval_s))
    ids = {}
    for info in sorted(round_.jobs, key=lambda j: j.submission_time_s):
        state = round_.job_state[info.name]
        app = state["app"]
        spec = make_spec(info.name, min_replicas=0, max_replicas=state["max_replicas"],
                         resources={"gpu": 1, "cpu": 0},
                         restart_delay_s=CONFIG.restart_delay_s)
        record = store.add_job(spec, info.submission_time_s)
        ids[record.id] = info.name
        store.set_hints(record.id, JobHints(
            init_batch_size=app.init_batch_size, max_batch_size=app.max_batch_size,
            local_bsz_bounds=(app.min_local_bsz, app.max_local_bsz), accumulation=True,
            throughput_params=state["params"], grad_stats=state["grad_stats"],
            max_profiled_replicas=state["max_profiled"]).to_dict(), round_.time_s)
        launches = 0 if state["num_restarts"] is None else state["num_restarts"] + 1
        store.update_job(record.id, 0.0, attained_service_s=state["service_s"],
                         num_launches=launches)
        if state["allocation"]:  # running: launched through the fake backend
            store.transition(record.id, JobState.STARTING, 0.0, "launch",
                             allocation=state["allocation"], num_launches=launches)
            store.transition(record.id, JobState.RUNNING, 0.0, "running")
            backend.launch(_request(record.id, state["allocation"], spec))
    return allocator, ids


def _request(job_id: str, allocation: tuple[str, ...], spec: Any) -> Any:
    from pollux.backends.base import LaunchRequest

    return LaunchRequest(job_id, 1, spec, allocation, "/tmp", "/tmp")


def same_job_info(service: JobInfo, sim: JobInfo, name: str) -> None:
    assert service.name.rsplit("-", 1)[0] == name
    for field in ("resources", "min_replicas", "max_replicas", "preemptible",
                  "submission_time_s", "age_s", "attained_service_s", "num_restarts",
                  "restart_delay_s", "remaining_time_fn"):
        left, right = getattr(service, field), getattr(sim, field)
        if isinstance(right, float):
            assert abs(left - right) < 1e-6, (name, field, left, right)
        else:
            assert dict(left) == dict(right) if field == "resources" else left == right, (
                name, field, left, right)
    np.testing.assert_allclose(service.speedup_fn(GRID_NODES, GRID_REPLICAS),
                               sim.speedup_fn(GRID_NODES, GRID_REPLICAS), rtol=1e-9)


def canonical(decision: dict[str, tuple[str, ...]]) -> dict[str, list[str]]:
    return {name: sorted(alloc) for name, alloc in decision.items() if alloc}


def test_service_and_simulator_ask_and_apply_the_same():
    rounds = run_simulation()
    assert len(rounds) >= 10
    assert any(r.previous and canonical(r.decision) != canonical(r.previous)
               for r in rounds), "the golden run should include reallocations"
    for round_ in rounds:
        with tempfile.TemporaryDirectory() as tmp:
            replay = ReplayPolicy({})
            allocator, ids = service_in_state(round_, Path(tmp), replay)
            by_name = {v: k for k, v in ids.items()}
            replay.decision = {by_name[name]: alloc for name, alloc in
                               round_.decision.items() if name in by_name}
            allocator.schedule_round(round_.time_s)
            assert replay.question is not None
            jobs, nodes, previous = replay.question
            # the same question...
            assert [ids[j.name] for j in jobs] == [j.name for j in round_.jobs]
            for service_job, sim_job in zip(jobs, round_.jobs):
                same_job_info(service_job, sim_job, sim_job.name)
            assert nodes == list(round_.nodes)
            assert {ids[k]: sorted(v) for k, v in previous.items()} == canonical(
                round_.previous)
            # ...gets the same answer from a fresh policy...
            fresh_service = make_policy("pollux").optimize(jobs, nodes, previous)
            fresh_sim = make_policy("pollux").optimize(list(round_.jobs), list(round_.nodes),
                                                       round_.previous)
            assert {ids[k]: sorted(v) for k, v in fresh_service.allocations.items() if v} == \
                canonical(fresh_sim.allocations)
            # ...and the simulator's decision becomes the same allocations in the service
            applied = {ids[r.id]: sorted(held_allocation(r))
                       for r in allocator.store.list_jobs() if held_allocation(r)}
            assert applied == canonical(round_.decision), round_.time_s
            allocator.store.close()

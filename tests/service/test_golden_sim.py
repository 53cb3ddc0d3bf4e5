"""Golden test: the simulator and the service (fake backend, virtual clock) are the same
driver. For the same workload they ask the autoscaler and the policy the same questions,
round by round, and apply the same answers.

The simulator runs a small workload under the Pollux policy (with and without the Pollux
autoscaler), recording each round: the state of every job (as the service would hold it:
spec, the hints the job reported, its replicas and accounting), the autoscaler's question
and state, the nodes before and after resizing, the policy's question and its decision.
For each round the service is put in that state and runs one scheduling round with a copy
of the autoscaler and a policy that answers with the simulator's decision. Both must ask
the same questions (job records field by field, speedup functions on a grid), get the
same desired size, pass it to the backend, and end with the same allocations; a fresh
policy must answer both questions alike.
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pollux.backends.base import LaunchRequest
from pollux.backends.fake import FakeBackend
from pollux.policies.autoscaling import (
    Autoscaler,
    AutoscalerConfig,
    NodeTemplate,
    ScalingDecision,
    make_autoscaler,
)
from pollux.policies.base import Allocations, JobInfo, NodeInfo, Policy, PolicyDecision
from pollux.policies.registry import make_policy
from pollux.service.loop.allocator import Allocator, AllocatorConfig
from pollux.service.loop.snapshot import held_allocation
from pollux.service.storage.states import JobState
from pollux.service.storage.store import JobStore
from pollux.sim import ClusterConfig, JobSpec, Simulator, Workload
from pollux.sim.catalog import load_builtin_applications
from tests.service.service_builders import make_spec

FIXED = ClusterConfig(num_nodes=2, gpus_per_node=4, interval_s=60.0, restart_delay_s=30.0,
                      max_time_s=900.0)
ELASTIC = ClusterConfig(num_nodes=3, gpus_per_node=4, interval_s=60.0, restart_delay_s=30.0,
                        max_time_s=900.0, min_nodes=1, max_nodes=3, provision_delay_s=0.0)
WORKLOAD = Workload("golden", (
    JobSpec("cifar-a", 0.0, "cifar10", 2, 256), JobSpec("ncf-b", 30.0, "ncf", 1, 32768),
    JobSpec("cifar-c", 200.0, "cifar10", 4, 512), JobSpec("ds2-d", 400.0, "deepspeech2", 2, 40),
))
GRID_NODES, GRID_REPLICAS = np.array([1, 1, 1, 2, 2, 2, 0]), np.array([1, 2, 4, 2, 4, 8, 0])
COMPARED_FIELDS = ("resources", "min_replicas", "max_replicas", "preemptible",
                   "submission_time_s", "age_s", "attained_service_s", "num_restarts",
                   "restart_delay_s")
"""Every JobInfo field but ``by_type`` (its caps and oracles compared per type, its speedup
functions on a grid), ``tuned`` (the
simulator's workload gives tuned configurations, the service has none: no policy under
test reads it) and ``remaining_s`` (simulated jobs know their target epochs; the agent
reports none)."""


@dataclass
class Round:
    time_s: float
    job_state: dict[str, dict[str, Any]] = field(default_factory=dict)
    nodes_before: tuple[NodeInfo, ...] = ()
    scaler: Autoscaler | None = None
    """A copy of the autoscaler as it was before this round's decision."""
    scaler_jobs: tuple[JobInfo, ...] = ()
    num_nodes: int = 0
    scaling: ScalingDecision | None = None
    jobs: tuple[JobInfo, ...] = ()
    nodes: tuple[NodeInfo, ...] = ()
    previous: dict[str, tuple[str, ...]] = field(default_factory=dict)
    decision: dict[str, tuple[str, ...]] = field(default_factory=dict)


class Recorder:
    """The rounds of one simulation, filled by the recording policy and autoscaler."""

    def __init__(self) -> None:
        self.simulator: Simulator | None = None
        self.rounds: list[Round] = []
        self.now_s = 0.0
        """The simulated time of the round being recorded."""

    def round_at(self, time_s: float) -> Round:
        if not self.rounds or self.rounds[-1].time_s != time_s:
            self.rounds.append(Round(time_s, self.job_states()))
        return self.rounds[-1]

    def job_states(self) -> dict[str, dict[str, Any]]:
        """What the service would hold of every submitted, unfinished job."""
        assert self.simulator is not None
        now = self.now_s
        return {job.name: {"app": job.app.spec, "hints": job.hints(),
                           "submitted": job.spec.submission_time_s,
                           "num_restarts": job.num_restarts, "allocation": job.allocation,
                           "service_s": job.attained_service_s}
                for job in self.simulator.jobs
                if job.spec.submission_time_s <= now and job.completion_time_s is None}


class RecordingPolicy(Policy):
    name = "recording"

    def __init__(self, inner: Policy, recorder: Recorder) -> None:
        self.inner = inner
        self.recorder = recorder

    def optimize(self, jobs: Sequence[JobInfo], nodes: Sequence[NodeInfo],
                 previous_allocations: Allocations) -> PolicyDecision:
        self.recorder.now_s = jobs[0].submission_time_s + jobs[0].age_s
        round_ = self.recorder.round_at(self.recorder.now_s)
        decision = self.inner.optimize(jobs, nodes, previous_allocations)
        round_.jobs, round_.nodes = tuple(jobs), tuple(nodes)
        round_.previous = {k: tuple(v) for k, v in previous_allocations.items()}
        round_.decision = {k: tuple(v) for k, v in decision.allocations.items()}
        return decision


class RecordingAutoscaler(Autoscaler):
    name = "pollux"

    def __init__(self, inner: Autoscaler, recorder: Recorder) -> None:
        super().__init__(inner.config, inner.estimator)
        self.inner = inner
        self.recorder = recorder

    def propose(self, jobs: Any, num_nodes: int) -> Any:  # pragma: no cover - not asked
        raise AssertionError("decide is delegated")

    def decide(self, jobs: Sequence[JobInfo], num_nodes: int) -> ScalingDecision:
        assert self.recorder.simulator is not None and self.recorder.simulator.cluster
        # the round's time: the jobs' clock, or one interval on when no job is active
        self.recorder.now_s = max((j.submission_time_s + j.age_s for j in jobs),
                                  default=self.recorder.now_s + ELASTIC.interval_s)
        round_ = self.recorder.round_at(self.recorder.now_s)
        round_.scaler = copy.deepcopy(self.inner)
        round_.nodes_before = tuple(self.recorder.simulator.cluster.nodes())
        round_.scaler_jobs, round_.num_nodes = tuple(jobs), num_nodes
        round_.scaling = self.inner.decide(jobs, num_nodes)
        return round_.scaling


def simulate(autoscaled: bool) -> list[Round]:
    recorder = Recorder()
    scaler = None
    config = ELASTIC if autoscaled else FIXED
    if autoscaled:
        inner = make_autoscaler("pollux", AutoscalerConfig(
            NodeTemplate({"gpu": 4.0}), min_nodes=1, max_nodes=3, window_rounds=2))
        scaler = RecordingAutoscaler(inner, recorder)
    simulator = Simulator(WORKLOAD, load_builtin_applications(),
                          RecordingPolicy(make_policy("pollux", seed=0), recorder), config,
                          adaptive_jobs=True, autoscaler=scaler)
    recorder.simulator = simulator
    simulator.run()
    return recorder.rounds


class ReplayPolicy(Policy):
    """Answers with a given decision; remembers the question it was asked."""

    name = "replay"

    def __init__(self) -> None:
        self.decision: dict[str, tuple[str, ...]] = {}
        self.question: tuple[list[JobInfo], list[NodeInfo], dict[str, Any]] | None = None

    def optimize(self, jobs: Sequence[JobInfo], nodes: Sequence[NodeInfo],
                 previous_allocations: Allocations) -> PolicyDecision:
        self.question = (list(jobs), list(nodes), dict(previous_allocations))
        return PolicyDecision(allocations=dict(self.decision))


def service_in_state(round_: Round, tmp: Path, policy: Policy, config: ClusterConfig
                     ) -> tuple[Allocator, FakeBackend, dict[str, str]]:
    """A service whose store holds the round's jobs as the service would have them: their
    specs, the hints they posted, their accounting and their running replicas."""
    store = JobStore(tmp / "db", synchronous="OFF")
    nodes = round_.nodes_before or round_.nodes
    after = round_.nodes
    backend = FakeBackend(list(nodes), provider=lambda n: list(after))
    scaler = copy.deepcopy(round_.scaler)
    allocator = Allocator(store, backend, policy,
                          AllocatorConfig(tmp, interval_s=config.interval_s), autoscaler=scaler)
    ids = {}
    for name, state in sorted(round_.job_state.items(), key=lambda kv: kv[1]["submitted"]):
        spec = make_spec(name, min_replicas=0, max_replicas=state["app"].max_useful_replicas,
                         resources={"gpu": 1, "cpu": 0}, restart_delay_s=config.restart_delay_s)
        record = store.add_job(spec, state["submitted"])
        ids[record.id] = name
        if state["hints"] is not None:
            store.set_hints(record.id, state["hints"], round_.time_s)
        launches = 0 if state["num_restarts"] is None else state["num_restarts"] + 1
        store.update_job(record.id, 0.0, attained_service_s=state["service_s"],
                         num_launches=launches)
        if state["allocation"]:  # running: launched through the fake backend
            store.transition(record.id, JobState.STARTING, 0.0, "launch",
                             allocation=state["allocation"], num_launches=launches)
            store.transition(record.id, JobState.RUNNING, 0.0, "running")
            backend.launch(LaunchRequest(record.id, 1, spec, state["allocation"], "/tmp",
                                         "/tmp"))
    return allocator, backend, ids


def same_job_info(service: JobInfo, sim: JobInfo, name: str) -> None:
    assert service.name.rsplit("-", 1)[0] == name
    for attribute in COMPARED_FIELDS:
        left, right = getattr(service, attribute), getattr(sim, attribute)
        if attribute == "resources":
            assert dict(left) == dict(right), (name, attribute, left, right)
        elif isinstance(right, float):
            assert abs(left - right) < 1e-6, (name, attribute, left, right)
        else:
            assert left == right, (name, attribute, left, right)
    def limits(info: JobInfo) -> dict[str, tuple[int, object]]:
        return {t: (f.max_replicas, f.remaining_time_fn) for t, f in info.by_type.items()}

    assert limits(service) == limits(sim), name
    if sim.on().speedup_fn is None:
        assert service.on().speedup_fn is None, name
    else:
        assert service.on().speedup_fn is not None, name
        np.testing.assert_allclose(service.on().speedup_fn(GRID_NODES, GRID_REPLICAS),
                                   sim.on().speedup_fn(GRID_NODES, GRID_REPLICAS), rtol=1e-9)


def canonical(decision: dict[str, tuple[str, ...]]) -> dict[str, list[str]]:
    return {name: sorted(alloc) for name, alloc in decision.items() if alloc}


@pytest.mark.parametrize("autoscaled", [False, True], ids=["fixed", "autoscaled"])
def test_service_and_simulator_ask_and_apply_the_same(autoscaled: bool) -> None:
    rounds = simulate(autoscaled)
    config = ELASTIC if autoscaled else FIXED
    asked = [r for r in rounds if r.jobs]
    assert len(asked) >= 10
    assert any(r.previous and canonical(r.decision) != canonical(r.previous) for r in asked), \
        "the golden run should include reallocations"
    if autoscaled:
        sizes = [r.scaling.num_nodes for r in rounds if r.scaling is not None]
        assert len(set(sizes)) > 1, f"the golden run should resize the cluster: {sizes}"
    for round_ in rounds:
        with tempfile.TemporaryDirectory() as tmp:
            replay = ReplayPolicy()
            allocator, backend, ids = service_in_state(round_, Path(tmp), replay, config)
            by_name = {v: k for k, v in ids.items()}
            replay.decision = {by_name[name]: alloc for name, alloc in
                               round_.decision.items() if name in by_name}
            allocator.schedule_round(round_.time_s)
            if autoscaled:  # the same autoscaler question and answer, passed on
                assert round_.scaling is not None and allocator.last_scaling is not None
                assert allocator.last_scaling == round_.scaling, round_.time_s
                assert backend.requested_sizes == [round_.scaling.num_nodes]
            if not round_.jobs:
                assert replay.question is None
                allocator.store.close()
                continue
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
            fresh_service = make_policy("pollux", seed=0).optimize(jobs, nodes, previous)
            fresh_sim = make_policy("pollux", seed=0).optimize(
                list(round_.jobs), list(round_.nodes), round_.previous)
            assert {ids[k]: sorted(v) for k, v in fresh_service.allocations.items() if v} == \
                canonical(fresh_sim.allocations)
            # ...and the simulator's decision becomes the same allocations in the service
            applied = {ids[r.id]: sorted(held_allocation(r))
                       for r in allocator.store.list_jobs() if held_allocation(r)}
            assert applied == canonical(round_.decision), round_.time_s
            allocator.store.close()

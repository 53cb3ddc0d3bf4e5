"""GPU types through the service (issue #16): node types reach the policy's snapshot with
each job's per-type model built from its posted hints, an allocation that spans types is
refused with an event, a launch carries its type to the replicas, and the store and API
say which type each job runs on."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from types import MappingProxyType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pollux.backends.fake import FakeBackend
from pollux.errors import ConfigError, JobSpecError
from pollux.models.hints import JobHints
from pollux.models.throughput import ThroughputParams
from pollux.models.typed import TypeProfile
from pollux.policies.base import Allocations, JobInfo, NodeInfo, Policy, PolicyDecision
from pollux.service.loop.allocator import Allocator, AllocatorConfig
from pollux.service.storage.states import JobState
from pollux.service.storage.store import JobStore
from tests.address_space import address_space_limited
from tests.service.service_builders import make_spec
from tests.service.service_test_policies import EqualSharePolicy

FAST = ThroughputParams(0.01, 0.001, 0.1, 0.01, 0.05, 0.005, 1.5)
SLOW = ThroughputParams(0.03, 0.003, 0.1, 0.01, 0.05, 0.005, 1.5)


def typed_nodes() -> list[NodeInfo]:
    """Two ``a`` nodes of 2 slots and one ``b`` node of 4."""
    def node(name: str, slots: int, gpu_type: str) -> NodeInfo:
        return NodeInfo(name, MappingProxyType({"gpu": float(slots), "cpu": 8.0,
                                                "memory": 64e9}), gpu_type=gpu_type)
    return [node("a-0", 2, "a"), node("a-1", 2, "a"), node("b-0", 4, "b")]


class RecordingPolicy(Policy):
    """Gives each job the allocation it is told to, and keeps every snapshot it saw."""

    name = "recording"
    adaptive_jobs = False  # reads no model: its jobs are bounded by their specs

    def __init__(self, allocations: dict[str, tuple[str, ...]] | None = None) -> None:
        self.allocations = dict(allocations or {})
        self.seen: list[tuple[list[JobInfo], list[NodeInfo]]] = []

    def optimize(self, jobs: Sequence[JobInfo], nodes: Sequence[NodeInfo],
                 previous_allocations: Allocations) -> PolicyDecision:
        self.seen.append((list(jobs), list(nodes)))
        return PolicyDecision({job.name: self.allocations.get(job.name, ()) for job in jobs})


def allocator_on(store: JobStore, backend: FakeBackend, policy: Policy, tmp_path
                 ) -> Allocator:
    return Allocator(store, backend, policy, AllocatorConfig(data_dir=tmp_path, interval_s=10.0),
                     clock=lambda: 0.0)


def test_an_allocation_spanning_types_is_refused_with_its_reason(store, tmp_path):
    backend = FakeBackend(typed_nodes())
    job = store.add_job(make_spec("j", max_replicas=4), now=0.0)
    policy = RecordingPolicy({job.id: ("a-0", "a-0", "b-0", "b-0")})
    allocator = allocator_on(store, backend, policy, tmp_path)
    allocator.tick(1.0)
    allocator.tick(2.0)
    assert backend.launches == [] and store.get_job(job.id).state is JobState.PENDING
    warnings = [e.message for e in store.events(job.id) if e.kind == "warning"]
    assert len(warnings) == 1
    assert "allocation infeasible" in warnings[0] and "spans GPU types 'a' and 'b'" in warnings[0]
    # within one type it runs, and the launch names the type for every replica
    policy.allocations[job.id] = ("a-0", "a-0", "a-1", "a-1")
    allocator.request_round()
    allocator.tick(3.0)
    request = backend.launches[-1]
    assert request.gpu_type == "a"
    assert {env.gpu_type for env in request.environments("127.0.0.1", 1)} == {"a"}
    assert {env.to_env()["POLLUX_GPU_TYPE"]
            for env in request.environments("127.0.0.1", 1)} == {"a"}
    assert store.get_job(job.id).gpu_type == "a"
    assert "(GPU type a)" in [e.message for e in store.events(job.id)][-1]


def test_a_stored_target_spanning_types_is_not_launched(store, tmp_path):
    """A target decided before the nodes' types changed (e.g. across a server restart) is
    dropped with an event instead of being launched across types."""
    backend = FakeBackend(typed_nodes())
    job = store.add_job(make_spec("j", max_replicas=4), now=0.0)
    store.update_job(job.id, 0.0, target_allocation=("a-1", "b-0"))
    allocator_on(store, backend, RecordingPolicy(), tmp_path).launches.launch_ready(1.0, 1.0)
    assert backend.launches == [] and store.get_job(job.id).target_allocation is None
    assert "not launched: allocation spans GPU types" in store.events(job.id)[-1].message


def test_untyped_clusters_launch_without_a_type(store, fake_backend, make_allocator):
    job = store.add_job(make_spec("j", max_replicas=2), now=0.0)
    make_allocator().tick(1.0)
    request = fake_backend.launches[-1]
    assert request.gpu_type is None
    assert "POLLUX_GPU_TYPE" not in request.environments("127.0.0.1", 1)[0].to_env()
    assert store.get_job(job.id).gpu_type is None


def post_typed_hints(service, job_id: str) -> None:
    hints = JobHints(init_batch_size=32, max_batch_size=512, local_bsz_bounds=(16, 128),
                     throughput_params=FAST, max_profiled_replicas=2, gpu_type="a",
                     type_profiles={"a": TypeProfile(FAST, 2), "b": TypeProfile(SLOW, 1)})
    service.post_hints(job_id, hints.to_dict())


def test_the_policy_sees_each_jobs_per_type_model_from_its_hints(make_service, fake_backend):
    fake_backend._nodes = typed_nodes()
    service = make_service()
    policy = RecordingPolicy()
    service.allocator.policy = policy
    job = service.submit(make_spec("j", max_replicas=16).to_dict())["id"]
    post_typed_hints(service, job)
    service.allocator.tick(1.0)
    jobs, nodes = policy.seen[-1]
    assert {n.gpu_type for n in nodes} == {"a", "b"}
    info = jobs[0]
    model = info.typed_goodput
    assert model is not None and set(model.gpu_types) == {"a", "b"}
    # each type keeps its own step-time model: the fast type's goodput is higher
    assert float(model.goodput("a", 1, 2)) > float(model.goodput("b", 1, 2))
    assert info.own_caps() == {"a": 4, "b": 2}
    assert info.max_replicas == 4
    # the same hints on an untyped cluster: no typed model (homogeneous path unchanged)
    fake_backend._nodes = [NodeInfo(n.name, n.resources) for n in typed_nodes()]
    service.allocator.request_round()
    service.allocator.tick(2.0)
    assert policy.seen[-1][0][0].typed_goodput is None


def test_the_api_shows_the_type_of_each_job_and_node(client, service, fake_backend):
    fake_backend._nodes = typed_nodes()
    service.allocator.policy = EqualSharePolicy()
    job = client.post("/api/jobs", json=make_spec("j", max_replicas=2).to_dict()).json()["id"]
    service.allocator.tick(1.0)
    summary = client.get("/api/jobs").json()[0]
    assert summary["gpu_type"] in ("a", "b")
    types = {node.name: node.gpu_type for node in typed_nodes()}
    assert {types[name] for name in summary["allocation"]} == {summary["gpu_type"]}
    assert client.get(f"/api/jobs/{job}").json()["gpu_type"] == summary["gpu_type"]
    assert [n["gpu_type"] for n in client.get("/api/nodes").json()] == ["a", "a", "b"]
    assert [n["gpu_type"] for n in client.get("/api/dashboard").json()["nodes"]] == \
        ["a", "a", "b"]


def test_a_store_from_before_gpu_types_opens_and_gains_the_column(tmp_path):
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:  # the jobs table as released before #16
        conn.execute("CREATE TABLE jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT "
                     "UNIQUE NOT NULL, name TEXT NOT NULL, spec TEXT NOT NULL, state TEXT "
                     "NOT NULL, reason TEXT, allocation TEXT NOT NULL DEFAULT '[]', "
                     "target_allocation TEXT, num_launches INTEGER NOT NULL DEFAULT 0, "
                     "num_failures INTEGER NOT NULL DEFAULT 0, num_rescales INTEGER NOT NULL "
                     "DEFAULT 0, cancel_requested INTEGER NOT NULL DEFAULT 0, hints TEXT, "
                     "hints_updated_at REAL, hints_token TEXT NOT NULL, attained_service_s "
                     "REAL NOT NULL DEFAULT 0, submitted_at REAL NOT NULL, started_at REAL, "
                     "finished_at REAL, updated_at REAL NOT NULL)")
    store = JobStore(path)
    try:
        job = store.add_job(make_spec("old"), now=0.0)
        assert job.gpu_type is None
        assert store.update_job(job.id, 1.0, gpu_type="x").gpu_type == "x"
    finally:
        store.close()


def test_a_move_between_types_says_so_with_both_predictions(make_service, fake_backend):
    fake_backend._nodes = typed_nodes()
    service = make_service()
    job = service.submit(make_spec("j", max_replicas=4).to_dict())["id"]
    policy = RecordingPolicy({job: ("a-0", "a-0")})
    service.allocator.policy = policy
    service.allocator.tick(1.0)
    service.allocator.tick(1.5)
    assert service.store.get_job(job).state is JobState.RUNNING
    post_typed_hints(service, job)
    policy.allocations[job] = ("b-0", "b-0")
    service.allocator.request_round()
    service.allocator.tick(2.0)
    rescale = [e.message for e in service.store.events(job) if e.kind == "Rescaling"]
    assert len(rescale) == 1
    assert rescale[0].startswith("rescale 2 -> 2 replicas: moved from GPU type a to b "
                                 "(predicted goodput ")
    assert "samples/s on 2 replicas)" in rescale[0]
    service.allocator.tick(2.5)
    assert service.store.get_job(job).gpu_type == "b"


def test_a_job_must_fit_within_one_type_to_be_accepted(make_service, fake_backend):
    fake_backend._nodes = typed_nodes()  # a: 2 nodes x 2 slots, b: 1 node x 4
    service = make_service()
    service.submit(make_spec("four", min_replicas=4, max_replicas=4).to_dict())
    with pytest.raises(JobSpecError, match="one GPU type of the cluster fits at most 4") \
            as info:
        service.submit(make_spec("five", min_replicas=5, max_replicas=8).to_dict())
    assert info.value.field == "min_replicas"


def test_a_job_gets_a_model_on_types_it_has_not_run_on(make_service, fake_backend):
    """Without type speeds a job that ran only on ``a`` had no model on ``b`` (Sia's rule:
    one GPU there). A job that ran on both measured ``a`` 3x as fast as ``b``: the other
    job's model is projected onto ``b`` by that ratio; a declared speed wins."""
    from pollux.models.typed import project_params

    fake_backend._nodes = typed_nodes()
    service = make_service()
    policy = RecordingPolicy()
    service.allocator.policy = policy
    both = service.submit(make_spec("both", max_replicas=4).to_dict())["id"]
    only_a = service.submit(make_spec("only-a", max_replicas=4).to_dict())["id"]
    slow_b = project_params(FAST, 1 / 3)
    service.post_hints(both, JobHints(
        init_batch_size=32, max_batch_size=512, local_bsz_bounds=(16, 128),
        throughput_params=FAST, max_profiled_replicas=2, gpu_type="a",
        type_profiles={"a": TypeProfile(FAST, 2), "b": TypeProfile(slow_b, 1)}).to_dict())
    service.post_hints(only_a, JobHints(
        init_batch_size=32, max_batch_size=512, local_bsz_bounds=(16, 128),
        throughput_params=SLOW, max_profiled_replicas=2, gpu_type="a").to_dict())
    service.allocator.tick(1.0)
    info = {job.name: job for job in policy.seen[-1][0]}[only_a]
    model = info.typed_goodput
    assert model is not None and set(model.gpu_types) == {"a", "b"}
    assert model.projected_from == {"b": "a"}
    ratio = float(model.goodput("b", 1, 1)) / float(model.goodput("a", 1, 1))
    assert ratio == pytest.approx(1 / 3, rel=0.011)

    # declared speeds win over the learned ones (same store: both jobs still report)
    declared = make_service(gpu_type_speeds="a=1,b=2")
    declared.allocator.policy = policy
    declared.allocator.tick(2.0)
    model = {job.name: job for job in policy.seen[-1][0]}[only_a].typed_goodput
    assert float(model.goodput("b", 1, 1)) / float(model.goodput("a", 1, 1)) == pytest.approx(2.0)


def test_the_speeds_in_use_are_shown(client, service, fake_backend):
    from pollux.cli.job_tables import cluster_line

    fake_backend._nodes = typed_nodes()
    job = service.submit(make_spec("j", max_replicas=4).to_dict())["id"]
    post_typed_hints(service, job)  # FAST on a, SLOW on b
    assert client.get("/api/cluster").json()["gpu_type_speeds"] == {}
    service.allocator.tick(1.0)
    speeds = client.get("/api/cluster").json()["gpu_type_speeds"]
    assert set(speeds) == {"a", "b"} and speeds["b"] == 1.0 and speeds["a"] > 1.0
    line = cluster_line(client.get("/api/cluster").json())
    assert line is not None and line.startswith("GPU type speeds (1 GPU, relative): b 1, a ")


def test_invented_gpu_types_in_one_jobs_hints_reach_no_other_job(make_service, fake_backend):
    """Hints may carry 64 type profiles: types the cluster does not have must not become
    speeds that every other job's model is projected onto (64 models per job)."""
    fake_backend._nodes = typed_nodes()
    service = make_service()
    policy = RecordingPolicy()
    service.allocator.policy = policy
    liar = service.submit(make_spec("liar", max_replicas=4).to_dict())["id"]
    honest = service.submit(make_spec("honest", max_replicas=4).to_dict())["id"]
    invented = {f"fake-{i}": TypeProfile(FAST, 1) for i in range(60)}
    service.post_hints(liar, JobHints(
        init_batch_size=32, max_batch_size=512, local_bsz_bounds=(16, 128),
        throughput_params=FAST, max_profiled_replicas=2, gpu_type="a",
        type_profiles={"a": TypeProfile(FAST, 2), "b": TypeProfile(SLOW, 1),
                       **invented}).to_dict())
    service.post_hints(honest, JobHints(
        init_batch_size=32, max_batch_size=512, local_bsz_bounds=(16, 128),
        throughput_params=SLOW, max_profiled_replicas=2, gpu_type="a").to_dict())
    service.allocator.tick(1.0)
    assert set(service.allocator.type_speeds) == {"a", "b"}
    info = {job.name: job for job in policy.seen[-1][0]}[honest]
    assert set(info.typed_goodput.gpu_types) == {"a", "b"}

_seconds = st.one_of(st.floats(0.0, 1e6), st.sampled_from([0.0, 1e-300, 1e6]))
_params = st.fixed_dictionaries({
    "alpha_c": _seconds, "beta_c": _seconds, "alpha_n": _seconds, "beta_n": _seconds,
    "alpha_r": _seconds, "beta_r": _seconds, "gamma": st.floats(0.0, 1e6)})
_profile = st.fixed_dictionaries({"throughput_params": st.one_of(st.none(), _params),
                                  "max_profiled_replicas": st.integers(0, 2**30)})
typed_hints = st.fixed_dictionaries(
    {"init_batch_size": st.integers(1, 2**30), "max_batch_size": st.integers(1, 2**30),
     "local_bsz_bounds": st.lists(st.integers(1, 2**30), min_size=2, max_size=2)},
    optional={"throughput_params": _params, "gpu_type": st.sampled_from(["a", "b", "zz"]),
              "max_profiled_replicas": st.integers(0, 2**30),
              "grad_stats": st.fixed_dictionaries({"sqr": st.floats(0, 1e30),
                                                   "var": st.floats(0, 1e30)}),
              "type_profiles": st.dictionaries(st.sampled_from(["a", "b", "zz", "q"]),
                                               _profile, max_size=4)})


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(hints=st.lists(typed_hints, min_size=1, max_size=3),
       policy=st.sampled_from(["pollux", "sia"]))
def test_no_typed_hints_stall_the_allocation_loop(make_service, fake_backend, hints, policy):
    """Any per-type profiles a job may post (in bounds) on a typed cluster: every round
    completes within a bounded address space and every job is decided."""
    fake_backend._nodes = typed_nodes()
    service = make_service(policy=policy)
    ids = [service.submit(make_spec(f"j{i}", max_replicas=4).to_dict())["id"]
           for i in range(len(hints))]
    for job_id, raw in zip(ids, hints):
        try:
            service.post_hints(job_id, raw)
        except ConfigError:
            continue  # refused at the door, naming the field
    service.allocator.request_round()
    with address_space_limited(1 << 30):
        service.allocator.tick(1000.0 + service.allocator.num_rounds)
    decision = service.allocator.last_decision
    assert decision is not None and set(ids) <= set(decision.allocations)
    for allocation in decision.allocations.values():
        assert len({node[0] for node in allocation}) <= 1  # never spans a/b


def test_the_policys_exploration_factor_sets_the_typed_caps(make_service, fake_backend):
    """The same growth rule on every type as on one: a policy that lets jobs grow 4x the
    replicas they profiled gets caps of 4x per type, not the default 2x."""
    fake_backend._nodes = typed_nodes()
    service = make_service()
    policy = RecordingPolicy()
    policy.exploration_factor = 4.0
    service.allocator.policy = policy
    job = service.submit(make_spec("j", max_replicas=16).to_dict())["id"]
    post_typed_hints(service, job)  # profiled 2 replicas on a, 1 on b
    service.allocator.tick(1.0)
    info = policy.seen[-1][0][0]
    assert info.own_caps() == {"a": 8, "b": 4}
    assert info.max_replicas == 8


def test_pollux_starts_a_new_job_on_4_gpus_of_the_fastest_type(make_service, fake_backend):
    """The service applies pollux's typed growth rule as the simulator does: a job that
    has not run gets 4 GPUs on the type the cluster's speeds say is fastest, not 1 GPU
    anywhere; the paper's objective (pollux-paper) keeps Sia's 1-GPU start."""
    fake_backend._nodes = typed_nodes()  # a: 2 nodes x 2, b: 1 node x 4
    service = make_service(policy="pollux", gpu_type_speeds="a=1,b=3")
    assert service.health()["policy"] == "pollux"
    job = service.submit(make_spec("new", max_replicas=8).to_dict())["id"]
    service.allocator.tick(1.0)
    allocation = service.allocator.last_decision.allocations[job]
    assert allocation == ("b-0",) * 4
    info = service.allocator.last_snapshot.jobs[0]
    assert info.own_caps() == {"a": 4, "b": 4}
    assert info.extras["type_speeds"] == {"a": 1.0, "b": 3.0}

    plain = make_service(policy="pollux-paper", gpu_type_speeds="a=1,b=3")
    plain.allocator.tick(2.0)  # same store; no hints yet: still a job without a model
    assert len(plain.allocator.last_decision.allocations[job]) == 1

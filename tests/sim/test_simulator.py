from __future__ import annotations

import json

import numpy as np
import pytest

from pollux.errors import ConfigError
from pollux.policies.registry import make_policy
from pollux.sim.catalog import load_builtin_applications
from pollux.sim.job import JobSpec
from pollux.sim.metrics import report, summarize_run
from pollux.sim.simulator import ClusterConfig, Simulator
from pollux.sim.workload import Workload
from tests.sim.fakes import FixedAllocationPolicy, FixedGreedyPolicy, GreedyPolicy, ToyApplication


def toy_workload(*jobs: tuple[str, float, int]) -> Workload:
    return Workload("toy", tuple(JobSpec(name, t, "toy", k, 128) for name, t, k in jobs))


def test_adaptive_jobs_explore_within_twice_their_largest_run() -> None:
    apps = {"toy": ToyApplication(epochs=40, ratio=200.0)}
    result = Simulator(toy_workload(("a", 0.0, 1)), apps, GreedyPolicy(),
                       ClusterConfig(num_nodes=4, gpus_per_node=4)).run()
    (job,) = result.jobs
    assert result.adaptive_jobs and job.completion_time_s is not None
    sizes = [r.gpus["a"] for r in result.rounds if "a" in r.gpus]
    assert sizes[:4] == [1, 2, 4, 8]  # each round at most doubles the largest so far
    assert job.profile is not None and job.profile.params is not None
    # Noisy gradients: it grew its batch well beyond the smallest that fills its replicas.
    assert max(k * b for (_, k, b) in job.profile.observations) >= 256


class FastGrowingPolicy(GreedyPolicy):
    name = "greedy-x4"
    exploration_factor = 4.0


@pytest.mark.parametrize(("policy", "expected"), [(GreedyPolicy(), [1, 2, 4, 8, 16]),
                                                  (FastGrowingPolicy(), [1, 4, 16, 16, 16])])
def test_a_policy_may_let_jobs_grow_faster(policy: GreedyPolicy, expected: list[int]) -> None:
    # the driver applies the policy's own exploration factor, and accepts its decisions
    apps = {"toy": ToyApplication(epochs=40, ratio=200.0)}
    result = Simulator(toy_workload(("a", 0.0, 1)), apps, policy,
                       ClusterConfig(num_nodes=4, gpus_per_node=4)).run()
    (job,) = result.jobs
    assert not job.events and job.completion_time_s is not None
    assert [r.gpus["a"] for r in result.rounds if "a" in r.gpus][:5] == expected


def test_ncf_stays_pinned_under_adaptive_policies() -> None:
    apps = load_builtin_applications()
    workload = Workload("w", (JobSpec("ncf-0", 0.0, "ncf", 4, 4096),))
    result = Simulator(workload, apps, GreedyPolicy(),
                       ClusterConfig(num_nodes=2, gpus_per_node=4)).run()
    (job,) = result.jobs
    assert all(r.gpus.get("ncf-0", 0) <= 1 for r in result.rounds)
    assert job.target_batch_size == 32768 and job.completion_time_s is not None


def test_infeasible_allocations_become_job_events() -> None:
    cases = {("node-0",) * 5: "5 replicas on 'node-0' need 5 gpu, 4 left",
             ("node-9",): "unknown node 'node-9'"}
    for allocation, reason in cases.items():
        policy = FixedAllocationPolicy({"a": allocation})
        result = Simulator(toy_workload(("a", 0.0, 1)), {"toy": ToyApplication()},
                           policy, ClusterConfig(num_nodes=1, gpus_per_node=4),
                           adaptive_jobs=False).run()
        (job,) = result.jobs
        assert job.completion_time_s is None and not any(r.gpus for r in result.rounds)
        assert len(job.events) == 1 and reason in job.events[0][1], job.events[:2]


def test_interference_slows_distributed_jobs_sharing_nodes() -> None:
    shared = {"a": ("node-0", "node-1"), "b": ("node-0", "node-1")}
    apps = {"toy": ToyApplication(epochs=2)}
    workload = toy_workload(("a", 0.0, 2), ("b", 0.0, 2))
    done = {}
    for interference in (0.0, 0.5):
        result = Simulator(workload, apps, FixedAllocationPolicy(shared),
                           ClusterConfig(num_nodes=2, gpus_per_node=2,
                                         interference=interference)).run()
        done[interference] = [job.completion_time_s for job in result.jobs]
    assert all(slow > fast for slow, fast in zip(done[0.5], done[0.0]))


def test_jobs_that_can_never_run_end_the_run() -> None:
    result = Simulator(toy_workload(("big", 0.0, 8), ("ok", 0.0, 1)),
                       {"toy": ToyApplication()}, make_policy("tiresias", seed=0),
                       ClusterConfig(num_nodes=1, gpus_per_node=4)).run()
    record = summarize_run(result, {"toy": ToyApplication()})
    assert (record.num_jobs, record.num_completed) == (2, 1)


def test_lone_job_with_its_share_is_perfectly_fair() -> None:
    apps = {"toy": ToyApplication(epochs=3)}
    result = Simulator(toy_workload(("a", 100.0, 1)), apps, FixedGreedyPolicy(),
                       ClusterConfig(num_nodes=2, gpus_per_node=4)).run()
    record = summarize_run(result, apps)
    (job,) = record.jobs
    assert job.ftf == pytest.approx(1.0, abs=1e-9)
    assert record.unfair_fraction == 0.0 and record.num_completed == 1
    assert record.gpu_hours_per_job == pytest.approx(job.gpu_hours)
    assert record.avg_jct_s == job.jct_s == record.p50_jct_s


def test_bad_configuration_and_unknown_application() -> None:
    with pytest.raises(ConfigError, match="interference"):
        ClusterConfig(interference=1.5)
    with pytest.raises(ConfigError, match="application"):
        Simulator(Workload("w", (JobSpec("x", 0.0, "resnet", 1, 32),)),
                  {"toy": ToyApplication()}, GreedyPolicy()).run()


def test_builtin_catalog_runs_every_baseline() -> None:
    apps = load_builtin_applications()
    assert sorted(apps) == ["bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3"]
    workload = Workload("w", (JobSpec("c", 0.0, "cifar10", 4, 2048),
                              JobSpec("n", 30.0, "ncf", 1, 32768)))
    jcts = {}
    for name in ("fifo", "tiresias", "optimus"):
        record = summarize_run(Simulator(workload, apps, make_policy(name, seed=0)).run(), apps)
        assert record.num_completed == 2
        jcts[name] = record.avg_jct_s
    assert np.isfinite(list(jcts.values())).all()


def test_undefined_figures_become_null_in_json() -> None:
    apps = {"toy": ToyApplication()}
    result = Simulator(toy_workload(("big", 0.0, 8)), apps, make_policy("tiresias", seed=0),
                       ClusterConfig(num_nodes=1, gpus_per_node=4)).run()
    document = report([summarize_run(result, apps)])
    text = json.dumps(document, allow_nan=False)
    run = json.loads(text)["runs"][0]
    assert run["num_completed"] == 0 and run["avg_jct_s"] is None and run["max_ftf"] is None

"""The lower bound on the average JCT: below every policy's result, per job and on average."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pollux.sim.generator import generate_workload
from pollux.sim.job import JobSpec
from pollux.sim.lower_bound import best_rates, cluster_lower_bound, srpt_completions
from pollux.sim.runner import RunTask, execute, load_applications
from pollux.sim.simulator import ClusterConfig
from pollux.sim.workload import Workload
from tests.sim.fakes import ToyApplication

CONFIG = ClusterConfig(num_nodes=4, gpus_per_node=4)


def _check_below(workload: Workload, policies: tuple[str, ...]) -> None:
    apps = load_applications(None)
    bound = cluster_lower_bound(workload, apps, CONFIG)
    assert 0 < bound.capacity_avg_jct_s <= bound.avg_jct_s
    assert bound.alone_avg_jct_s <= bound.avg_jct_s
    for policy in policies:
        record = execute(RunTask(policy, workload, CONFIG, None), 0, apps).record
        if record.num_completed < record.num_jobs:
            continue  # a tuned configuration larger than the cluster never runs (fifo)
        assert bound.avg_jct_s <= record.avg_jct_s, policy
        for job in record.jobs:
            assert job.jct_s is not None and bound.job_alone_s[job.name] <= job.jct_s, (
                policy, job.name)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(num_jobs=st.integers(1, 6), hours=st.sampled_from([0.25, 0.5, 1.0]),
       seed=st.integers(0, 10_000))
def test_bound_is_below_every_baseline(num_jobs: int, hours: float, seed: int) -> None:
    _check_below(generate_workload(num_jobs, hours, seed), ("fifo", "tiresias", "optimus"))


@pytest.mark.parametrize("seed", [3])
def test_bound_is_below_pollux(seed: int) -> None:
    _check_below(generate_workload(3, 0.25, seed), ("pollux", "pollux(remaining_weight=0.5)", "pollux-ga"))


def test_srpt_matches_brute_force_on_one_machine() -> None:
    # Without releases every order is non-preemptive; SRPT is shortest first, the best.
    work = [5.0, 1.0, 3.0]
    best = min(sum(itertools.accumulate(work[i] for i in order))
               for order in itertools.permutations(range(3)))
    assert sum(srpt_completions([0.0] * 3, work)) == pytest.approx(best)
    # A short job released later preempts the long one.
    assert srpt_completions([0.0, 1.0], [10.0, 2.0]) == pytest.approx([12.0, 3.0])
    # Idle gaps: the machine waits for the next release.
    assert srpt_completions([0.0, 10.0], [1.0, 1.0]) == pytest.approx([1.0, 11.0])


def test_alone_bound_of_a_toy_job_is_its_exact_best_time() -> None:
    # The toy application: no noise (gain 1 at any batch), so the best rate is the
    # smallest step time, 0.1 + 0.001 * 16 s at the smallest atomic batch on one GPU.
    app = ToyApplication(epochs=3, ratio=0.0, progress_per_epoch=1000.0)
    rates = best_rates(app, num_nodes=2, gpus_per_node=4)
    step_s = app.step_sync_time((1,), 16)[0]
    assert rates.rate_per_s == pytest.approx((1 / step_s,) * 3)
    assert rates.alone_s() == pytest.approx(3 * (1000 * step_s - 0.5))
    workload = Workload("toy", (JobSpec("a", 30.0, "toy", 1, 32),))
    bound = cluster_lower_bound(workload, {"toy": app}, ClusterConfig(
        num_nodes=2, gpus_per_node=4, interval_s=60.0, restart_delay_s=30.0))
    # first round at 60 s, 30 s restart delay: 60 s after the submission at 30 s
    assert bound.job_alone_s["a"] == pytest.approx(60.0 + rates.alone_s())


def test_work_in_gpu_seconds_does_not_melt_on_a_bigger_cluster() -> None:
    # A job's work is GPU-seconds at its best per-GPU rate, whatever the cluster's size;
    # the half second an epoch's end may be rounded off spares the job's own GPUs, not the
    # whole machine's (which once took 0.5 s x 64 GPUs off each of cifar10's 100 epochs).
    app = load_applications(None)["cifar10"]
    small, big = best_rates(app, 4, 4), best_rates(app, 16, 4)
    assert big.machine_s(64) * 64 >= 0.95 * small.machine_s(16) * 16

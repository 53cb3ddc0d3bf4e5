"""The batch objective of adaptive jobs: goodput (Pollux) or throughput, statistical
efficiency ignored (the jobs of the throughput-based autoscaler). Only the choice of
batch changes; true progress still follows the true gradient statistics."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pollux.models import GoodputFunction
from pollux.policies.autoscaling import (
    AutoscalerConfig,
    BatchObjective,
    NodeTemplate,
    PolluxAutoscaler,
    ThroughputAutoscaler,
)
from pollux.policies.base import GPU
from pollux.policies.snapshot import SpeedupCache
from pollux.sim.adaptive import JobProfile
from pollux.sim.job import BatchMode, JobSpec, SimJob
from pollux.sim.simulator import ClusterConfig, Simulator
from pollux.sim.workload import Workload
from tests.sim.fakes import GreedyPolicy, ToyApplication

PLACEMENTS = [(("n0",), (1,)), (("n0", "n0"), (2,)), (("n0", "n1"), (1, 1)),
              (("n0",) * 4, (4,))]


def profiled(app: ToyApplication, objective: BatchObjective) -> JobProfile:
    """A profile that has measured the same configurations as any other built here."""
    profile = JobProfile(app.spec, objective=objective)
    sqr, var = app.grad_stats(64, 0)
    for (_alloc, placement), atomic in itertools.product(PLACEMENTS, (16, 64, 256)):
        step, sync = app.step_sync_time(placement, atomic)
        profile.observe(len(placement), sum(placement), atomic, step, sync, sqr, var)
    return profile


def chosen_batch(app: ToyApplication, profile: JobProfile, num_nodes: int,
                 num_replicas: int) -> tuple[int, int]:
    """The (atomic batch, accumulation steps) an adaptive job with ``profile`` picks on
    ``num_replicas`` spread evenly over ``num_nodes``."""
    job = SimJob(JobSpec("j", 0.0, app.name, 1, 64), app, BatchMode.ADAPTIVE,
                 batch_objective=profile.objective)
    job.profile = profile
    job.placement = (num_replicas // num_nodes,) * num_nodes
    return job._best_batch(app.spec) or (0, 0)


@pytest.mark.parametrize(("num_nodes", "num_replicas"), [(1, 1), (1, 2), (2, 2), (1, 4)])
def test_throughput_objective_picks_the_fastest_batch_no_smaller_than_goodputs(
        num_nodes: int, num_replicas: int) -> None:
    app = ToyApplication(ratio=2.0)  # noisy gradients, but large batches still lose efficiency
    by_goodput = profiled(app, BatchObjective.GOODPUT)
    by_throughput = profiled(app, BatchObjective.THROUGHPUT)
    assert by_goodput.params == by_throughput.params
    assert by_goodput.params is not None and by_goodput.grad_stats is not None
    model = GoodputFunction(by_goodput.params, by_goodput.grad_stats, app.spec.init_batch_size)
    spec = app.spec
    g_atomic, g_accum = chosen_batch(app, by_goodput, num_nodes, num_replicas)
    t_atomic, t_accum = chosen_batch(app, by_throughput, num_nodes, num_replicas)
    goodput_batch = num_replicas * g_atomic * (g_accum + 1)
    throughput_batch = num_replicas * t_atomic * (t_accum + 1)
    assert throughput_batch >= goodput_batch
    assert throughput_batch > goodput_batch  # here the two objectives truly differ
    assert spec.init_batch_size <= throughput_batch <= spec.max_batch_size

    def samples_per_s(atomic: int, accum: int) -> float:
        return float(model.throughput(num_nodes, num_replicas, atomic, accum))

    best = samples_per_s(t_atomic, t_accum)
    assert best >= samples_per_s(g_atomic, g_accum)
    for atomic in range(spec.min_local_bsz, spec.max_local_bsz + 1, 8):
        for accum in range(0, 8):
            batch = num_replicas * atomic * (accum + 1)
            if not spec.init_batch_size <= batch <= spec.max_batch_size:
                continue
            if num_replicas == 1 and batch > spec.init_batch_size and accum == 0:
                continue  # one replica above the initial batch needs an accumulation step
            assert samples_per_s(atomic, accum) <= best * (1 + 1e-6)
    # the goodput objective trades throughput for efficiency: it is better by goodput
    assert (model.evaluate(num_nodes, num_replicas, g_atomic, g_accum)
            >= model.evaluate(num_nodes, num_replicas, t_atomic, t_accum) * (1 - 1e-6))


def test_throughput_objective_reports_the_throughput_speedup() -> None:
    app = ToyApplication(ratio=2.0)
    by_goodput = profiled(app, BatchObjective.GOODPUT)
    by_throughput = profiled(app, BatchObjective.THROUGHPUT)
    goodput_fn, _ = SpeedupCache().speedups("g", by_goodput.hints())
    throughput_fn, _ = SpeedupCache().speedups("t", by_throughput.hints())
    assert goodput_fn is not None and throughput_fn is not None
    nodes, replicas = np.array([1, 1, 2]), np.array([1, 4, 4])
    # ignoring efficiency, extra replicas look at least as useful as they truly are
    assert np.all(throughput_fn(nodes, replicas) >= goodput_fn(nodes, replicas) - 1e-9)
    assert float(throughput_fn(1, 1)) == pytest.approx(1.0)


def test_true_progress_follows_the_true_gradient_statistics() -> None:
    app = ToyApplication(ratio=2.0, progress_per_epoch=1e9)
    jobs = {}
    for objective in BatchObjective:
        job = SimJob(JobSpec("j", 0.0, app.name, 1, 64), app, BatchMode.ADAPTIVE,
                     batch_objective=objective)
        assert job.profile is not None and job.profile.objective is objective
        job.profile = profiled(app, objective)
        job.reallocate(("n0",) * 4, (4,), 0.0)
        before = job.progress
        job.advance(0.0, 10.0)
        batch = job.batch_size
        step, sync = app.step_sync_time((4,), job.atomic_bsz)
        sqr, var = app.grad_stats(batch, 0)
        scale = batch / app.spec.init_batch_size
        gain = (var + sqr) / (var / scale + sqr)  # the TRUE gain, not the ignored one
        rate = gain / (step + (step - sync) * job.accum_steps)
        assert job.progress - before == pytest.approx(10.0 * rate)
        jobs[objective] = job
    assert jobs[BatchObjective.THROUGHPUT].batch_size > jobs[BatchObjective.GOODPUT].batch_size
    # with true progress, the goodput-optimal batch trains faster
    assert jobs[BatchObjective.GOODPUT].progress > jobs[BatchObjective.THROUGHPUT].progress


def test_the_simulator_takes_the_objective_from_the_autoscaler() -> None:
    app = ToyApplication()
    workload = Workload("toy", (JobSpec("a", 0.0, "toy", 4, 128),))
    cfg = AutoscalerConfig(NodeTemplate({GPU: 4.0}), 1, 2)
    config = ClusterConfig(num_nodes=2, gpus_per_node=4)
    cases = [(None, BatchObjective.GOODPUT), (PolluxAutoscaler(cfg), BatchObjective.GOODPUT),
             (ThroughputAutoscaler(cfg), BatchObjective.THROUGHPUT)]
    for autoscaler, expected in cases:
        sim = Simulator(workload, {"toy": app}, GreedyPolicy(), config, autoscaler=autoscaler)
        assert sim.batch_objective is expected
        assert all(job.profile is not None and job.profile.objective is expected
                   for job in sim.jobs)
    forced = Simulator(workload, {"toy": app}, GreedyPolicy(), config,
                       autoscaler=ThroughputAutoscaler(cfg),
                       batch_objective=BatchObjective.GOODPUT)
    assert forced.jobs[0].profile is not None
    assert forced.jobs[0].profile.objective is BatchObjective.GOODPUT

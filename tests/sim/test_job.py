from __future__ import annotations

import pytest

from pollux.policies.base import JobInfo, facts_by_type
from pollux.policies.snapshot import JobReport, SpeedupCache, job_info
from pollux.sim.applications import ApplicationSpec
from pollux.sim.job import BatchMode, JobSpec, JobState, SimJob
from tests.sim.fakes import ToyApplication

NODE = ("n0",)


def fixed_job(app: ToyApplication, batch_size: int = 64) -> SimJob:
    return SimJob(JobSpec("j", 0.0, app.name, 1, batch_size), app, BatchMode.FIXED)


def test_restart_delay_holds_gpus_without_progress() -> None:
    app = ToyApplication(epochs=1, progress_per_epoch=100.0)
    job = fixed_job(app, batch_size=32)
    assert job.state is JobState.WAITING
    job.reallocate(NODE, (1,), restart_delay_s=30.0)
    assert job.num_restarts == 0 and job.state is JobState.RESTARTING
    job.advance(0.0, 30.0)
    assert job.progress == 0.0 and job.attained_service_s == 30.0
    assert job.state is JobState.RUNNING
    # 1 replica, batch 32 = initial: atomic 32, no accumulation, 0.132 s per step, gain 1.
    assert (job.atomic_bsz, job.accum_steps) == (32, 0)
    job.advance(30.0, 10.0)
    assert job.progress == pytest.approx(10.0 / 0.132)


def test_completion_time_after_the_last_epoch() -> None:
    app = ToyApplication(epochs=2, progress_per_epoch=500.0)
    job = fixed_job(app, batch_size=32)
    job.reallocate(NODE, (1,), restart_delay_s=30.0)
    job.advance(0.0, 60.0)
    job.advance(60.0, 60.0)
    assert job.completion_time_s is None and job.epoch == 1
    job.advance(120.0, 60.0)
    # Two epochs of 500 steps at 0.132 s (66 s each, the first ending on a whole second).
    assert job.completion_time_s == 30.0 + 66.0 + 66.0
    assert job.state is JobState.COMPLETED
    assert job.attained_service_s == job.completion_time_s


def test_restarts_count_placement_changes_after_the_first() -> None:
    job = fixed_job(ToyApplication())
    job.reallocate(NODE, (1,), 30.0)
    job.reallocate((), (), 30.0)
    assert job.num_restarts == 0 and job.state is JobState.WAITING
    job.reallocate(("n0", "n1"), (1, 1), 30.0)
    assert job.num_restarts == 1 and job.restart_left_s == 30.0


def test_noise_makes_large_batches_worth_more_steps() -> None:
    quiet = fixed_job(ToyApplication(ratio=0.0), batch_size=256)
    noisy = fixed_job(ToyApplication(ratio=100.0), batch_size=256)
    for job in (quiet, noisy):
        job.reallocate(NODE, (1,), 0.0)
        job.advance(0.0, 1.0)
    assert noisy.progress > 5 * quiet.progress


@pytest.mark.parametrize(("batch", "replicas", "expected"), [
    (32768, 1, (16384, 1)),  # one replica above the initial batch: one accumulation step
    (64, 4, (8, 1)),         # yolov3: local 16 > max local 8
    (4096, 12, (341, 0)),    # capped so the total stays <= the maximum batch
    (2048, 6, (342, 0)),
])
def test_fixed_batch_configurations(batch: int, replicas: int, expected: tuple[int, int]
                                    ) -> None:
    specs = {32768: ApplicationSpec("ncf", 256, 32768, 32, 32768, 10),
             64: ApplicationSpec("yolov3", 8, 512, 4, 8, 50),
             4096: ApplicationSpec("cifar10", 128, 4096, 32, 1024, 100),
             2048: ApplicationSpec("cifar10", 128, 4096, 32, 1024, 100)}
    spec = specs[batch]
    atomic, accum = spec.fixed_batch_config(batch, replicas)
    assert (atomic, accum) == expected
    assert replicas * atomic * (accum + 1) <= spec.max_batch_size


def policy_view(job: SimJob) -> JobInfo:
    """What the policy sees of ``job`` from its hints (pollux.policies.snapshot)."""
    report = JobReport(job.name, {"gpu": 1.0}, submission_time_s=0.0,
                       by_type=facts_by_type(job.app.spec.max_useful_replicas),
                       num_held_replicas=len(job.allocation), hints=job.hints())
    return job_info(report, 0.0, SpeedupCache())


def test_adaptive_job_profiles_and_refits_on_new_configurations() -> None:
    app = ToyApplication(ratio=50.0)
    job = SimJob(JobSpec("j", 0.0, app.name, 1, 64), app, BatchMode.ADAPTIVE)
    assert job.profile is not None
    view = policy_view(job)
    assert view.max_replicas == 1 and view.on().speedup_fn is None  # None: linear, no profile
    job.reallocate(NODE, (1,), 0.0)
    assert job.batch_size == 32  # no model yet: the initial batch
    job.advance(0.0, 60.0)
    assert job.profile.params is not None and policy_view(job).max_replicas == 2
    job.reallocate(("n0", "n0"), (2,), 0.0)
    job.advance(60.0, 60.0)
    assert job.profile.max_profiled_replicas == 2 and policy_view(job).max_replicas == 4
    assert job.profile.num_fits >= 2
    speedup = policy_view(job).on().speedup_fn
    assert speedup is not None and float(speedup(1, 2)) > 1.0


def test_oracle_knowledge_uses_the_true_model_after_the_first_measurement() -> None:
    from pollux.models.throughput import optimizer_step_time
    from pollux.sim.oracle import true_throughput_params
    from pollux.sim.placement import packed_placement

    app = ToyApplication(ratio=50.0)
    truth = true_throughput_params(app, gpus_per_node=4, max_replicas=16)
    for replicas in (1, 2, 4, 8, 16):  # the fitted model reproduces the true step times
        placement = packed_placement(replicas, 4)
        for bsz in (16, 32, 64):
            step, _ = app.step_sync_time(placement, float(bsz))
            assert float(optimizer_step_time(truth, len(placement), replicas, bsz)) == \
                pytest.approx(step, rel=0.05), (replicas, bsz)
    job = SimJob(JobSpec("j", 0.0, app.name, 1, 64), app, BatchMode.ADAPTIVE,
                 known_params=truth)
    assert job.profile is not None
    assert policy_view(job).on().speedup_fn is None  # still no model before measuring
    job.reallocate(("n0", "n0"), (2,), 0.0)
    job.advance(0.0, 60.0)
    assert job.profile.params is truth and job.profile.num_fits == 0
    job.update_batch()
    assert (job.atomic_bsz, job.accum_steps) == job._oracle_batch()


def test_unknown_job_knowledge_names_the_choices() -> None:
    from pollux.errors import ConfigError
    from pollux.policies import make_policy
    from pollux.sim.simulator import Simulator
    from pollux.sim.workload import Workload

    app = ToyApplication()
    workload = Workload("w", (JobSpec("j", 0.0, app.name, 1, 64),))
    with pytest.raises(ConfigError, match="job_knowledge.*measured, oracle"):
        Simulator(workload, {app.name: app}, make_policy("pollux"), job_knowledge="psychic")

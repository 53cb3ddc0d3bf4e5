"""One job model per GPU type (``JobFacts.by_type``) and the traits every policy declares."""

from __future__ import annotations

import pytest

from pollux.errors import ConfigError
from pollux.models import GradientStats, ThroughputParams
from pollux.models.typed import TypedGoodput, TypeProfile, TypeSpeedup
from pollux.policies.base import (
    JobInfo,
    Policy,
    TypeFacts,
    facts_by_type,
    typed_facts,
)
from pollux.policies.registry import load_policy_class, policy_names
from pollux.resources import DEFAULT_GPU_TYPE

PARAMS = ThroughputParams(alpha_c=0.05, beta_c=0.002, alpha_n=0.15, beta_n=0.01,
                          alpha_r=0.04, beta_r=0.004, gamma=1.8)


def test_a_homogeneous_job_has_one_entry_and_every_type_reads_it() -> None:
    job = JobInfo("a", {"gpu": 1.0}, by_type=facts_by_type(4, remaining_time_fn=None))
    assert list(job.by_type) == [DEFAULT_GPU_TYPE]
    assert job.max_replicas == 4 == job.on().max_replicas == job.on("t4").max_replicas
    assert job.own("t4") is None and job.own(DEFAULT_GPU_TYPE) is None
    assert job.own_caps() == {} and job.typed_goodput is None
    assert JobInfo("b", {"gpu": 1.0}).by_type == {DEFAULT_GPU_TYPE: TypeFacts()}


def test_a_typed_job_sees_its_one_model_per_type() -> None:
    model = TypedGoodput({"aws": TypeProfile(PARAMS, 2)}, GradientStats(1.0, 20.0), 64, 4096,
                         (16, 256), True, {"aws": 1.0, "rtx": 2.0})
    caps = {"aws": 4, "rtx": 1, "t4": 2}  # t4: no speed, so no model there
    job = JobInfo("a", {"gpu": 1.0}, by_type=facts_by_type(8, per_type=typed_facts(caps, model)))
    assert job.own_caps() == caps and job.max_replicas == 8
    assert job.typed_goodput is model
    rtx = job.on("rtx").speedup_fn
    assert isinstance(rtx, TypeSpeedup) and rtx.gpu_type == "rtx"
    assert float(rtx(1, 1)) == float(model.speedup("rtx", 1, 1)) == pytest.approx(2.0)
    assert job.on("t4").speedup_fn is None  # a type without a model has none
    assert job.on("a100") is job.by_type[DEFAULT_GPU_TYPE]  # no entry: the default's
    slower = job.with_default(max_replicas=3)
    assert slower.max_replicas == 3 and slower.own_caps() == caps


def test_a_record_without_the_default_entry_is_refused() -> None:
    with pytest.raises(ConfigError, match="by_type"):
        JobInfo("a", {"gpu": 1.0}, by_type={"aws": TypeFacts(4)})


def test_policy_traits_are_declared_with_their_defaults() -> None:
    class Bare(Policy):
        name = "bare"

        def optimize(self, jobs, nodes, previous_allocations):  # type: ignore[no-untyped-def]
            raise NotImplementedError

    assert (Bare.adaptive_jobs, Bare.heterogeneity_aware, Bare.pooled_limits_type) == (
        True, True, None)
    classes = {name: load_policy_class(name) for name in policy_names()}
    for cls in classes.values():
        assert isinstance(cls.adaptive_jobs, bool), cls
        assert isinstance(cls.heterogeneity_aware, bool), cls
        assert cls.pooled_limits_type is None or isinstance(cls.pooled_limits_type, str), cls
    assert not classes["optimus"].adaptive_jobs and classes["sia"].adaptive_jobs
    assert not classes["pollux-unaware"].heterogeneity_aware

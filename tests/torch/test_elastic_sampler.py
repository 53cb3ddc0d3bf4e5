"""The elastic sampler: every sample exactly once per epoch, whatever the resizing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pollux.errors import ConfigError
from pollux.torch.elastic_sampler import ElasticSampler, epoch_order, plan_step

segment = st.tuples(st.integers(1, 5),    # replicas
                    st.integers(1, 9),    # atomic batch
                    st.integers(0, 3),    # accumulation steps
                    st.integers(1, 6))    # steps before the next resize / restart


@settings(max_examples=150, deadline=None)
@given(num_samples=st.integers(1, 300), seed=st.integers(0, 2**31), epoch=st.integers(0, 5),
       segments=st.lists(segment, min_size=1, max_size=12))
def test_every_sample_exactly_once_across_resizes_and_restarts(
        num_samples: int, seed: int, epoch: int,
        segments: list[tuple[int, int, int, int]]) -> None:
    sampler = ElasticSampler(num_samples, seed=seed)
    sampler.set_epoch(epoch)
    consumed: list[int] = []
    padding_total = 0
    i = 0
    while sampler.remaining > 0:
        replicas, bsz, accum, num_steps = segments[i % len(segments)]
        i += 1
        # A restart: a new sampler restored from the old one's checkpoint.
        restored = ElasticSampler(num_samples, seed=seed)
        restored.load_state_dict(sampler.state_dict())
        sampler = restored
        for _ in range(num_steps):
            plan = sampler.plan(replicas, bsz, accum)
            if plan is None:
                break
            sizes = {len(b) for batches in plan.batches for b in batches}
            assert len(plan.batches) == replicas
            assert {len(batches) for batches in plan.batches} == {plan.num_micro_steps}
            assert plan.num_micro_steps <= accum + 1
            assert max(sizes) <= bsz and min(sizes) >= 1
            assert 0 <= plan.num_padding < replicas
            if plan.regular:
                assert sizes == {bsz} and plan.num_padding == 0
            for r, batches in enumerate(plan.batches):
                for j, batch in enumerate(batches):
                    real = len(batch) - plan.num_padding_in(r, j)
                    consumed.extend(batch[:real].tolist())
            # Each replica gets the same number of samples in the step.
            assert len({sum(len(b) for b in batches) for batches in plan.batches}) == 1
            padding_total += plan.num_padding
            sampler.commit(plan)
    assert sorted(consumed) == list(range(num_samples))
    assert padding_total < max(s[0] for s in segments)


def test_padding_is_reported_and_comes_from_the_epoch_start() -> None:
    order = epoch_order(10, epoch=0, seed=3)
    plan = plan_step(order, start=8, num_replicas=3, local_bsz=4, accum_steps=0)
    assert plan.num_samples == 2 and plan.num_padding == 1
    assert not plan.regular
    flat = np.concatenate([b for batches in plan.batches for b in batches])
    assert flat.tolist() == [order[8], order[9], order[0]]
    assert [plan.num_padding_in(r, 0) for r in range(3)] == [0, 0, 1]


def test_epoch_order_is_seeded_and_changes_per_epoch() -> None:
    a = epoch_order(50, epoch=1, seed=7)
    assert np.array_equal(a, epoch_order(50, epoch=1, seed=7))
    assert not np.array_equal(a, epoch_order(50, epoch=2, seed=7))
    assert sorted(a.tolist()) == list(range(50))
    assert epoch_order(5, epoch=3, seed=0, shuffle=False).tolist() == [0, 1, 2, 3, 4]


def test_set_epoch_keeps_the_cursor_of_the_same_epoch() -> None:
    sampler = ElasticSampler(20, seed=1)
    sampler.set_epoch(2)
    plan = sampler.plan(2, 3, 0)
    assert plan is not None
    sampler.commit(plan)
    sampler.set_epoch(2)
    assert sampler.position == 6
    sampler.set_epoch(3)
    assert sampler.position == 0


def test_restoring_with_another_seed_or_size_is_refused() -> None:
    state = ElasticSampler(20, seed=1).state_dict()
    with pytest.raises(ConfigError, match="seed"):
        ElasticSampler(20, seed=2).load_state_dict(state)
    with pytest.raises(ConfigError, match="num_samples"):
        ElasticSampler(21, seed=1).load_state_dict(state)


def test_commit_out_of_order_is_refused() -> None:
    sampler = ElasticSampler(20)
    first = sampler.plan(1, 4, 0)
    assert first is not None
    sampler.commit(first)
    with pytest.raises(ConfigError, match="in order"):
        sampler.commit(first)


@pytest.mark.parametrize("kwargs, field", [
    ({"num_replicas": 0}, "num_replicas"), ({"local_bsz": 0}, "local_bsz"),
    ({"accum_steps": -1}, "accum_steps"), ({"start": 10}, "start"),
])
def test_plan_step_rejects_bad_input(kwargs: dict[str, int], field: str) -> None:
    args = {"start": 0, "num_replicas": 1, "local_bsz": 2, "accum_steps": 0, **kwargs}
    with pytest.raises(ConfigError, match=field):
        plan_step(epoch_order(10, 0, 0), **args)

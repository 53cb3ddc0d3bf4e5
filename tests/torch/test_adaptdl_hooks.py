"""The agent's hooks the AdaptDL-shaped API needs: several named models per job
(followers), and AdamScale's noise measured on Adam-preconditioned gradients."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch

import pollux.torch as pt
from pollux.errors import ConfigError
from pollux.torch.adam_scale import AdamGainScale, AdamPreconditioner


@pytest.fixture
def job() -> Iterator[pt.JobContext]:
    context = pt.init_process_group("gloo", checkpoint_dir="", environ={},
                                    install_signal_handler=False)
    yield context
    context.close()


def train_steps(model: pt.AdaptiveDataParallel, optimizers: list[torch.optim.Optimizer],
                steps: int, loss_scale: float = 1.0, extra: torch.nn.Module | None = None,
                num_micro: int = 2) -> None:
    """``steps`` optimizer steps of ``num_micro`` micro-batches of 8 on one replica (as
    the loader drives them: with one micro-batch, every few steps are paired)."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        for micro in range(num_micro):
            model.begin_micro_step(micro, num_micro, 8, 8 * num_micro, 16, True,
                                   probe=num_micro == 1 and model.wants_probe())
            x = torch.randn(8, 20, generator=gen)
            out = model(x)
            if extra is not None:
                out = out + extra(x)
            loss = loss_scale * (out - x[:, :1]).square().mean()
            loss.backward()
            for optimizer in optimizers:
                optimizer.step()
                optimizer.zero_grad()


def mean_sqr_norm(model: pt.AdaptiveDataParallel, batch_size: int = 8) -> float:
    """The mean squared norm of a gradient over ``batch_size`` samples the estimates
    imply, ``|G|^2 + tr(Sigma) / b`` (positive, unlike each estimate alone)."""
    ema_sqr, ema_trace, weight, _ = model.noise.raw().tolist()
    return (ema_sqr + ema_trace / batch_size) / weight


@pytest.mark.parametrize("num_micro", [2, 1])  # accumulation; pairs of steps
@pytest.mark.parametrize("rule", [AdamGainScale(), pt.SqrtScale()])
def test_adamscale_measures_the_noise_of_preconditioned_gradients(
        job: pt.JobContext, rule: pt.ScalingRule, num_micro: int) -> None:
    torch.manual_seed(0)
    net = torch.nn.Linear(20, 1)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    model = pt.AdaptiveDataParallel(net, optimizer, scaling_rule=rule, job=job)
    train_steps(model, [optimizer], steps=13 * (3 - num_micro), loss_scale=1e4,
                num_micro=num_micro)
    norm = mean_sqr_norm(model)
    if isinstance(rule, AdamGainScale):
        # g / (sqrt(v_hat) + eps) is O(1) per coordinate: 21 parameters' worth
        assert 0 < norm < 21 * 4, norm
    else:  # the raw gradients of a loss scaled by 1e4
        assert norm > 1e6, norm


def test_the_preconditioner_reads_buckets_like_gradients_and_waits_for_adam() -> None:
    net = torch.nn.Linear(4, 3)
    optimizer = torch.optim.Adam(net.parameters(), lr=0.1)
    net(torch.randn(5, 4)).square().sum().backward()
    pre = AdamPreconditioner(optimizer)
    assert math.isnan(pre.squared_norm(net.parameters()).item())  # no Adam step yet
    optimizer.step()
    params = list(net.parameters())
    flat = torch.cat([p.grad.flatten() for p in params])  # type: ignore[union-attr]
    expected = sum(float((p.grad / pre.divisor(p)).square().sum())  # type: ignore[operator]
                   for p in params)
    assert pre.squared_norm(params).item() == pytest.approx(expected)
    assert pre.squared_norm(params, flat).item() == pytest.approx(expected)
    state = optimizer.state[params[0]]
    v_hat = state["exp_avg_sq"] / (1 - 0.999 ** float(state["step"]))
    assert torch.allclose(pre.divisor(params[0]), v_hat.sqrt() + 1e-8)  # type: ignore[arg-type]


def test_a_second_model_needs_its_own_name(job: pt.JobContext) -> None:
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    pt.AdaptiveDataParallel(a, torch.optim.SGD(a.parameters(), lr=0.1), job=job)
    with pytest.raises(ConfigError, match="name="):
        pt.AdaptiveDataParallel(b, torch.optim.SGD(b.parameters(), lr=0.1), job=job)
    pt.AdaptiveDataParallel(b, torch.optim.SGD(b.parameters(), lr=0.1), job=job, name="b")
    with pytest.raises(ConfigError, match="name="):
        pt.AdaptiveDataParallel(b, torch.optim.SGD(b.parameters(), lr=0.1), job=job, name="b")


def test_a_follower_accumulates_with_the_leader_and_measures_its_own_noise(
        job: pt.JobContext) -> None:
    torch.manual_seed(0)
    lead_net, follow_net = torch.nn.Linear(20, 1), torch.nn.Linear(20, 1)
    lead_opt = torch.optim.SGD(lead_net.parameters(), lr=0.01)
    follow_opt = torch.optim.SGD(follow_net.parameters(), lr=0.01)
    leader = pt.AdaptiveDataParallel(lead_net, lead_opt, job=job, name="d")
    follower = pt.AdaptiveDataParallel(follow_net, follow_opt, job=job, name="g")
    assert job.model is leader and job.followers() == [follower]
    train_steps(leader, [lead_opt, follow_opt], steps=9, extra=follower)
    # the follower's optimizer stepped once per leader step, not once per micro-batch
    assert leader.optimizer_steps == follower.optimizer_steps == 9
    assert follower.noise.num_updates >= 1 and mean_sqr_norm(follower) > 0
    leader.set_grad_stats(None)  # an agreement point: the follower reads its own stats
    assert follower.grad_stats is None  # fewer than min_noise_updates (10) so far
    train_steps(leader, [lead_opt, follow_opt], steps=40, extra=follower)
    leader.set_grad_stats(None)
    assert follower.grad_stats is not None and follower.grad_stats.var > 0


def test_a_job_of_several_models_splits_no_step_to_probe_the_noise(
        job: pt.JobContext) -> None:
    """A GAN's loop steps the discriminator, then back-propagates the generator's loss
    through it: a step split in two micro-batches would keep those gradients for the
    discriminator's next micro-batch, so one replica takes no probes there."""
    d, g = torch.nn.Linear(2, 1), torch.nn.Linear(1, 2)
    disc = pt.AdaptiveDataParallel(d, torch.optim.SGD(d.parameters(), lr=0.1), job=job,
                                   name="d")
    assert disc.wants_probe()  # alone: every probe_interval_steps-th step
    pt.AdaptiveDataParallel(g, torch.optim.SGD(g.parameters(), lr=0.1), job=job, name="g")
    assert not any(disc.wants_probe(ahead) for ahead in range(8))

"""AdaptiveDataParallel in one process: accumulation, learning-rate rules, AMP, Adam."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

import pollux.torch as pt
from pollux.errors import ConfigError
from pollux.torch.scaling_rules import ScalingRule


@pytest.fixture(scope="module", autouse=True)
def process_group() -> Iterator[None]:
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if created:
        dist.destroy_process_group()


def new_job(**config: float) -> pt.JobContext:
    config.setdefault("noise_interval_steps", 1)  # statistics on every step unless asked
    return pt.init_process_group("gloo", config=pt.AgentConfig(**config),  # type: ignore[arg-type]
                                 install_signal_handler=False, environ={},
                                 checkpoint_dir="")


def dataset(num_samples: int = 32, seed: int = 0) -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_samples, 4, generator=generator)
    y = torch.randn(num_samples, 3, generator=generator)
    return torch.utils.data.TensorDataset(x, y)


def net(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Linear(4, 3)


def test_accumulated_micro_batches_equal_one_big_batch() -> None:
    job = new_job()
    data = dataset()
    reference = net()
    model_net = copy.deepcopy(reference)
    optimizer = torch.optim.SGD(model_net.parameters(), lr=0.1)
    model = pt.AdaptiveDataParallel(model_net, optimizer, job=job)
    loader = pt.AdaptiveDataLoader(data, batch_size=32, job=job, shuffle=False)
    loader.autoscale_batch_size(64, (8, 8), gradient_accumulation=True)
    seen = []
    for x, y in loader:  # pattern: zero_grad first, step after every batch
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        before = [p.detach().clone() for p in model_net.parameters()]
        optimizer.step()
        seen.append(loader.batch_info)
        if model.accumulating:
            assert all(torch.equal(a, b) for a, b in zip(before, model_net.parameters()))
    assert [info.micro_step for info in seen] == [0, 1, 2, 3]  # type: ignore[union-attr]
    assert model.optimizer_steps == 1 and model.progress == pytest.approx(1.0)

    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    x, y = data.tensors
    torch.nn.functional.mse_loss(reference(x), y).backward()
    ref_opt.step()
    for got, want in zip(model_net.parameters(), reference.parameters()):
        torch.testing.assert_close(got, want)


def test_zero_grad_after_step_keeps_accumulating() -> None:
    job = new_job()
    model_net = net()
    optimizer = torch.optim.SGD(model_net.parameters(), lr=0.0)
    model = pt.AdaptiveDataParallel(model_net, optimizer, job=job)
    loader = pt.AdaptiveDataLoader(dataset(), batch_size=32, job=job, shuffle=False)
    loader.autoscale_batch_size(64, (16, 16), gradient_accumulation=True)
    grads = []
    for x, y in loader:  # pattern: step and zero_grad after every batch
        torch.nn.functional.mse_loss(model(x), y).backward()
        grads.append(model_net.weight.grad.detach().clone())  # type: ignore[union-attr]
        optimizer.step()
        optimizer.zero_grad()
        model.zero_grad()
    assert len(grads) == 2
    assert not torch.equal(grads[0], grads[1])  # the second one accumulated on the first
    assert model_net.weight.grad is None  # cleared once the real step was taken
    assert model.noise.num_updates == 1  # one replica, two micro-batches: one estimate


def test_statistics_every_nth_step_decay_as_much_per_update() -> None:
    def run(interval: int) -> pt.AdaptiveDataParallel:
        job = new_job(noise_interval_steps=interval)
        model = pt.AdaptiveDataParallel(net(), torch.optim.SGD(net().parameters(), lr=0.0),
                                        job=job)
        loader = pt.AdaptiveDataLoader(dataset(7 * 32), batch_size=32, job=job,
                                       shuffle=False)
        loader.autoscale_batch_size(64, (16, 16), gradient_accumulation=True)
        for x, y in loader:  # one replica, 32 per step as 2 micro-batches of 16
            torch.nn.functional.mse_loss(model(x), y).backward()
            model.optimizer.step()
            model.optimizer.zero_grad()
        assert model.optimizer_steps == 7
        return model

    every, third = run(1), run(3)
    assert every.noise.num_updates == 7
    assert third.noise.num_updates == 3  # steps 0, 3 and 6
    # the averages' total weight after 3 updates of 3 steps equals 9 single-step ones
    beta = pt.AgentConfig().noise_smoothing  # every step at the initial batch: scale 1
    weight_third = float(third.noise.raw()[2])
    assert weight_third == pytest.approx(1 - beta ** 9, rel=1e-9)
    assert float(every.noise.raw()[2]) == pytest.approx(1 - beta ** 7, rel=1e-9)
    with pytest.raises(ConfigError, match="noise_interval_steps"):
        pt.AgentConfig(noise_interval_steps=0)


class Triple(ScalingRule):
    def lr_factor(self, scale: float, gain: float, progress: float) -> float:
        return 3.0


def test_learning_rate_is_scaled_only_during_the_step_and_schedulers_still_work() -> None:
    job = new_job()
    model_net = net()
    optimizer = torch.optim.SGD(model_net.parameters(), lr=0.5)
    model = pt.AdaptiveDataParallel(model_net, optimizer, scaling_rule=Triple(), job=job)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    during = []
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: during.append(
        opt.param_groups[0]["lr"]))
    loader = pt.AdaptiveDataLoader(dataset(), batch_size=16, job=job)
    for x, y in loader:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        scheduler.step()
    assert during == [pytest.approx(1.5), pytest.approx(0.75)]
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.125)
    assert model.lr_factor == 3.0


def test_adam_gets_sqrt_scaling_and_keeps_its_moments_across_batch_changes() -> None:
    job = new_job()
    model_net = net()
    optimizer = torch.optim.Adam(model_net.parameters(), lr=1e-3)
    model = pt.AdaptiveDataParallel(model_net, optimizer, job=job)
    assert isinstance(model.scaling_rule, pt.SqrtScale)
    assert isinstance(pt.default_scaling_rule(torch.optim.SGD(net().parameters(), lr=1)),
                      pt.AdaScale)
    x, y = dataset().tensors
    moments = None
    for local_bsz in (8, 16, 32):  # the batch size changes between steps
        model.begin_micro_step(0, 1, local_bsz=local_bsz, step_batch_size=local_bsz,
                               init_batch_size=8, regular=True)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x[:local_bsz]), y[:local_bsz]).backward()
        optimizer.step()
        state = optimizer.state[model_net.weight]
        if moments is not None:
            assert state["exp_avg"] is moments  # same tensor, updated in place
        moments = state["exp_avg"]
        assert model.lr_factor == pytest.approx((local_bsz / 8) ** 0.5)
    assert int(optimizer.state[model_net.weight]["step"]) == 3


def run_scaled(scaler: torch.amp.GradScaler | None, poison_step: int | None = None
               ) -> tuple[pt.AdaptiveDataParallel, list[float]]:
    job = new_job()
    model_net = net()
    optimizer = torch.optim.SGD(model_net.parameters(), lr=0.0)
    model = pt.AdaptiveDataParallel(model_net, optimizer, job=job, grad_scaler=scaler)
    loader = pt.AdaptiveDataLoader(dataset(64), batch_size=32, job=job, shuffle=False)
    loader.autoscale_batch_size(64, (16, 16), gradient_accumulation=True)
    progress = []
    for i, (x, y) in enumerate(loader):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        if poison_step is not None and i // 2 == poison_step:
            loss = loss * float("inf")
        (scaler.scale(loss) if scaler is not None else loss).backward()
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        progress.append(model.progress)
    return model, progress


def test_grad_scaler_statistics_match_unscaled_ones() -> None:
    plain, _ = run_scaled(None)
    scaled, _ = run_scaled(torch.amp.GradScaler("cpu", init_scale=1024.0))
    assert plain.noise.num_updates == scaled.noise.num_updates == 2
    torch.testing.assert_close(scaled.noise.raw(), plain.noise.raw(), rtol=1e-4, atol=0)


def test_overflowing_step_is_skipped_by_the_statistics_and_the_progress() -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    model, progress = run_scaled(scaler, poison_step=0)
    assert model.optimizer_steps == 1  # the poisoned step was skipped, the next one ran
    assert model.noise.num_updates == 1
    assert progress == [0.0, 0.0, 0.0, 1.0]
    assert scaler.get_scale() == 512.0  # one overflow: the scale backed off once


def test_a_checkpoint_mid_accumulation_replays_the_unfinished_step(tmp_path: object) -> None:
    def start(directory: str) -> tuple[pt.AdaptiveDataParallel, pt.AdaptiveDataLoader,
                                       pt.JobContext]:
        job = pt.init_process_group("gloo", checkpoint_dir=directory,
                                    install_signal_handler=False, environ={})
        model_net = net()
        optimizer = torch.optim.SGD(model_net.parameters(), lr=0.1)
        model = pt.AdaptiveDataParallel(model_net, optimizer, job=job)
        loader = pt.AdaptiveDataLoader(dataset(48), batch_size=16, job=job, seed=5)
        loader.autoscale_batch_size(64, (4, 4), gradient_accumulation=True)
        return model, loader, job

    directory = str(tmp_path)
    model, loader, job = start(directory)
    seen: list[list[int]] = []
    for i, (x, y) in enumerate(loader):
        info = loader.batch_info
        assert info is not None
        seen.append(info.indices.tolist())
        torch.nn.functional.mse_loss(model(x), y).backward()
        model.optimizer.step()
        model.optimizer.zero_grad()
        if i == 5:  # second micro-batch of the second step (4 micro-steps of 4)
            job.checkpoint.save()
            break
    assert model.optimizer_steps == 1
    model, loader, job = start(directory)
    assert model.optimizer_steps == 1
    replay, starts = [], []
    for _batch in loader:
        info = loader.batch_info
        assert info is not None
        replay.append(info.indices.tolist())
        starts.append(info.step_start)
        if len(replay) == 4:
            break
    # The unfinished step starts again from its first micro-batch: nothing is lost.
    assert starts == [16] * 4
    assert replay[:2] == seen[4:6]

"""The data loader as a user sees it (issue #25): PyTorch's defaults, ``drop_last``,
full-size batches and an honest ``len()`` on one replica, and evaluation passes that
are neither profiled nor reported as training."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import pollux.torch as pt

NUM_SAMPLES = 200


@pytest.fixture
def job(tmp_path: Path) -> Iterator[pt.JobContext]:
    config = pt.AgentConfig(min_goodput_gain=1e9, min_noise_updates=1, log_level=None)
    context = pt.init_process_group("gloo", checkpoint_dir="", environ={}, config=config,
                                    install_signal_handler=False)
    yield context
    context.close()


def dataset(n: int = NUM_SAMPLES) -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=generator)
    return torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True), torch.arange(n))


def model_of(job: pt.JobContext) -> tuple[pt.AdaptiveDataParallel, torch.optim.Optimizer]:
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    return pt.AdaptiveDataParallel(net, optimizer, job=job), optimizer


def train_pass(loader: pt.AdaptiveDataLoader, model: pt.AdaptiveDataParallel,
               optimizer: torch.optim.Optimizer) -> list[tuple[int, int]]:
    """One pass of ordinary training; returns (batch length, len(loader)) per batch."""
    seen = []
    for x, y, _ in loader:
        seen.append((len(x), len(loader)))
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return seen


def test_defaults_are_pytorchs(job: pt.JobContext) -> None:
    model, _ = model_of(job)
    loader = pt.AdaptiveDataLoader(dataset(), batch_size=16, job=job)
    order = [int(i) for _, _, indices in loader for i in indices]
    assert order == list(range(NUM_SAMPLES))  # shuffle=False, as in DataLoader
    loader.autoscale_batch_size(64)
    assert loader.limits.accumulation is False  # accumulation only when asked
    shuffled = pt.AdaptiveDataLoader(dataset(), batch_size=16, shuffle=True, job=job)
    assert [int(i) for _, _, indices in shuffled for i in indices] != order


def test_an_autoscaled_loader_on_one_replica_hands_out_full_batches_and_counts_them(
        job: pt.JobContext) -> None:
    model, optimizer = model_of(job)
    loader = pt.AdaptiveDataLoader(dataset(), batch_size=16, job=job)
    loader.autoscale_batch_size(128, local_bsz_bounds=(8, 64))
    assert len(loader) == 13  # 12 x 16 + 8
    seen = train_pass(loader, model, optimizer)
    assert [size for size, _ in seen] == [16] * 12 + [8]  # never two half batches
    assert {length for _, length in seen} == {13} and len(loader) == 13
    assert model.optimizer_steps == 13
    # the noise is still measured, from consecutive steps' gradients
    assert model.noise.num_updates == 3  # steps 0-1, 4-5, 8-9 (12 is the short one)


def test_drop_last_drops_the_incomplete_last_step(job: pt.JobContext) -> None:
    model, optimizer = model_of(job)
    loader = pt.AdaptiveDataLoader(dataset(), batch_size=16, drop_last=True, job=job)
    assert len(loader) == 12
    for _ in pt.remaining_epochs_until(2, job):
        seen = train_pass(loader, model, optimizer)
        assert [size for size, _ in seen] == [16] * 12
        assert len(loader) == 12
    assert model.optimizer_steps == 24


def test_an_evaluation_pass_is_not_profiled_as_training(job: pt.JobContext) -> None:
    model, optimizer = model_of(job)
    train = pt.AdaptiveDataLoader(dataset(), batch_size=16, job=job)
    evaluation = pt.AdaptiveDataLoader(dataset(), batch_size=16, job=job)
    train_pass(train, model, optimizer)
    model.eval()
    with torch.no_grad():
        for x, _, _ in evaluation:
            model(x)
    model.train()
    job.profiler.collect()
    totals = job.profiler.state_dict()["totals"]["1,1,16"]
    warmup = job.config.profile_warmup_steps
    assert totals[2] == 12 - warmup  # optimizer steps timed: the training pass's only
    assert train.trains is True and evaluation.trains is False

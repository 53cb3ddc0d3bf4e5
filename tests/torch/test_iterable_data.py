"""Adaptive batch sizes over an IterableDataset and over a map-style data set with a custom
sampler, and their resume after a stop (issue #29): exact where the data set offers
``state_dict``/``load_state_dict`` (or, for a sampler, always: the drawn order is
checkpointed); a stream without a state is read again and the consumed samples skipped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import pollux.torch as pt
from pollux.errors import ConfigError
from pollux.jobenv import RESCALE_EXIT_CODE
from pollux.torch.batch_size import BatchConfig
from pollux.torch.data_sources import StreamReader
from tests.torch.loop_scripts import CONFIG, train_step

NUM_SAMPLES = 100


class Stream(torch.utils.data.IterableDataset[tuple[torch.Tensor, int]]):
    """Samples 0..n-1 in order; counts how many it produced (reads)."""

    def __init__(self, n: int = NUM_SAMPLES) -> None:
        self.n = n
        self.reads = 0
        self.epochs: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)

    def _from(self, start: int) -> Iterator[tuple[torch.Tensor, int]]:
        for i in range(start, self.n):
            self.reads += 1
            yield torch.full((4,), float(i)), i

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int]]:
        return self._from(0)


class StatefulStream(Stream):
    """A stream with torchdata's protocol: its state is how far its iterator got."""

    def __init__(self, n: int = NUM_SAMPLES) -> None:
        super().__init__(n)
        self.position = 0
        self._resume_at = 0

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int]]:
        start, self._resume_at = self._resume_at, 0
        self.position = start
        for item in self._from(start):
            self.position += 1
            yield item

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resume_at = int(state["position"])


class RandomSampler:
    """An unseeded sampler with replacement (as WeightedRandomSampler): its orders
    cannot be drawn again; records each order it draws."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.draws: list[list[int]] = []

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        order = np.random.default_rng().integers(0, self.n, self.n).tolist()
        self.draws.append(order)
        return iter(order)


class ScriptedDecider:
    """Local batch ``sizes[k]`` at the k-th agreement point (then the last one)."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes
        self.calls = 0

    def decide(self, *args: Any, **kwargs: Any) -> BatchConfig:
        size = self.sizes[min(self.calls, len(self.sizes) - 1)]
        self.calls += 1
        return BatchConfig(size)


def start(checkpoint_dir: Path) -> pt.JobContext:
    return pt.init_process_group("gloo", checkpoint_dir=str(checkpoint_dir), environ={},
                                 config=CONFIG, install_signal_handler=False)


def model_of(job: pt.JobContext) -> tuple[pt.AdaptiveDataParallel, torch.optim.Optimizer]:
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=1e-4)
    return pt.AdaptiveDataParallel(net, optimizer, job=job), optimizer


def adaptive(loader: pt.AdaptiveDataLoader, sizes: list[int]) -> None:
    loader.autoscale_batch_size(64, local_bsz_bounds=(1, 32))
    loader._control._decider = ScriptedDecider(sizes)  # type: ignore[assignment]


def test_an_iterable_dataset_trains_at_changing_batch_sizes_every_sample_once(
        tmp_path: Path) -> None:
    job = start(tmp_path / "ckpt")
    model, optimizer = model_of(job)
    stream = Stream()
    loader = pt.AdaptiveDataLoader(stream, batch_size=4, job=job)
    adaptive(loader, [4, 4, 4, 12])
    passes = []
    for _epoch in range(2):
        sizes, seen = [], []
        for x, index in loader:
            sizes.append(len(x))
            seen.extend(index.tolist())
            train_step(model, optimizer, x)
        passes.append((sizes, seen))
    first, second = passes
    assert first[0][:3] == [4, 4, 4] and set(first[0][3:-1]) == {12}  # grew mid-pass
    assert sum(first[0]) == NUM_SAMPLES and first[1] == list(range(NUM_SAMPLES))
    assert second[1] == list(range(NUM_SAMPLES))  # a second pass is full too
    assert stream.epochs == [0, 1] and job.epoch == 2
    assert stream.reads == 2 * NUM_SAMPLES
    with pytest.raises(TypeError, match="no len"):
        len(loader)
    job.close()


def stream_run(stream: Stream, checkpoint_dir: Path, stop_after: int | None,
               seen: list[int]) -> pt.JobContext:
    job = start(checkpoint_dir)
    model, optimizer = model_of(job)
    loader = pt.AdaptiveDataLoader(stream, batch_size=8, job=job)
    adaptive(loader, [8, 8, 5])  # a new size before the stop, kept after the restart
    for _epoch in pt.remaining_epochs_until(1, job):
        for number, (x, index) in enumerate(loader):
            seen.extend(index.tolist())
            train_step(model, optimizer, x)
            if number == stop_after:
                job.request_stop()
    return job


@pytest.mark.parametrize("stateful", [True, False])
def test_a_stopped_stream_resumes_with_every_sample_once(tmp_path: Path,
                                                          stateful: bool) -> None:
    seen: list[int] = []
    stream = StatefulStream() if stateful else Stream()
    with pytest.raises(SystemExit) as stopped:
        stream_run(stream, tmp_path / "ckpt", 4, seen)
    assert stopped.value.code == RESCALE_EXIT_CODE
    consumed = len(seen)
    assert 0 < consumed < NUM_SAMPLES
    restarted = StatefulStream() if stateful else Stream()  # a new process's data set
    stream_run(restarted, tmp_path / "ckpt", None, seen).close()
    assert seen == list(range(NUM_SAMPLES))  # in order, each sample once
    # with a state nothing is read twice; without, the consumed samples are read again
    assert restarted.reads == NUM_SAMPLES - consumed + (0 if stateful else consumed)


def test_replicas_split_each_step_of_a_stream_between_them() -> None:
    """Every replica reads the stream and keeps its share: together, each sample once."""
    shares: list[list[int]] = []
    for rank in range(3):
        reader = StreamReader(Stream(20), torch.utils.data.default_collate)
        reader.start(0, resume=False)
        mine: list[int] = []
        while (step := reader.next_step(rank, 3, 2, 1, drop_last=False)) is not None:
            plan, batches = step
            assert len(batches) == plan.num_micro_steps
            mine.extend(i for batch in batches for i in batch[1].tolist())
            reader.commit(plan)
        shares.append(mine)
    assert reader.position == 20
    everything = sorted(i for share in shares for i in share)
    # 20 = 12 (one full step) + 8 spread over 3 replicas, padded by one repeated sample
    assert everything == sorted([*range(20), 12])
    assert len({len(share) for share in shares}) == 1


def sampler_run(sampler: RandomSampler, checkpoint_dir: Path, stop_after: int | None,
                seen: list[int]) -> pt.JobContext:
    job = start(checkpoint_dir)
    model, optimizer = model_of(job)
    data = torch.utils.data.TensorDataset(torch.randn(NUM_SAMPLES, 4),
                                          torch.arange(NUM_SAMPLES))
    loader = pt.AdaptiveDataLoader(data, batch_size=8, sampler=sampler, job=job)
    adaptive(loader, [8, 8, 6])
    for _epoch in pt.remaining_epochs_until(2, job):
        for number, (x, index) in enumerate(loader):
            seen.extend(index.tolist())
            train_step(model, optimizer, x)
            if number == stop_after and job.epoch == 0:
                job.request_stop()
    return job


def test_a_custom_sampler_draws_each_epoch_and_resumes_its_drawn_order(
        tmp_path: Path) -> None:
    seen: list[int] = []
    first = RandomSampler(NUM_SAMPLES)
    with pytest.raises(SystemExit):
        sampler_run(first, tmp_path / "ckpt", 5, seen)
    assert len(first.draws) == 1 and 0 < len(seen) < NUM_SAMPLES
    second = RandomSampler(NUM_SAMPLES)
    sampler_run(second, tmp_path / "ckpt", None, seen).close()
    assert len(second.draws) == 1  # epoch 1's; epoch 0 resumed from the checkpoint
    assert seen == first.draws[0] + second.draws[0]  # the drawn orders, exactly


def test_what_a_stream_or_a_sampler_cannot_take(tmp_path: Path) -> None:
    job = start(tmp_path / "ckpt")
    for kwargs, field in [({"shuffle": True}, "shuffle"), ({"num_workers": 2}, "num_workers"),
                          ({"sampler": [0, 1]}, "sampler")]:
        with pytest.raises(ConfigError, match=field):
            pt.AdaptiveDataLoader(Stream(), batch_size=4, job=job, **kwargs)
    data = torch.utils.data.TensorDataset(torch.arange(10))
    with pytest.raises(ConfigError, match="batch_sampler"):
        pt.AdaptiveDataLoader(data, batch_size=4, job=job, batch_sampler=[[0, 1]])
    loader = pt.AdaptiveDataLoader(data, batch_size=4, job=job, sampler=[3, 99])
    with pytest.raises(ConfigError, match=r"sampler.*99"):
        next(iter(loader))
    job.close()

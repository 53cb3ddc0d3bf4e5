"""Stopped and restarted in the middle of an epoch, AdaptDL-shaped loaders continue where
they were, every sample once: a custom loader on ``AdaptiveDataLoaderMixin`` (its cursor
checkpointed by the agent's stop), and an ``AdaptiveDataLoader`` made anew in every
epoch (its state found again by the epoch it was made in, as AdaptDL names it)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import pollux.adaptdl.torch as adl
from pollux.adaptdl.default_job import DEFAULT_JOB
from pollux.jobenv import RESCALE_EXIT_CODE
from pollux.torch.job import AgentConfig
from tests.torch.test_adaptdl_api import LAUNCH_VARIABLES

NUM_SAMPLES = 64


class Chunks(adl.AdaptiveDataLoaderMixin):
    """Consecutive slices of a tensor: the shape of AdaptDL's BPTT iterator."""

    def __init__(self, data: torch.Tensor, batch_size: int) -> None:
        super().__init__(batch_size)
        self.data = data

    def __iter__(self) -> Iterator[torch.Tensor]:
        with self._elastic.context():
            if self._elastic.skipdone():
                return
            local_bsz = self._elastic._sync_local_bsz()
            job = adl.default_job()
            step = local_bsz * job.num_replicas
            for start in range(self._elastic.current_index, len(self.data), step):
                with self._elastic.profile(self.training and start > 0):
                    mine = start + job.rank * local_bsz
                    yield self.data[mine:mine + local_bsz]
                    self._elastic.current_index += step


@pytest.fixture
def checkpoints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    for key in list(os.environ):
        if key.startswith(("POLLUX_", "ADAPTDL_")) or key in LAUNCH_VARIABLES:
            monkeypatch.delenv(key)
    monkeypatch.setenv("ADAPTDL_CHECKPOINT_PATH", str(tmp_path))  # AdaptDL's variable
    yield tmp_path
    adl.destroy_process_group()


def launch(stop_after: int | None, seen: list[int]) -> None:
    """One run of a job: 2 epochs, asking to stop after ``stop_after`` batches."""
    data = torch.arange(NUM_SAMPLES, dtype=torch.float32).unsqueeze(1)
    loader = Chunks(data, batch_size=8)  # before init_process_group, as AdaptDL allows
    loader.autoscale_batch_size(32, local_bsz_bounds=(4, 16))
    job = adl.init_process_group("gloo", config=AgentConfig(max_control_interval_steps=1))
    net = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=1e-3)
    model = adl.AdaptiveDataParallel(net, optimizer)
    batches = 0
    for epoch in adl.remaining_epochs_until(2):
        for x in loader:
            assert adl.current_dataloader() is loader
            assert len(x) == loader.current_local_bsz
            seen.extend(int(v) + NUM_SAMPLES * epoch for v in x.flatten().tolist())
            optimizer.zero_grad()
            model(x).square().mean().backward()
            optimizer.step()
            batches += 1
            if batches == stop_after:
                job.request_stop()  # as SIGTERM does


def test_a_stopped_custom_loader_resumes_where_it_stopped(checkpoints: Path) -> None:
    seen: list[int] = []
    with pytest.raises(SystemExit) as stopped:
        launch(stop_after=3, seen=seen)
    assert stopped.value.code == RESCALE_EXIT_CODE
    assert seen == list(range(24))  # 3 batches of 8, then checkpointed and left
    adl.destroy_process_group()
    assert DEFAULT_JOB.job is None
    launch(stop_after=None, seen=seen)
    assert sorted(seen) == list(range(2 * NUM_SAMPLES)), seen  # each sample once
    assert adl.finished_epochs() == 2


def launch_fresh_loader_each_epoch(stop_after: int | None, seen: list[int]) -> None:
    data = torch.utils.data.TensorDataset(torch.arange(NUM_SAMPLES, dtype=torch.float32))
    adl.init_process_group("gloo", config=AgentConfig(max_control_interval_steps=1))
    net = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=1e-3)
    model = adl.AdaptiveDataParallel(net, optimizer)
    batches = 0
    for epoch in adl.remaining_epochs_until(3):
        loader = adl.AdaptiveDataLoader(data, batch_size=8, shuffle=True)  # one per epoch
        for (x,) in loader:
            seen.extend(int(v) + NUM_SAMPLES * epoch for v in x.tolist())
            optimizer.zero_grad()
            model(x.unsqueeze(1)).square().mean().backward()
            optimizer.step()
            batches += 1
            if batches == stop_after:
                adl.default_job().request_stop()


def test_a_loader_made_in_each_epoch_resumes_mid_epoch(checkpoints: Path) -> None:
    seen: list[int] = []
    with pytest.raises(SystemExit):
        launch_fresh_loader_each_epoch(stop_after=11, seen=seen)  # 3 batches into epoch 1
    assert len(seen) == NUM_SAMPLES + 3 * 8
    adl.destroy_process_group()
    launch_fresh_loader_each_epoch(stop_after=None, seen=seen)
    assert sorted(seen) == list(range(3 * NUM_SAMPLES)), seen  # each sample once

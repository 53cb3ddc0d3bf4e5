"""pollux.adaptdl behaves as AdaptDL where a script meets it: checkpoint states and the
epoch count work before ``init_process_group``, a duplicate state name is refused when
made, ``current_dataloader()`` is the loader the user made (on both APIs), a restarted
epoch replays the ``synchronized()`` blocks it had passed, ``collective.initialize``
joins the job, ``env.get_job_name``, ``ElasticSampler`` and ``AdaptiveBPTTIterator``."""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest
import torch

import pollux.adaptdl.torch as adl
import pollux.torch as pt
from pollux import adaptdl
from pollux.adaptdl.default_job import DEFAULT_JOB
from pollux.adaptdl.torch.iterator import AdaptiveBPTTIterator, windows
from pollux.torch.job import AgentConfig
from tests.torch.launcher import free_port
from tests.torch.test_adaptdl_api import LAUNCH_VARIABLES


@pytest.fixture
def checkpoints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    for key in list(os.environ):
        if key.startswith(("POLLUX_", "ADAPTDL_")) or key in LAUNCH_VARIABLES:
            monkeypatch.delenv(key)
    monkeypatch.setenv("ADAPTDL_CHECKPOINT_PATH", str(tmp_path / "ck"))
    assert DEFAULT_JOB.job is None
    yield tmp_path / "ck"
    adl.destroy_process_group()


class Best(adaptdl.checkpoint.State):
    def __init__(self, name: str = "best") -> None:
        super().__init__(name)
        self.value = 0.0

    def save(self, fileobj: IO[bytes]) -> None:
        pickle.dump(self.value, fileobj)

    def load(self, fileobj: IO[bytes]) -> None:
        self.value = pickle.load(fileobj)


def one_epoch_job() -> float:
    """A job with a state that trains one epoch and checkpoints (then is closed);
    the state's value it restored."""
    best = Best()
    adl.init_process_group("gloo")
    adaptdl.checkpoint.load_state(best)
    net = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    model = adl.AdaptiveDataParallel(net, optimizer)
    loader = adl.AdaptiveDataLoader(torch.utils.data.TensorDataset(torch.ones(8, 1)), 4)
    for _ in adl.remaining_epochs_until(1):
        for (x,) in loader:
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
    adl.destroy_process_group()
    return best.value


def test_states_and_epochs_work_before_init_process_group(checkpoints: Path) -> None:
    assert adl.finished_epochs() == 0  # no checkpoint yet
    best = Best()
    assert adaptdl.checkpoint.load_state(best) is False
    best.value = 0.5
    assert adaptdl.checkpoint.save_all_states() == str(checkpoints)  # no job needed
    DEFAULT_JOB.clear()  # "a restart"
    assert one_epoch_job() == 0.5  # the job restores what was saved before it
    DEFAULT_JOB.clear()
    assert adl.finished_epochs() == 1  # read from its checkpoint, before any init
    again = Best()
    assert adaptdl.checkpoint.load_state(again) is True and again.value == 0.5
    again.value = 0.75
    adaptdl.checkpoint.save_all_states()  # before init: every other entry is kept
    assert adl.finished_epochs() == 1
    DEFAULT_JOB.clear()
    adl.init_process_group("gloo")
    assert adl.finished_epochs() == 1 and list(adl.remaining_epochs_until(1)) == []
    third = Best()
    assert adaptdl.checkpoint.load_state(third) is True and third.value == 0.75


def test_a_duplicate_state_name_is_refused_when_made(checkpoints: Path) -> None:
    Best("twice")
    with pytest.raises(ValueError, match="twice"):
        Best("twice")  # before init_process_group, as AdaptDL refuses it
    with pytest.raises(ValueError, match="State"):
        adaptdl.checkpoint.load_state(object())  # type: ignore[arg-type]


class Chunks(adl.AdaptiveDataLoaderMixin):
    def __init__(self, data: torch.Tensor, batch_size: int) -> None:
        super().__init__(batch_size)
        self.data = data

    def __iter__(self) -> Iterator[torch.Tensor]:
        with self._elastic.context():
            if self._elastic.skipdone():
                return
            local_bsz = self._elastic._sync_local_bsz()
            for start in range(self._elastic.current_index, len(self.data), local_bsz):
                with self._elastic.profile(False):
                    yield self.data[start:start + local_bsz]
                    self._elastic.current_index += local_bsz


def test_current_dataloader_is_the_users_loader_on_both_apis(checkpoints: Path) -> None:
    class Mine(adl.AdaptiveDataLoader):
        pass

    data = torch.utils.data.TensorDataset(torch.ones(8, 1))
    loaders = [adl.AdaptiveDataLoader(data, 4), Mine(data, 4), Chunks(torch.ones(8, 1), 4)]
    job = adl.init_process_group("gloo")
    net = torch.nn.Linear(1, 1)
    adl.AdaptiveDataParallel(net, torch.optim.SGD(net.parameters(), lr=0.0))
    for _ in adl.remaining_epochs_until(1):
        for loader in loaders:
            batches = 0
            for _batch in loader:
                assert adl.current_dataloader() is loader
                assert pt.current_dataloader(job) is loader
                batches += 1
            assert batches == 2 and adl.current_dataloader() is None
            assert pt.current_dataloader(job) is None


def replay_launch(stop_in_valid: bool, seen: list[tuple[str, int, Any]]) -> None:
    """2 epochs of a train loop then a validation loop, each summed in one accumulator
    made outside the epoch loop; asks to stop in the middle of epoch 0's validation."""
    job = adl.init_process_group("gloo", config=AgentConfig(max_control_interval_steps=1))
    net = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=1e-3)
    model = adl.AdaptiveDataParallel(net, optimizer)
    data = torch.utils.data.TensorDataset(torch.ones(32, 1))
    train, valid = adl.AdaptiveDataLoader(data, 8), adl.AdaptiveDataLoader(data, 8)
    stats = adl.Accumulator()
    for epoch in adl.remaining_epochs_until(2):
        stats["re-run"] += 1  # code before the loops runs again after a restart
        for (x,) in train:
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
            stats["train"] += len(x)
        with stats.synchronized():
            seen.append(("train", epoch, dict(stats)))
            stats.clear()
        for i, (x,) in enumerate(valid):
            stats["valid"] += len(x)
            if stop_in_valid and epoch == 0 and i == 1:
                job.request_stop()
        with stats.synchronized():
            seen.append(("valid", epoch, dict(stats)))
            stats.clear()


def test_a_restarted_epoch_replays_the_synchronized_blocks_it_passed(
        checkpoints: Path) -> None:
    seen: list[tuple[str, int, Any]] = []
    with pytest.raises(SystemExit):
        replay_launch(True, seen)
    assert seen == [("train", 0, {"re-run": 1, "train": 32})]
    adl.destroy_process_group()
    replay_launch(False, seen)
    assert seen == [("train", 0, {"re-run": 1, "train": 32}),
                    ("train", 0, {"re-run": 1, "train": 32}),  # replayed, as before
                    ("valid", 0, {"valid": 32}),  # 16 before the stop, 16 after
                    ("train", 1, {"re-run": 1, "train": 32}),
                    ("valid", 1, {"valid": 32})], seen


def test_collective_initialize_joins_the_job_once(checkpoints: Path) -> None:
    adaptdl.collective.initialize("127.0.0.1", free_port(), 0, 1)
    assert adaptdl.collective.allreduce(2) == 2 and adaptdl.env.num_replicas() == 1
    with pytest.raises(RuntimeError, match="once"):
        adl.init_process_group("gloo")
    with pytest.raises(RuntimeError, match="once"):
        adaptdl.collective.initialize()


def test_get_job_name_names_the_job(checkpoints: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert adaptdl.env.get_job_name() == "local"
    monkeypatch.setenv("ADAPTDL_JOB_ID", "mnist-tb")
    assert adaptdl.env.get_job_name() == "mnist-tb" == adaptdl.env.job_id()


def test_elastic_sampler_splits_and_resumes_like_adaptdls(checkpoints: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    from pollux.adaptdl.torch.data import ElasticSampler

    assert adl.ElasticSampler is ElasticSampler
    monkeypatch.setenv("ADAPTDL_NUM_REPLICAS", "3")
    monkeypatch.setenv("ADAPTDL_MASTER_PORT", "1")
    parts = []
    for rank in range(3):
        monkeypatch.setenv("ADAPTDL_REPLICA_RANK", str(rank))
        sampler = ElasticSampler(range(10), shuffle=False)
        sampler.set_epoch(0, index=2)
        parts.append(list(sampler))
        assert len(sampler) == 3
    assert parts == [[2, 5, 8], [3, 6, 9], [4, 7, 2]]  # padded with one sample
    def epoch_of(rank: int, epoch: int) -> list[int]:
        monkeypatch.setenv("ADAPTDL_REPLICA_RANK", str(rank))
        sampler = ElasticSampler(range(10))  # shuffle=True
        sampler.set_epoch(epoch)
        return list(sampler)

    epoch1 = [epoch_of(rank, 1) for rank in range(3)]
    assert epoch1 == [epoch_of(rank, 1) for rank in range(3)]  # the same order again
    assert sorted(set().union(*epoch1)) == list(range(10))  # every sample, split 4/3/3
    assert epoch1 != [epoch_of(rank, 2) for rank in range(3)]  # another epoch, another


def test_bptt_windows_give_every_replica_the_same_steps() -> None:
    assert windows(20, 0, 5, 0, 2) == [0, 10] and windows(20, 0, 5, 1, 2) == [5, 15]
    assert windows(16, 0, 5, 0, 2) == [0] and windows(16, 0, 5, 1, 2) == [5]
    for end in range(2, 40):
        counts = {len(windows(end, 3, 4, rank, 3)) for rank in range(3)}
        assert len(counts) == 1
        last = windows(end, 3, 4, 2, 3)
        assert not last or last[-1] < end - 1  # a window holds a token and its target


def bptt_launch(stop_after: int | None, seen: list[int]) -> None:
    tokens = torch.arange(96)
    adl.init_process_group("gloo", config=AgentConfig(max_control_interval_steps=1))
    net = torch.nn.Embedding(96, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=1e-3)
    model = adl.AdaptiveDataParallel(net, optimizer)
    batches = 0
    for _ in adl.remaining_epochs_until(1):
        for batch in AdaptiveBPTTIterator(tokens, batch_size=4, bptt_len=5):
            assert torch.equal(batch.target, batch.text + 1)  # the next tokens
            assert adl.current_dataloader().current_local_bsz == batch.batch_size == 4
            seen.extend(batch.text.flatten().tolist())
            optimizer.zero_grad()
            model(batch.text).sum().backward()
            optimizer.step()
            batches += 1
            if batches == stop_after:
                adl.default_job().request_stop()


def test_bptt_iterator_covers_the_stream_and_resumes(checkpoints: Path) -> None:
    seen: list[int] = []
    with pytest.raises(SystemExit):
        bptt_launch(2, seen)
    assert len(seen) == 2 * 5 * 4
    adl.destroy_process_group()
    bptt_launch(None, seen)
    # 4 columns of 24 tokens: windows of 5 rows, the last holding 3 (a target each)
    assert sorted(seen) == sorted(t for t in range(96) if t % 24 != 23), seen

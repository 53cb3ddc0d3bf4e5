"""Every loop shape over an AdaptiveDataLoader trains every batch of every epoch (counted),
on ``pollux.torch`` and ``pollux.adaptdl`` alike, and a job stopped mid-epoch resumes
with every sample once per epoch (issue #29: a plain ``for epoch in range(3)`` loop
trained one epoch and then 0 batches; a second pass in one epoch yielded nothing; a loop
after ``break`` continued the broken pass; a loader with no model raised).

The rules are in :mod:`pollux.torch.passes` and ``docs/train/loops.md``. A restart is
made in-process here (a stop request raises ``SystemExit`` from inside the loop after the
checkpoint, then the script runs again); ``test_sigterm_in_a_plain_loop_...`` sends a
real SIGTERM to replica processes.
"""

from __future__ import annotations

import json
import logging
import os
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from pollux.jobenv import RESCALE_EXIT_CODE
from pollux.torch.job import JobContext
from tests.torch.launcher import WORKERS, Replicas
from tests.torch.loop_scripts import APIS, Script, evaluate, train_step
from tests.torch.test_adaptdl_api import LAUNCH_VARIABLES
from tests.torch.test_stop import wait_until_ready

NUM_SAMPLES = 100
BATCH = 10
EVAL_BATCH = 20


@pytest.fixture
def checkpoints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A clean launch environment whose checkpoints go to a fresh directory."""
    for key in list(os.environ):
        if key.startswith(("POLLUX_", "ADAPTDL_")) or key in LAUNCH_VARIABLES:
            monkeypatch.delenv(key)
    directory = tmp_path / "checkpoints"
    monkeypatch.setenv("POLLUX_CHECKPOINT_DIR", str(directory))
    yield directory
    from pollux.adaptdl.default_job import DEFAULT_JOB

    if DEFAULT_JOB.job is not None:  # a failed adaptdl test: leave no job behind
        import pollux.adaptdl.torch as adl

        adl.destroy_process_group()


def indices(batch: tuple[object, ...]) -> list[int]:
    return [int(i) for i in batch[1].tolist()]  # type: ignore[attr-defined]


@pytest.mark.parametrize("api", APIS)
def test_a_plain_epoch_loop_trains_every_batch_and_validating_twice_sees_all(
        checkpoints: Path, api: str) -> None:
    script = Script(api)
    model, optimizer = script.model()
    train = script.loader(NUM_SAMPLES, BATCH, shuffle=True)
    valid = script.loader(NUM_SAMPLES, EVAL_BATCH)
    per_epoch: list[Counter[int]] = []
    valid_batches: list[int] = []
    orders = []
    for _epoch in range(3):
        seen: Counter[int] = Counter()
        order = []
        for batch in train:
            seen.update(indices(batch))
            order.extend(indices(batch))
            train_step(model, optimizer, batch[0])
        per_epoch.append(seen)
        orders.append(order)
        for _ in range(2):  # validating twice: two full passes, the epoch unchanged
            valid_batches.append(0)
            for batch in valid:
                evaluate(model, batch[0])
                valid_batches[-1] += 1
    assert per_epoch == [Counter(range(NUM_SAMPLES))] * 3  # 10, 10, 10 batches
    assert valid_batches == [NUM_SAMPLES // EVAL_BATCH] * 6
    assert len({tuple(order) for order in orders}) == 3  # each epoch its own order
    job = script.job
    assert job.epoch == 3  # one per training pass, none per evaluation pass
    profiler = job.profiler
    profiler.collect()
    assert profiler.steps_at((1, 1, EVAL_BATCH)) == 0  # evaluation is never profiled
    assert profiler.steps_at((1, 1, BATCH)) > 0
    script.close()


@pytest.mark.parametrize("api", APIS)
def test_remaining_epochs_until_with_two_passes_per_epoch(checkpoints: Path,
                                                          api: str) -> None:
    script = Script(api)
    model, optimizer = script.model()
    train = script.loader(NUM_SAMPLES, BATCH, shuffle=True)
    valid = script.loader(NUM_SAMPLES, EVAL_BATCH)
    counts = []
    for epoch in script.epochs(3):
        assert script.job.epoch == epoch  # the loop alone moves the epoch
        batches = 0
        for batch in train:
            train_step(model, optimizer, batch[0])
            batches += 1
        counts.append(batches)
        counts.extend(sum(1 for _ in valid) for _ in range(2))
    assert counts == [10, 5, 5] * 3
    assert script.job.epoch == 3
    script.close()


@pytest.mark.parametrize("api", APIS)
def test_a_loop_after_break_is_a_fresh_pass(checkpoints: Path, api: str) -> None:
    script = Script(api)
    model, optimizer = script.model()
    loader = script.loader(NUM_SAMPLES, BATCH)
    for number, batch in enumerate(loader):
        train_step(model, optimizer, batch[0])
        if number == 2:
            break
    assert script.job.epoch == 1  # a training pass that ends (here by break) ends the epoch
    assert len(loader) == NUM_SAMPLES // BATCH  # the next pass is whole
    fresh = []
    for batch in loader:
        fresh.extend(indices(batch))
        train_step(model, optimizer, batch[0])
    assert fresh == list(range(NUM_SAMPLES))  # from the first sample, not from the 31st
    peeked = next(iter(loader))  # a look at one batch trains nothing: the epoch stays
    assert indices(peeked) == list(range(BATCH)) and script.job.epoch == 2
    script.close()


@pytest.mark.parametrize("api", APIS)
def test_a_loader_with_no_model_trains_at_its_batch_size_with_a_note(
        checkpoints: Path, api: str, caplog: pytest.LogCaptureFixture) -> None:
    script = Script(api)
    net, optimizer = script.model(with_model=False)
    loader = script.loader(NUM_SAMPLES, BATCH, shuffle=True)
    loader.autoscale_batch_size(4 * BATCH)  # nothing to measure: stays at BATCH
    sizes: list[list[int]] = []
    with caplog.at_level(logging.WARNING, logger="pollux"):
        for _epoch in range(2):
            sizes.append([])
            for batch in loader:
                sizes[-1].append(len(batch[0]))
                train_step(net, optimizer, batch[0])
    assert sizes == [[BATCH] * 10] * 2
    notes = [r for r in caplog.records if "no AdaptiveDataParallel" in r.getMessage()]
    assert len(notes) == 1, caplog.records  # one line, once
    assert script.job.epoch == 2
    script.close()


def framework_epochs(job: object, num_epochs: int) -> Iterator[int]:
    """A framework's own epoch loop (a Trainer's): it starts again at the restored epoch
    and moves the epoch itself, inside ``epoch_scope``."""
    from pollux.torch.epochs import epoch_scope

    assert isinstance(job, JobContext)
    with epoch_scope(job):
        while job.epoch < num_epochs:
            yield job.epoch
            job.finish_epoch()


def stopped_run(api: str, shape: str, stop_at: tuple[int, str, int] | None,
                seen: dict[tuple[int, str], Counter[int]],
                batches: dict[tuple[int, str], int]) -> None:
    """One launch of a 3-epoch script that trains and validates twice per epoch, in a
    plain loop or under ``remaining_epochs_until``; asks to stop (as SIGTERM does) at
    ``stop_at`` = (epoch, pass, batch). Counts samples and batches by (epoch, pass)."""
    script = Script(api)
    model, optimizer = script.model()
    train = script.loader(NUM_SAMPLES, BATCH, shuffle=True)
    valid = script.loader(NUM_SAMPLES, EVAL_BATCH)
    epochs = {"plain": lambda: iter(range(3)), "epochs": lambda: script.epochs(3),
              "framework": lambda: framework_epochs(script.job, 3)}[shape]()

    def run(loader: object, epoch: int, name: str, training: bool) -> None:
        key = (epoch, name)
        for number, batch in enumerate(loader):  # type: ignore[call-overload]
            seen.setdefault(key, Counter()).update(indices(batch))
            batches[key] = batches.get(key, 0) + 1
            if training:
                train_step(model, optimizer, batch[0])
            else:
                evaluate(model, batch[0])
            if stop_at == (epoch, name, number):
                script.job.request_stop()

    for epoch in epochs:
        run(train, epoch, "train", True)
        run(valid, epoch, "valid-a", False)
        run(valid, epoch, "valid-b", False)
    assert script.job.epoch == 3
    script.close()


@pytest.mark.parametrize(("api", "shape", "stop_at"), [
    ("torch", "plain", (1, "train", 4)),
    ("adaptdl", "plain", (1, "train", 4)),
    ("torch", "plain", (1, "valid-b", 1)),
    ("adaptdl", "plain", (2, "valid-a", 2)),
    ("torch", "epochs", (1, "valid-b", 1)),
    ("adaptdl", "epochs", (1, "train", 4)),
    ("torch", "framework", (2, "train", 3)),
])
def test_a_stopped_loop_resumes_with_every_sample_once_per_pass(
        checkpoints: Path, api: str, shape: str, stop_at: tuple[int, str, int]) -> None:
    seen: dict[tuple[int, str], Counter[int]] = {}
    batches: dict[tuple[int, str], int] = {}
    with pytest.raises(SystemExit) as stopped:
        stopped_run(api, shape, stop_at, seen, batches)
    assert stopped.value.code == RESCALE_EXIT_CODE
    epoch, name, number = stop_at
    # the stop acts at the next agreement point: before the next batch
    assert batches[(epoch, name)] == number + 1, batches
    if api == "adaptdl":
        import pollux.adaptdl.torch as adl

        adl.destroy_process_group()
    before = dict(batches)
    stopped_run(api, shape, None, seen, batches)
    full = Counter(range(NUM_SAMPLES))
    assert seen == {(e, p): full for e in range(3)
                    for p in ("train", "valid-a", "valid-b")}, batches
    assert batches == {(e, p): 10 if p == "train" else 5 for e in range(3)
                       for p in ("train", "valid-a", "valid-b")}
    order = [(e, p) for e in range(3) for p in ("train", "valid-a", "valid-b")]
    resumed = [batches[key] - before.get(key, 0) for key in order]
    at = order.index((epoch, name))
    expected = [0] * at + [batches[(epoch, name)] - (number + 1)] + [
        batches[key] for key in order[at + 1:]]
    assert resumed == expected  # ended passes replay empty, the stopped one resumes


@pytest.mark.parametrize(("api", "replicas", "sampler"), [
    ("torch", (2, 1), True),  # an unseeded custom sampler: rank 0's order, checkpointed
    ("adaptdl", (1, 2), False),
])
def test_sigterm_in_a_plain_loop_resumes_with_every_sample_once_per_epoch(
        tmp_path: Path, api: str, replicas: tuple[int, int], sampler: bool) -> None:
    ckpt = tmp_path / "ckpt"
    argv = [str(WORKERS / "plain_loop.py"), "--api", api,
            *(["--unseeded-sampler"] if sampler else [])]
    first = Replicas(argv, replicas[0], checkpoint_dir=ckpt, log_dir=tmp_path / "logs")
    wait_until_ready(first)
    first.signal(signal.SIGTERM)  # in the middle of epoch 1
    assert first.wait(timeout_s=60) == [RESCALE_EXIT_CODE] * replicas[0], first.output()
    second = Replicas(argv, replicas[1], checkpoint_dir=ckpt, log_dir=tmp_path / "logs",
                      num_restarts=1)
    assert second.wait(timeout_s=90) == [0] * replicas[1], second.output()
    assert second.last_json()["epoch"] == 3
    per_epoch: dict[int, Counter[int]] = {}
    per_launch: Counter[tuple[int, int]] = Counter()
    for path in sorted(ckpt.glob("samples-launch*-rank*.jsonl")):
        launch = int(path.name.split("-")[1].removeprefix("launch"))
        for line in path.read_text().splitlines():
            record = json.loads(line)
            per_epoch.setdefault(record["epoch"], Counter()).update(record["indices"])
            per_launch[(launch, record["epoch"])] += len(record["indices"])
    assert per_epoch == {epoch: Counter(range(96)) for epoch in range(3)}, per_launch
    assert 0 < per_launch[(0, 1)] < 96 and per_launch[(1, 0)] == 0  # stopped mid-epoch 1

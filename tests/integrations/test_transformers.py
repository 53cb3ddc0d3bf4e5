"""AdaptiveTrainer in one process: every sample once per epoch, the Trainer's step and
schedule accounting, an exact resume after a stop request, and the refusals."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import torch  # noqa: E402
from transformers import TrainerCallback, TrainingArguments  # noqa: E402

import pollux.torch as pt  # noqa: E402
from pollux.errors import ConfigError  # noqa: E402
from pollux.integrations.transformers import AdaptiveTrainer  # noqa: E402
from pollux.jobenv import RESCALE_EXIT_CODE  # noqa: E402
from tests.integrations.clm import MarkovCorpus, build_model  # noqa: E402

pytestmark = [pytest.mark.timeout(300)]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

NUM_TRAIN = 96


def training_args(tmp_path: Path, **extra: Any) -> TrainingArguments:
    settings: dict[str, Any] = {
        "output_dir": str(tmp_path / "out"), "per_device_train_batch_size": 8,
        "num_train_epochs": 2, "learning_rate": 1e-2, "logging_strategy": "no",
        "save_strategy": "no", "eval_strategy": "no", "report_to": "none",
        "disable_tqdm": True, "use_cpu": True, "seed": 0,
        "ddp_find_unused_parameters": False}
    settings.update(extra)
    return TrainingArguments(**settings)


class Record(TrainerCallback):  # type: ignore[misc]
    """Samples per epoch (from the loader's batch_info); asks to stop at ``stop_at``."""

    def __init__(self, stop_at: int | None = None) -> None:
        self.trainer: AdaptiveTrainer | None = None
        self.seen: dict[int, Counter[int]] = {}
        self.stop_at = stop_at

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        assert self.trainer is not None and self.trainer.adaptive_loader is not None
        info = self.trainer.adaptive_loader.batch_info
        assert info is not None
        real = len(info.indices) - info.num_padding
        self.seen.setdefault(info.epoch, Counter()).update(int(i) for i in info.indices[:real])

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.stop_at is not None and state.global_step == self.stop_at:
            assert self.trainer is not None
            self.trainer.job.request_stop()  # as SIGTERM does


def make_trainer(tmp_path: Path, record: Record, **extra: Any) -> AdaptiveTrainer:
    job = pt.init_process_group(checkpoint_dir=tmp_path / "checkpoint",
                                config=pt.AgentConfig(control_interval_s=0.05),
                                install_signal_handler=False)
    trainer = AdaptiveTrainer(model=build_model(0), args=training_args(tmp_path),
                              train_dataset=MarkovCorpus(NUM_TRAIN, seed=1),
                              callbacks=[record], job=job, **extra)
    record.trainer = trainer
    return trainer


def test_trains_every_sample_once_per_epoch_and_ends_the_schedule(tmp_path: Path) -> None:
    record = Record()
    trainer = make_trainer(tmp_path, record, max_batch_size=32, local_bsz_bounds=(4, 32))
    try:
        trainer.train()
        assert trainer.adaptive_model is not None
        assert sorted(record.seen) == [0, 1]
        assert all(c == Counter(range(NUM_TRAIN)) for c in record.seen.values())
        assert trainer.job.epoch == 2 and trainer.state.epoch == 2.0
        # global_step counts the optimizer's steps; the schedule counts steps of M0
        assert trainer.state.global_step == trainer.adaptive_model.optimizer_steps
        assert trainer.lr_scheduler.last_epoch == trainer.state.max_steps == 2 * 12
        assert trainer.lr_scheduler.get_last_lr()[0] == pytest.approx(0.0)
    finally:
        trainer.job.close()


def test_a_stop_request_checkpoints_exits_75_and_the_resume_is_exact(tmp_path: Path) -> None:
    whole = Record()
    trainer = make_trainer(tmp_path / "whole", whole)
    try:
        trainer.train()
        expected = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        steps = trainer.state.global_step
    finally:
        trainer.job.close()

    first = Record(stop_at=17)  # in the second epoch (12 steps each)
    trainer = make_trainer(tmp_path / "split", first)
    with pytest.raises(SystemExit) as stopped:
        trainer.train()
    assert stopped.value.code == RESCALE_EXIT_CODE
    assert trainer.state.global_step in (17, 18)  # the agreement point after the request
    second = Record()
    trainer = make_trainer(tmp_path / "split", second)
    try:
        assert trainer.job.checkpoint.is_restored()
        trainer.train()
        assert trainer.state.global_step == steps
        for epoch in (0, 1):
            assert first.seen.get(epoch, Counter()) + second.seen.get(epoch, Counter()) == Counter(
                range(NUM_TRAIN))
        for name, value in trainer.model.state_dict().items():
            torch.testing.assert_close(value, expected[name], rtol=0, atol=0, msg=name)
    finally:
        trainer.job.close()


def test_refuses_gradient_accumulation_naming_the_field(tmp_path: Path) -> None:
    job = pt.init_process_group(checkpoint_dir="", install_signal_handler=False)
    try:
        with pytest.raises(ConfigError, match="gradient_accumulation_steps"):
            AdaptiveTrainer(model=build_model(0),
                            args=training_args(tmp_path, gradient_accumulation_steps=4),
                            train_dataset=MarkovCorpus(16, seed=1), job=job)
    finally:
        job.close()

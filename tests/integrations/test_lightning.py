"""AdaptiveStrategy in this process: the module's loader adapts, every sample is trained
once per epoch, Lightning's counters match the agent's, a finished job relaunched ends at
once, and bad set-ups are refused by name (the loss against Lightning's own strategy, and
rescaling under the scheduler: test_lightning_e2e.py)."""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pl = pytest.importorskip("lightning.pytorch")
torch = pytest.importorskip("torch")

from pollux.errors import ConfigError  # noqa: E402
from pollux.integrations.lightning import AdaptiveStrategy, scaling_rule_for  # noqa: E402
from pollux.models import ThroughputParams  # noqa: E402
from pollux.torch.adam_scale import AdamGainScale  # noqa: E402
from pollux.torch.scaling_rules import AdaScale  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*does not have many workers:UserWarning"),
    pytest.mark.filterwarnings("ignore:.*treespec, LeafSpec.*:FutureWarning"),
    pytest.mark.filterwarnings("ignore:The `srun` command is available:UserWarning"),
    pytest.mark.filterwarnings("ignore:.*litlogger:UserWarning"),
    pytest.mark.filterwarnings("ignore:.*smaller than the logging interval:UserWarning"),
    pytest.mark.filterwarnings("ignore:.*LightningModule.*eval mode:UserWarning"),
]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lightning_classifier.py"
NUM_TRAIN = 1024


def example() -> ModuleType:
    if "lightning_classifier" not in sys.modules:
        spec = importlib.util.spec_from_file_location("lightning_classifier", EXAMPLE)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["lightning_classifier"] = module
        spec.loader.exec_module(module)
    return sys.modules["lightning_classifier"]


class Observer(pl.Callback):
    """What the agent and Lightning say at the end of the fit (before teardown)."""

    def __init__(self) -> None:
        self.seen: dict[str, Any] = {}

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        strategy = trainer.strategy
        model = strategy.adaptive_model
        loop = trainer.fit_loop.epoch_loop
        self.seen = {"global_step": trainer.global_step, "epoch": trainer.current_epoch,
                     "optimizer_steps": model.optimizer_steps, "rule": model.scaling_rule,
                     "batch_size": strategy.train_loader.loader.current_batch_size,
                     "noise_scale": model.noise_scale(), "job_epoch": strategy.job.epoch,
                     "sigterm_broadcast": loop._broadcast_sigterm_tensor.__qualname__}


STEP_TIMES = ThroughputParams(alpha_c=0.02, beta_c=2e-5, alpha_n=0.0, beta_n=0.0,
                              alpha_r=0.0, beta_r=0.0, gamma=1.0)
"""A step-time model in which a step costs mostly its fixed 20 ms: larger batches pay."""


class PinnedStepTimes(pl.Callback):
    """Gives the agent :data:`STEP_TIMES` instead of the step times it measures, so that
    its batch-size decisions depend on the (seeded) gradients alone."""

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        trainer.strategy.job.profiler.pin(STEP_TIMES)


def fit(tmp_path: Path | None, epochs: int, *, plain: bool = False,
        observer: Observer | None = None, pinned: bool = False,
        **strategy_kwargs: Any) -> Any:
    ex = example()
    pl.seed_everything(0, verbose=False)
    train, val = ex.synthetic_data(NUM_TRAIN, 1024, seed=0)
    module = ex.Regressor(train, val, batch_size=16, lr=0.005)
    strategy: Any = "auto"
    if not plain:
        import pollux.torch as pt

        strategy = AdaptiveStrategy(
            checkpoint_dir=str(tmp_path),
            # an agreement point at every step: decisions at the same steps in every run
            config=pt.AgentConfig(control_interval_s=0.05, max_control_interval_steps=1,
                                  log_level=None),
            **{"max_batch_size": 256, "local_bsz_bounds": (8, 128), **strategy_kwargs})
    trainer = pl.Trainer(max_epochs=epochs, accelerator="cpu", strategy=strategy,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0,
                         callbacks=[c for c in (observer, PinnedStepTimes() if pinned
                                                else None) if c is not None])
    trainer.fit(module)
    return trainer, module, ex.evaluate(module)


def per_epoch(history: list[dict[str, Any]]) -> dict[int, Counter[int]]:
    epochs: dict[int, Counter[int]] = {}
    for record in history:
        epochs.setdefault(record["epoch"], Counter()).update(record["indices"])
    return epochs


def test_one_process_adapts_and_counts_every_sample_once_per_epoch(
        tmp_path: Path) -> None:
    observer = Observer()
    trainer, module, loss = fit(tmp_path, 2, observer=observer, pinned=True)
    seen = observer.seen
    # the step times are pinned (PinnedStepTimes): the batch grows in every run
    assert 16 < seen["batch_size"] <= 128, seen
    # Lightning's blocking per-batch SIGTERM broadcast is left out (the agent's stop
    # watch agrees on stops)
    assert seen["sigterm_broadcast"] == "_no_broadcast", seen
    assert isinstance(seen["rule"], AdamGainScale) and seen["noise_scale"] is not None
    assert seen["global_step"] == seen["optimizer_steps"] == trainer.global_step > 0
    assert seen["epoch"] == seen["job_epoch"] == 2
    counts = per_epoch(module.samples.history)
    assert sorted(counts) == [0, 1]
    assert all(c == Counter(range(NUM_TRAIN)) for c in counts.values())

    # relaunched after the end: restores and trains nothing more
    again, _, loss_again = fit(tmp_path, 2)
    assert again.global_step == trainer.global_step and loss_again == loss


def test_scaling_rule_follows_the_optimizer() -> None:
    params = [torch.nn.Parameter(torch.zeros(2))]
    assert isinstance(scaling_rule_for(torch.optim.AdamW(params)), AdamGainScale)
    assert isinstance(scaling_rule_for(torch.optim.SGD(params, lr=0.1)), AdaScale)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"max_batch_size": 0}, "max_batch_size"),
    ({"max_batch_size": 64, "local_bsz_bounds": (0, 8)}, "local_bsz_bounds"),
    ({"max_batch_size": None, "local_bsz_bounds": (1, 8)}, "local_bsz_bounds"),
])
def test_bad_bounds_are_refused_by_name(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        AdaptiveStrategy(**kwargs)


class Tiny(pl.LightningModule):
    """A linear model over ``data``; ``read_steps``: reads the trainer's
    estimated_stepping_batches in configure_optimizers."""

    def __init__(self, data: Any, read_steps: bool = False, **loader_kwargs: Any) -> None:
        super().__init__()
        self.net, self.data, self.read_steps = torch.nn.Linear(16, 1), data, read_steps
        self.loader_kwargs = loader_kwargs

    def train_dataloader(self) -> Any:
        return torch.utils.data.DataLoader(self.data, batch_size=8, **self.loader_kwargs)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        return self.net(batch[0]).square().mean()

    def configure_optimizers(self) -> Any:
        if self.read_steps:
            assert self.trainer.estimated_stepping_batches > 0
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Stream(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """The samples of ``data`` as a stream, in order (no ``__len__``)."""

    def __init__(self, data: Any) -> None:
        self.data = data

    def __iter__(self) -> Any:
        return (self.data[i] for i in range(len(self.data)))


class Reversed(torch.utils.data.Sampler):  # type: ignore[type-arg]
    """A custom sampler: the data set backwards."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __iter__(self) -> Any:
        return iter(range(self.size - 1, -1, -1))

    def __len__(self) -> int:
        return self.size


@pytest.mark.parametrize("source", ["stream", "sampler"])
def test_a_stream_and_a_custom_sampler_train_every_sample_once_per_epoch(
        tmp_path: Path, source: str) -> None:
    """An IterableDataset is read as a stream and a custom sampler draws each epoch's
    order (pollux.torch.data_sources): 2 epochs, each sample once per epoch, in the
    stream's or the sampler's order."""
    ex = example()
    train, val = ex.synthetic_data(256, 64, seed=0)

    class Module(ex.Regressor):  # type: ignore[misc, name-defined]
        def train_dataloader(self) -> Any:
            if source == "stream":
                return torch.utils.data.DataLoader(Stream(self.train_data), batch_size=16)
            return torch.utils.data.DataLoader(self.train_data, batch_size=16,
                                               sampler=Reversed(len(self.train_data)))

    import pollux.torch as pt

    pl.seed_everything(0, verbose=False)
    module = Module(train, val, batch_size=16, lr=0.005)
    observer = Observer()
    trainer = pl.Trainer(
        max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        callbacks=[observer],
        strategy=AdaptiveStrategy(64, (8, 64), checkpoint_dir=str(tmp_path),
                                  config=pt.AgentConfig(max_control_interval_steps=1,
                                                        log_level=None)))
    trainer.fit(module)
    assert observer.seen["epoch"] == observer.seen["job_epoch"] == 2
    order = list(range(256)) if source == "stream" else list(range(255, -1, -1))
    by_epoch: dict[int, list[int]] = {}
    for record in module.samples.history:
        by_epoch.setdefault(record["epoch"], []).extend(record["indices"])
    assert by_epoch == {0: order, 1: order}, {e: (len(v), v[-20:]) for e, v in by_epoch.items()}


@pytest.mark.parametrize("case", ["accumulation", "steps_in_optimizers", "stream_workers",
                                  "distributed_sampler"])
def test_unsupported_set_ups_are_refused_by_name(tmp_path: Path, case: str) -> None:
    ex = example()
    train, val = ex.synthetic_data(64, 16, seed=0)
    module: Any = ex.Regressor(train, val, batch_size=8, lr=0.01)
    field, accumulate = "accumulate_grad_batches", 1
    if case == "accumulation":
        accumulate = 2
    elif case == "steps_in_optimizers":
        module, field = Tiny(train, read_steps=True), "estimated_stepping_batches"
    elif case == "stream_workers":  # a stream is read by the training process
        module, field = Tiny(Stream(train), num_workers=2), "num_workers"
    else:  # the agent splits the samples over the replicas itself
        sampler = torch.utils.data.DistributedSampler(train, num_replicas=1, rank=0)
        module, field = Tiny(train, sampler=sampler), "DistributedSampler"
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         accumulate_grad_batches=accumulate, num_sanity_val_steps=0,
                         strategy=AdaptiveStrategy(checkpoint_dir=str(tmp_path)))
    with pytest.raises(ConfigError, match=field):
        trainer.fit(module)

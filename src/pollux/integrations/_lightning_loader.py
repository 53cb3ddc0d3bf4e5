"""The training loader a Lightning ``Trainer`` iterates under :class:`AdaptiveStrategy`,
and the Lightning state that Pollux's checkpoints carry.

Lightning learns an epoch's length once, when it sets its loader up, and fetches each
batch just before training on it. The agent's loader (:class:`pollux.torch.
AdaptiveDataLoader`) changes its batch size during an epoch, and does its step-boundary
work (committing a step's samples, agreement points, stops and checkpoints) when the next
batch is asked for. :class:`LightningTrainLoader` joins the two:

* it asks for the next batch as soon as a batch has trained (Lightning's
  ``on_train_batch_end``, through :class:`StepBoundary`), so the step-boundary work runs
  right after the optimizer step, where Lightning's own mid-epoch checkpoints are taken;
  a stop checkpoint there resumes as Lightning's own do;
* each time it hands a batch out it tells Lightning how many batches this epoch has with
  the current batch size (its counters ``num_training_batches``, the fetcher's length,
  and the validation interval when that is a fraction of the epoch), so that Lightning
  ends the epoch on its true last batch and validates where it should.

The epoch's samples and their order are the agent's (every training sample once per
epoch, across restarts and replica counts); Lightning's sampler is not used.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
import torch.utils.data
from lightning.pytorch.callbacks import Callback

from pollux.errors import ConfigError
from pollux.torch import AdaptiveDataLoader, JobContext

if TYPE_CHECKING:
    from lightning.pytorch.loops import _FitLoop

logger = logging.getLogger(__name__)

_LOADER_OPTIONS = ("num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn",
                   "multiprocessing_context", "persistent_workers", "pin_memory_device")
"""The DataLoader options the agent's loader takes over from the module's loader."""


def _order(loader: torch.utils.data.DataLoader[Any]) -> tuple[bool, Any]:
    """(shuffle, custom sampler or None) of a map-style loader: PyTorch's own sequential
    or random order becomes the agent's seeded one; any other sampler (weighted, grouped
    by length, a RandomSampler with replacement...) draws each epoch's order on rank 0
    (:mod:`pollux.torch.data_sources`)."""
    sampler = loader.sampler
    if isinstance(sampler, torch.utils.data.SequentialSampler):
        return False, None
    if (isinstance(sampler, torch.utils.data.RandomSampler) and not sampler.replacement
            and sampler.num_samples == len(sampler.data_source)):
        return True, None
    if isinstance(sampler, torch.utils.data.DistributedSampler):
        raise ConfigError("train_dataloader().sampler", "DistributedSampler",
                          "AdaptiveStrategy splits the samples over the replicas itself: "
                          "give the DataLoader shuffle=True/False or a sampler of the "
                          "whole data set")
    return False, sampler


def adaptive_loader_options(loader: object) -> tuple[Any, int, bool, bool, dict[str, Any]]:
    """(dataset, batch size, shuffle, drop_last, other options) of the module's training
    DataLoader, checked for what the agent's loader can take over: a map-style data set
    with PyTorch's order or a custom ``sampler`` (passed on as ``sampler=``), or an
    IterableDataset read as a stream (in this process, ``num_workers=0``)."""
    if not isinstance(loader, torch.utils.data.DataLoader):
        raise ConfigError("train_dataloader()", type(loader).__name__,
                          "return a torch.utils.data.DataLoader under AdaptiveStrategy")
    if loader.batch_size is None:
        raise ConfigError("train_dataloader().batch_size", None,
                          "give the DataLoader a batch_size (the initial local batch) "
                          "rather than a batch_sampler")
    dataset = loader.dataset
    if isinstance(dataset, torch.utils.data.IterableDataset):
        options: dict[str, Any] = {"collate_fn": loader.collate_fn,
                                   "num_workers": loader.num_workers}
        return dataset, int(loader.batch_size), False, bool(loader.drop_last), options
    options = {name: getattr(loader, name) for name in _LOADER_OPTIONS
               if hasattr(loader, name)}
    if options.get("num_workers", 0) > 0:
        options["prefetch_factor"] = loader.prefetch_factor
    else:
        options.pop("persistent_workers", None)
    shuffle, sampler = _order(loader)
    if sampler is not None:
        options["sampler"] = sampler
    return dataset, int(loader.batch_size), shuffle, bool(loader.drop_last), options


def trainer_callbacks(trainer: Any) -> list[Callback]:
    """The trainer's callbacks (a list Lightning keeps as an attribute)."""
    return list(trainer.callbacks)


class LightningTrainLoader:
    """What Lightning iterates as the training loader: the agent's loader, with
    Lightning's epoch counters kept equal to its true length (see the module)."""

    def __init__(self, loader: AdaptiveDataLoader, trainer: pl.Trainer) -> None:
        self.loader = loader
        self.trainer = trainer
        self._batches: Iterator[Any] | None = None
        self._pending: list[Any] = []
        """The next batch, asked for as soon as the previous one trained."""
        self._exhausted = False
        self._handed = 0
        """Batches handed out by this process in epoch ``_handed_epoch``."""
        self._handed_epoch = -1

    @property
    def job(self) -> JobContext:
        return self.loader.job

    @property
    def _fit_loop(self) -> _FitLoop:
        return self.trainer.fit_loop

    def _lightning_done(self) -> int:
        """Batches of this epoch Lightning has counted as trained (restored on restart)."""
        current: Any = self._fit_loop.epoch_loop.batch_progress.current
        return int(current.processed)

    def _remaining(self) -> int:
        """Batches this process has still to hand out in this epoch (current batch size).
        A stream of unknown length has one more until it has ended: Lightning, told a
        length, fetches no batch ahead (which would run the agent's step boundary of a
        step before it trained), and the pass's end marks Lightning's last batch."""
        handed = self._handed if self._handed_epoch == self.job.epoch else 0
        try:
            return max(len(self.loader) - handed, 0)
        except TypeError:
            return 0 if self._exhausted else 1

    def __len__(self) -> int:
        """This epoch's batches: those Lightning counted plus those left."""
        return self._lightning_done() + self._remaining()

    def __iter__(self) -> LightningTrainLoader:
        self._batches = iter(self.loader)
        self._pending = []
        self._exhausted = False
        return self

    def __next__(self) -> Any:
        if self._pending:
            batch = self._pending.pop()
        elif self._exhausted or self._batches is None:
            raise StopIteration
        else:
            batch = self._fetch()
            if batch is None:
                raise StopIteration
        self._tell_lightning(int(self._fit_loop.epoch_loop.batch_progress.current.ready) + 1)
        return batch[0]

    def _fetch(self) -> tuple[Any] | None:
        """The agent's next batch (a 1-tuple), or None at the end of the pass."""
        assert self._batches is not None
        epoch = self.job.epoch
        try:
            batch = next(self._batches)
        except StopIteration:
            self._exhausted = True
            self._finish_pass(epoch)
            return None
        if self._handed_epoch != self.job.epoch:
            self._handed_epoch, self._handed = self.job.epoch, 0
        self._handed += 1
        return (batch,)

    def _finish_pass(self, epoch: int) -> None:
        """A complete training pass ends the agent's epoch (unless the loader did)."""
        sampler = self.loader.sampler
        if sampler.epoch == epoch and sampler.remaining == 0 and self.job.epoch == epoch:
            self.job.finish_epoch()

    def settle(self) -> None:
        """The batch handed out last has trained: ask for the next now, which commits
        its step and runs the agent's step boundary (maybe a stop: checkpoint and exit)."""
        if self._batches is None or self._pending or self._exhausted:
            return
        batch = self._fetch()
        if batch is not None:
            self._pending.append(batch)
        else:
            progress = self._fit_loop.epoch_loop.batch_progress
            progress.is_last_batch = True

    def _tell_lightning(self, ready: int) -> None:
        """Lightning's epoch length, now that batch ``ready`` (1-based) is handed out."""
        total = ready + self._remaining()
        trainer = self.trainer
        fit_loop = self._fit_loop
        fit_loop.max_batches = total
        fetcher = fit_loop._data_fetcher
        if fetcher is not None:
            fetcher.length = total
        if (isinstance(trainer.val_check_interval, float)
                and getattr(trainer, "_val_check_time_interval", None) is None):
            trainer.val_check_batch = max(1, int(total * trainer.val_check_interval))


class StepBoundary(Callback):
    """Runs the agent's step boundary right after each training batch (see the module)."""

    def __init__(self) -> None:
        self.loader: LightningTrainLoader | None = None

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.loader is not None:
            self.loader.settle()


class LightningState:
    """Lightning's part of a Pollux checkpoint: the fit loop's counters (global step,
    epoch, batches), the learning-rate schedulers, the callbacks' states, and the initial
    total batch size ``M0`` (fixed at the first launch)."""

    def __init__(self, trainer: pl.Trainer) -> None:
        self.trainer = trainer
        self.init_batch_size: int | None = None
        self.restored = False

    def state_dict(self) -> dict[str, Any]:
        trainer = self.trainer
        return {
            "init_batch_size": self.init_batch_size,
            "fit_loop": trainer.fit_loop.state_dict(),
            "lr_schedulers": [config.scheduler.state_dict()
                              for config in trainer.strategy.lr_scheduler_configs],
            "callbacks": {callback.state_key: callback.state_dict()
                          for callback in trainer_callbacks(trainer)},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        trainer = self.trainer
        saved = state.get("init_batch_size")
        self.init_batch_size = None if saved is None else int(saved)
        trainer.fit_loop.load_state_dict(state["fit_loop"])
        configs = trainer.strategy.lr_scheduler_configs
        for config, scheduler_state in zip(configs, state.get("lr_schedulers", [])):
            config.scheduler.load_state_dict(scheduler_state)
        callbacks = state.get("callbacks", {})
        for callback in trainer_callbacks(trainer):
            if callback.state_key in callbacks:
                callback.load_state_dict(callbacks[callback.state_key])
        self.restored = True

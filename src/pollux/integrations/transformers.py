"""``AdaptiveTrainer``: a Hugging Face ``transformers.Trainer`` that Pollux can resize.

Change one class name in a Trainer script and the job becomes adaptive (extra
``[transformers]``)::

    from pollux.integrations.transformers import AdaptiveTrainer

    trainer = AdaptiveTrainer(model=model, args=TrainingArguments(
        output_dir="out", per_device_train_batch_size=8, num_train_epochs=3),
        train_dataset=train, eval_dataset=validation,
        max_batch_size=256, local_bsz_bounds=(4, 64))
    trainer.train()

What changes under the hood, through the Trainer's own extension points:

* the training data comes from a :class:`~pollux.torch.AdaptiveDataLoader`
  (``get_train_dataloader``): one full, seeded pass per epoch, a batch size chosen by
  the agent (``per_device_train_batch_size`` times the first launch's replicas is the
  initial batch ``M0``), exact resume across replica counts;
* the model is wrapped in :class:`~pollux.torch.AdaptiveDataParallel` instead of
  accelerate's DDP (``_wrap_model``), with the Trainer's optimizer: it measures the
  gradient noise and scales the learning rate (AdamW: the Adam-preconditioned rule,
  :class:`~pollux.torch.adam_scale.AdamGainScale`);
* the learning-rate schedule follows the samples trained (``create_scheduler``): a
  step of ``M`` samples advances it by ``M / M0`` steps, so an epoch spans the same part
  of the schedule at any batch size and the schedule ends with the last epoch;
* ``TrainerState`` (global step, epoch, logs, best metric) and the schedule are in
  Pollux's checkpoint: SIGTERM checkpoints at the next step and exits 75, and the job
  resumes on any replica count where it stopped (``resume_from_checkpoint`` is then not
  needed);
* it runs under ``pollux submit``, ``torchrun`` and as a single process; accelerate is
  told the replicas Pollux launched, so evaluation, logging and saving work as usual.

Not supported (refused with the field to change): ``gradient_accumulation_steps`` > 1
(the agent decides the batch), ``auto_find_batch_size``, DeepSpeed and FSDP, training
data without ``__len__``.
"""

from __future__ import annotations

import logging
import math
import types
from collections.abc import Sized
from typing import Any

import torch
from transformers import Trainer, TrainerCallback, TrainerState, TrainingArguments

from pollux.errors import ConfigError
from pollux.integrations._transformers_setup import (
    EpochPasses,
    align_accelerate,
    check_arguments,
    is_hf_dataset,
    rng_states,
    set_rng_states,
)
from pollux.torch.adam_scale import scaling_rule_for
from pollux.torch.data_loader import AdaptiveDataLoader
from pollux.torch.data_parallel import AdaptiveDataParallel
from pollux.torch.distributed import init_process_group
from pollux.torch.epochs import epoch_scope
from pollux.torch.job import AgentConfig, JobContext
from pollux.torch.scaling_rules import ScalingRule

__all__ = ["AdaptiveTrainer"]

logger = logging.getLogger(__name__)

STATE_NAME = "pollux/transformers/trainer"
SCHEDULER_NAME = "pollux/transformers/lr_scheduler"
LOADER_NAME = "train"
_RESTORED_FIELDS = ("epoch", "global_step", "total_flos", "log_history", "best_metric",
                    "best_global_step", "best_model_checkpoint", "num_input_tokens_seen")
"""TrainerState fields carried over a restart (the others are derived from args)."""


class _TrainerRecord:
    """Checkpointed: the initial batch ``M0`` (fixed at the first launch) and the
    Trainer's state at the checkpoint."""

    def __init__(self, trainer: AdaptiveTrainer) -> None:
        self.trainer = trainer
        self.init_batch_size: int | None = None
        self.restored_state: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        state = self.trainer.state
        return {"init_batch_size": self.init_batch_size,
                "trainer_state": {name: getattr(state, name) for name in _RESTORED_FIELDS
                                  if hasattr(state, name)}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.init_batch_size = state.get("init_batch_size")
        self.restored_state = state.get("trainer_state")


class _AgentCallback(TrainerCallback):
    """Keeps the Trainer's accounting on the agent's: restores ``TrainerState`` after a
    restart, reports the epoch as the fraction of samples trained, ends the pass with its
    last step, stops at the sample budget and checkpoints at the end."""

    def __init__(self, trainer: AdaptiveTrainer) -> None:
        self.trainer = trainer

    def on_train_begin(self, args: Any, state: TrainerState, control: Any,
                       **kwargs: Any) -> None:
        trainer = self.trainer
        restored = trainer._record.restored_state
        if restored is None:
            return
        trainer._record.restored_state = None
        for name, value in restored.items():
            if hasattr(state, name):
                setattr(state, name, value)
        # the Trainer read these before this callback: this launch's loss averages
        for attribute in ("_globalstep_last_logged", "_initial_global_step"):
            if hasattr(trainer, attribute):
                setattr(trainer, attribute, state.global_step)
        logger.info("resumed the Trainer at step %d, epoch %.3f", state.global_step,
                    state.epoch or 0.0)

    def on_step_end(self, args: Any, state: TrainerState, control: Any,
                    **kwargs: Any) -> None:
        trainer = self.trainer
        where = trainer._step_position()
        if where is None:
            return
        epoch, end, size, last = where
        state.epoch = epoch + end / size
        # the budget in epochs: all of them, or a fraction (num_train_epochs=2.5, max_steps)
        if (epoch * size + end) * trainer._steps_per_epoch() >= trainer._total_steps * size:
            control.should_training_stop = True
        if last:
            assert trainer._passes is not None
            trainer._passes.finish_pass()

    def on_train_end(self, args: Any, state: TrainerState, control: Any,
                     **kwargs: Any) -> None:
        checkpoint = self.trainer.job.checkpoint
        checkpoint.save()
        checkpoint.wait()


class AdaptiveTrainer(Trainer):
    """A ``transformers.Trainer`` whose batch size, learning rate and replicas adapt.

    Takes the Trainer's arguments, plus:

    * ``max_batch_size``: the largest total batch the agent may choose (None: the batch
      stays at ``M0``, the job is still resizable and resumable);
    * ``local_bsz_bounds``: ``(min, max)`` samples per replica and step;
    * ``scaling_rule``: how the learning rate follows the batch (default: AdamScale for
      Adam and AdamW, else :func:`~pollux.torch.default_scaling_rule`);
    * ``job``: a :class:`~pollux.torch.JobContext` already created (default: one from
      :func:`~pollux.torch.init_process_group` with ``agent_config``).

    >>> trainer = AdaptiveTrainer(model=model, args=args, train_dataset=train,  # doctest: +SKIP
    ...                           max_batch_size=256, local_bsz_bounds=(4, 64))
    >>> trainer.train()  # doctest: +SKIP
    """

    def __init__(self, *args: Any, max_batch_size: int | None = None,
                 local_bsz_bounds: tuple[int, int] | None = None,
                 scaling_rule: ScalingRule | None = None, job: JobContext | None = None,
                 agent_config: AgentConfig | None = None, **kwargs: Any) -> None:
        self.job = job if job is not None else init_process_group(config=agent_config)
        """The agent's context (rank, replicas, checkpoint, stop requests)."""
        rng = rng_states() if self.job.checkpoint.is_restored() else None
        if len(args) > 1:
            training_args = args[1]
        else:
            if kwargs.get("args") is None:  # the Trainer's default, made here to align it
                kwargs["args"] = TrainingArguments(output_dir="trainer_output")
            training_args = kwargs["args"]
        check_arguments(training_args)
        align_accelerate(training_args, self.job)
        super().__init__(*args, **kwargs)
        if rng is not None:  # the Trainer seeds every RNG: put the checkpoint's back
            set_rng_states(rng)
        self.max_batch_size = max_batch_size
        self.local_bsz_bounds = local_bsz_bounds
        self.scaling_rule = scaling_rule
        self.adaptive_model: AdaptiveDataParallel | None = None
        """The model as trained (None before ``train``)."""
        self.adaptive_loader: AdaptiveDataLoader | None = None
        """The agent's training loader (None before ``train``); ``batch_info`` says
        which samples the current micro-batch holds."""
        self._passes: EpochPasses | None = None
        self._record = _TrainerRecord(self)
        self.job.checkpoint.register(STATE_NAME, self._record)
        self._steps_seen = 0
        self._schedule_attached: Any = None
        self._total_steps = 0
        self.add_callback(_AgentCallback(self))

    # -- data --------------------------------------------------------------------------

    @property
    def init_batch_size(self) -> int:
        """``M0``: per-device batch times the replicas of the job's first launch."""
        if self._record.init_batch_size is None:
            self._record.init_batch_size = (self.args.per_device_train_batch_size
                                            * self.job.num_replicas)
        return self._record.init_batch_size

    def get_train_dataloader(self) -> Any:
        if self._passes is not None:
            return self._passes
        if self.train_dataset is None:
            raise ConfigError("train_dataset", None, "training needs a train_dataset")
        dataset = self.train_dataset
        collator = self.data_collator
        if is_hf_dataset(dataset):
            dataset = self._remove_unused_columns(dataset, description="training")
        else:
            collator = self._get_collator_with_removed_columns(collator,
                                                               description="training")
        args = self.args
        options: dict[str, Any] = {"collate_fn": collator,
                                   "num_workers": args.dataloader_num_workers,
                                   "pin_memory": args.dataloader_pin_memory}
        if args.dataloader_num_workers > 0 and args.dataloader_prefetch_factor is not None:
            options["prefetch_factor"] = args.dataloader_prefetch_factor
        seed = args.data_seed if args.data_seed is not None else args.seed
        loader = AdaptiveDataLoader(dataset, batch_size=self.init_batch_size, shuffle=True,
                                    job=self.job, seed=seed, name=LOADER_NAME,
                                    drop_last=args.dataloader_drop_last, **options)
        if self.max_batch_size is not None:
            loader.autoscale_batch_size(self.max_batch_size, self.local_bsz_bounds)
        self.adaptive_loader = loader
        self._passes = EpochPasses(self, loader)
        return self._passes

    def set_initial_training_values(self, args: Any, dataloader: Any) -> tuple[Any, ...]:
        """The Trainer's loop bounds, on the agent's terms: the epochs left to this launch,
        and ``max_steps`` counted in steps of ``M0`` samples (the schedule's length)."""
        values = list(super().set_initial_training_values(args, dataloader))
        per_epoch = self._steps_per_epoch()
        if args.max_steps > 0:
            total = int(args.max_steps)
        else:
            total = math.ceil(args.num_train_epochs * per_epoch)
        self._total_steps = total
        epochs = math.ceil(total / per_epoch)
        num_examples = self._num_train_samples()
        # (epochs, update steps per epoch, examples, train samples, total batch,
        #  batches per epoch, max steps)
        values[0] = max(epochs - self.job.epoch, 0)
        values[2] = num_examples
        values[3] = total * self.init_batch_size
        values[4] = self.init_batch_size
        values[6] = total
        return tuple(values)

    def _num_train_samples(self) -> int:
        dataset = self.train_dataset
        if not isinstance(dataset, Sized):
            raise ConfigError("train_dataset", type(dataset).__name__,
                              "give a map-style data set with __len__ and __getitem__")
        return len(dataset)

    def _steps_per_epoch(self) -> int:
        """Optimizer steps of an epoch at ``M0`` (the schedule's unit)."""
        size, batch = self._num_train_samples(), self.init_batch_size
        return max(size // batch if self.args.dataloader_drop_last else -(-size // batch), 1)

    def _step_position(self) -> tuple[int, int, int, bool] | None:
        """(epoch, samples of the epoch trained after this step, samples in an epoch,
        whether this step is the pass's last) for the micro-batch handed out last."""
        loader = self.adaptive_loader
        info = None if loader is None else loader.batch_info
        if info is None or loader is None:
            return None
        size = len(loader.dataset)
        step = info.num_replicas * info.local_bsz * (info.accum_steps + 1)
        end = min(info.step_start + step, size)
        last = end == size or (loader.drop_last and size - end < step)
        return info.epoch, end, size, last

    def _schedule_position(self, epoch: int, end: int) -> int:
        """Steps of ``M0`` samples trained by the end of sample ``end`` of ``epoch``."""
        per_epoch = self._steps_per_epoch()
        return epoch * per_epoch + min(-(-end // self.init_batch_size), per_epoch)

    # -- model, optimizer, schedule -----------------------------------------------------

    def _wrap_model(self, model: Any, training: bool = True, dataloader: Any = None) -> Any:
        if not training:
            return super()._wrap_model(model, training, dataloader)
        if self.adaptive_model is not None:
            return self.adaptive_model
        optimizer = getattr(self.optimizer, "optimizer", self.optimizer)  # accelerate's
        if optimizer is None:
            raise ConfigError("optimizer", None, "create the optimizer before wrapping")
        rule = self.scaling_rule
        if rule is None:
            rule = scaling_rule_for(optimizer)
        handler = getattr(self.accelerator, "ddp_handler", None)
        ddp_kwargs = handler.to_kwargs() if handler is not None else {}
        self.adaptive_model = AdaptiveDataParallel(
            model, optimizer, scaling_rule=rule, job=self.job,
            grad_scaler=getattr(self.accelerator, "scaler", None), **ddp_kwargs)
        self._steps_seen = self.adaptive_model.optimizer_steps
        return self.adaptive_model

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        """The Trainer's forward and backward pass; out of memory, the agent lowers its
        bound and restarts at a batch that fits (:mod:`pollux.torch.memory_bound`)."""
        try:
            return super().training_step(*args, **kwargs)
        except torch.OutOfMemoryError:
            if self.adaptive_model is not None:
                self.adaptive_model.restart_after_out_of_memory()
            raise

    def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
        scheduler = super().create_scheduler(num_training_steps, optimizer)
        if scheduler is not None and scheduler is not self._schedule_attached:
            self._attach_scheduler(scheduler)
        return scheduler

    def _attach_scheduler(self, scheduler: Any) -> None:
        """Step ``scheduler`` by the ``M0``-steps each optimizer step trained (none in
        a step the optimizer skipped), and checkpoint it."""
        if not hasattr(scheduler, "last_epoch"):  # e.g. ReduceLROnPlateau: on metrics
            return
        trainer = self
        original_step = scheduler.step

        def step(self_: Any, *args: Any, **kwargs: Any) -> None:
            model = trainer.adaptive_model
            where = trainer._step_position()
            if model is None or where is None or args or kwargs:
                original_step(*args, **kwargs)
                return
            if model.optimizer_steps == trainer._steps_seen:
                return
            trainer._steps_seen = model.optimizer_steps
            target = trainer._schedule_position(where[0], where[1])
            while scheduler.last_epoch < target:
                original_step()

        original_state_dict = scheduler.state_dict

        def state_dict(self_: Any) -> dict[str, Any]:  # without the two patches
            return {key: value for key, value in original_state_dict().items()
                    if key not in ("step", "state_dict")}

        scheduler.step = types.MethodType(step, scheduler)
        scheduler.state_dict = types.MethodType(state_dict, scheduler)
        if self._schedule_attached is None:
            if self.job.checkpoint.register(SCHEDULER_NAME, scheduler):
                last = scheduler.get_last_lr()
                inner = getattr(scheduler, "optimizer", None)
                for group, lr in zip(getattr(inner, "param_groups", []), last):
                    group["lr"] = lr  # the construction reset them to the first step's
        self._schedule_attached = scheduler

    # -- entry point --------------------------------------------------------------------

    def train(self, resume_from_checkpoint: Any = None, *args: Any, **kwargs: Any) -> Any:
        if resume_from_checkpoint not in (None, False):
            if not self.job.checkpoint.is_restored():
                raise ConfigError("resume_from_checkpoint", resume_from_checkpoint,
                                  "AdaptiveTrainer resumes from Pollux's checkpoint "
                                  "(POLLUX_CHECKPOINT_DIR) by itself: remove the argument")
            logger.info("resuming from Pollux's checkpoint; resume_from_checkpoint=%r is "
                        "not used", resume_from_checkpoint)
        # the Trainer's epochs are an epoch loop: one pass per epoch, the one in progress
        # resumed after a restart, the epoch moved by EpochPasses (pollux.torch.epochs)
        with epoch_scope(self.job):
            return super().train(None, *args, **kwargs)

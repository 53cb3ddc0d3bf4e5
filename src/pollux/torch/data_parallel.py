"""AdaptiveDataParallel: DistributedDataParallel that measures its gradient noise,
scales its learning rate with the batch size and counts statistical progress.

How it hooks in (the user's training loop stays ordinary):

* a DDP communication hook (:mod:`pollux.torch.gradient_norms`) averages each gradient
  bucket over replicas *and* accumulation micro-steps, and on the way reads the squared
  gradient norms the :class:`~pollux.torch.gradient_noise.GradientNoiseEstimator` needs;
* the optimizer's ``step`` and ``zero_grad`` (and a given ``GradScaler``'s ``step``,
  ``update`` and ``unscale_``) become no-ops during accumulation micro-steps, so a loop
  that steps after every batch accumulates correctly;
* at each real optimizer step the learning rate is multiplied by the scaling rule's
  factor for that step (and restored afterwards: schedulers see the base rate), and
  ``progress`` grows by the step's gain. The optimizer's state is never reset, so Adam's
  moments survive batch-size changes.

Everything above stays on the device; host-side values (gain, statistics) come from
the agreement points (:mod:`pollux.torch.agreement`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from pollux.errors import ConfigError
from pollux.models import GradientStats
from pollux.torch.adam_scale import AdamGainScale, AdamPreconditioner
from pollux.torch.fsdp import (
    ShardedGradients,
    ShardedModelState,
    ShardedOptimizerState,
    is_fully_sharded,
)
from pollux.torch.gradient_noise import GradientNoiseEstimator
from pollux.torch.gradient_norms import (
    GradientNormCollector,
    GradientPair,
    MicroStep,
    comm_hook,
)
from pollux.torch.memory_bound import (
    LocalBatchBound,
    MemoryReader,
    default_memory_reader,
    leave_after_out_of_memory,
)
from pollux.torch.model_followers import begin_followers_micro_step, refresh_followers_stats
from pollux.torch.optimizer_patches import patch_grad_scaler, patch_optimizer
from pollux.torch.scaling_rules import ScalingRule, default_scaling_rule

if TYPE_CHECKING:
    from pollux.torch.batch_size import BatchLimits
    from pollux.torch.job import JobContext

logger = logging.getLogger(__name__)


class _TrainerState:
    """Checkpointed counters of the optimizer loop."""

    def __init__(self) -> None:
        self.optimizer_steps = 0
        self.progress = 0.0

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer_steps": self.optimizer_steps, "progress": self.progress}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer_steps = int(state["optimizer_steps"])
        self.progress = float(state["progress"])


class AdaptiveDataParallel(DistributedDataParallel):
    """DDP with gradient-noise measurement, learning-rate scaling and progress.

    ``scaling_rule`` defaults to AdaScale for SGD and square-root scaling for Adam-like
    optimizers. Pass your ``GradScaler`` as ``grad_scaler`` when training with mixed
    precision. The model is moved to ``job.device``; model, optimizer, scheduler and
    scaler are checkpointed by the job and restored here on restart.

    A module sharded with ``torch.distributed.fsdp.fully_shard`` (FSDP2) is taken as it
    is (not wrapped in DDP): see :mod:`pollux.torch.fsdp`.

    >>> model = AdaptiveDataParallel(net, optimizer, lr_scheduler, job=job)  # doctest: +SKIP
    >>> model.noise_scale(), model.progress  # after some steps  # doctest: +SKIP
    (812.5, 1040.3)
    """

    def __init__(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 lr_scheduler: Any = None, scaling_rule: ScalingRule | None = None, *,
                 job: JobContext, grad_scaler: Any = None, name: str | None = None,
                 memory_reader: MemoryReader | None = None, **ddp_kwargs: Any) -> None:
        job.check_model_name(name)
        sharded = is_fully_sharded(module)
        if sharded and ddp_kwargs:
            raise ConfigError("AdaptiveDataParallel keyword arguments", sorted(ddp_kwargs),
                              "a module sharded with fully_shard takes no DDP arguments")
        module = module.to(job.device)
        checkpoint = job.checkpoint
        prefix = "pollux" if name is None else f"pollux/models/{name}"
        self._bypass_patches = False
        if sharded:
            checkpoint.register(f"{prefix}/model", ShardedModelState(module))
            checkpoint.register(f"{prefix}/optimizer",
                                ShardedOptimizerState(module, optimizer, self._set_bypass))
        else:
            checkpoint.register(f"{prefix}/model", module)
            checkpoint.register(f"{prefix}/optimizer", optimizer)
        if lr_scheduler is not None:
            checkpoint.register(f"{prefix}/lr_scheduler", lr_scheduler)
        if grad_scaler is not None:
            checkpoint.register(f"{prefix}/grad_scaler", grad_scaler)
        if sharded:  # FSDP synchronizes the gradients itself: no DDP underneath
            torch.nn.Module.__init__(self)
            self.module = module
            world = dist.group.WORLD
            assert world is not None  # init_process_group made it
            self.process_group = world
            self.require_backward_grad_sync = True
        else:
            if job.device.type == "cuda":
                ddp_kwargs.setdefault("device_ids", [job.device.index])
            super().__init__(module, **ddp_kwargs)
        self.job = job
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.grad_scaler = grad_scaler
        self.scaling_rule = scaling_rule if scaling_rule is not None \
            else default_scaling_rule(optimizer)
        self.noise = GradientNoiseEstimator(smoothing=job.config.noise_smoothing,
                                            device=job.device)
        self._trainer = _TrainerState()
        checkpoint.register(f"{prefix}/gradient_noise", self.noise)
        checkpoint.register(f"{prefix}/trainer", self._trainer)
        self.memory_bound: LocalBatchBound | None = None
        """The local batch that fits in memory (the job's first model: the batch's)."""
        if not job.models:
            reader = (memory_reader if memory_reader is not None
                      else default_memory_reader(job.device))
            self.memory_bound = LocalBatchBound(job.gpu_type, reader,
                                                directory=job.launch.checkpoint_dir)
            checkpoint.register("pollux/memory_bound", self.memory_bound)
        self._world = dist.get_world_size(self.process_group)
        self._noise_interval = job.config.noise_interval_steps
        self._probe_interval = job.config.probe_interval_steps
        # Micro-step state, set by the data loader (defaults: no accumulation, no stats).
        self._step = MicroStep()
        self._norms = GradientNormCollector(self._step, world_size=self._world,
                                            process_group=self.process_group,
                                            mark=job.profiler.clock.mark)
        self._pair = GradientPair()
        self.grad_stats: GradientStats | None = None
        """Host copy of the gradient statistics at the initial batch (from agreements)."""
        self._sharded = None if not sharded else ShardedGradients(  # the FSDP2 side
            module, self._step, world_size=self._world, process_group=self.process_group,
            mark=job.profiler.clock.mark)
        if not sharded:
            self.register_comm_hook(self._norms, comm_hook)
        if isinstance(self.scaling_rule, AdamGainScale) and not sharded:  # Adam's steps
            self._norms.preconditioner = AdamPreconditioner(optimizer)
        patch_optimizer(self, optimizer)
        if grad_scaler is not None:
            patch_grad_scaler(self, grad_scaler)
        self.name = name
        """The model's name in the job (None: the job's only model)."""
        job.attach_model(self, name)

    # -- public state ---------------------------------------------------------------------

    @property
    def progress(self) -> float:
        """Statistical progress: sum of gains (optimizer steps at the initial batch)."""
        return self._trainer.progress

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps taken (accumulation micro-steps and skipped steps excluded)."""
        return self._trainer.optimizer_steps

    @property
    def accumulating(self) -> bool:
        """True during an accumulation micro-step (no synchronization, no optimizer step)."""
        return self._step.index < self._step.num_micro - 1

    @property
    def has_pending_gradients(self) -> bool:
        """A training forward pass ran since the last optimizer step (its gradients are
        pending); False after an evaluation (``eval()`` or ``no_grad``) forward."""
        return self._step.grads_pending

    @property
    def gain(self) -> float:
        """Statistical gain of the last optimizer step."""
        return self._step.gain

    @property
    def lr_factor(self) -> float:
        """Learning-rate multiplier of the last optimizer step."""
        return self._step.lr_factor

    @property
    def piggyback_max_numel(self) -> int:
        """Largest last bucket that carries the replicas' norms in its own all-reduce."""
        return self._norms.piggyback_max_numel

    @piggyback_max_numel.setter
    def piggyback_max_numel(self, numel: int) -> None:
        self._norms.piggyback_max_numel = int(numel)

    @property
    def compute_end_mark(self) -> Any:
        """Profiler mark taken when the last gradient bucket was ready (if asked for)."""
        return self._step.compute_end_mark

    def bounded_limits(self, limits: BatchLimits) -> BatchLimits:
        """``limits`` with the largest local batch lowered to what fits in memory."""
        return limits if self.memory_bound is None else self.memory_bound.limits(limits)

    def noise_scale(self) -> float | None:
        """Gradient noise scale (samples) from the last agreement, or None."""
        init = self._step.init_batch_size
        if self.grad_stats is None or init is None:
            return None
        return self.grad_stats.noise_scale(init)

    # -- driven by the data loader ---------------------------------------------------------

    def begin_micro_step(self, index: int, num_micro_steps: int, local_bsz: int,
                         step_batch_size: int, init_batch_size: int, regular: bool,
                         mark_compute_end: bool = False, probe: bool = False) -> None:
        """Announce micro-step ``index`` of ``num_micro_steps`` of the next optimizer step.

        ``probe``: one replica without accumulation: keep this step's gradient to pair
        it with the next step's for the noise measurement (:meth:`wants_probe`).
        """
        step = self._step
        step.index = index
        step.num_micro = num_micro_steps
        step.local_bsz = local_bsz
        step.step_batch = step_batch_size
        step.init_batch_size = init_batch_size
        step.mark_compute_end = mark_compute_end
        sync = index == num_micro_steps - 1
        if self._sharded is not None:  # one replica: the shards are the whole gradient
            self._sharded.set_sync(sync or self._world == 1)
        elif self.require_backward_grad_sync != sync:
            self.require_backward_grad_sync = sync
        if index == 0:
            step.reset_norms()
            if self.memory_bound is not None:
                self.memory_bound.begin_step()
            # Every rank has taken the same optimizer steps: they agree on ``collect``.
            step.pair = probe
            step.collect = (regular and (self._world > 1 or num_micro_steps > 1)
                            and self._trainer.optimizer_steps % self._noise_interval == 0)
            step.weight_steps = self._noise_interval
        elif index == 1 and self._world == 1 and step.collect:
            step.first_micro_sqr = (
                self._sharded.local_sqr() if self._sharded is not None
                else self._norms.params_sqr(self.module.parameters(), self.job.device))
        if len(self.job.models) > 1:  # a GAN's other model follows these micro-steps
            begin_followers_micro_step(self, index, num_micro_steps, local_bsz,
                                       step_batch_size, init_batch_size, regular, probe)

    def wants_probe(self, steps_ahead: int = 0) -> bool:
        """Whether the optimizer step ``steps_ahead`` after the next one should keep its
        gradient to measure the gradient noise with the following step's
        (:class:`~pollux.torch.gradient_norms.GradientPair`): with one replica, every
        ``probe_interval_steps``-th step (several replicas, or accumulation, measure
        within a step). Never in a job of several models (:mod:`pollux.torch.
        model_followers`): a GAN's generator loss back-propagates through the
        discriminator after its step, which a pair of steps must not mix in."""
        return (self._world == 1 and len(self.job.models) == 1
                and (self._trainer.optimizer_steps + steps_ahead) % self._probe_interval == 0)

    # -- gradient statistics ----------------------------------------------------------------

    def _loss_scale_sqr(self) -> torch.Tensor | float:
        scaler = self.grad_scaler
        if scaler is None or not scaler.is_enabled():
            return 1.0
        scale = getattr(scaler, "_scale", None)
        if isinstance(scale, torch.Tensor):
            return scale.double().square()
        return float(scaler.get_scale()) ** 2

    def _fold_gradient_stats(self) -> None:
        step = self._step
        sharded = self._sharded
        if sharded is not None:
            sharded.average_micro_steps()
        if self._world == 1 and step.num_micro == 1:
            if step.pair or self._pair.holding:
                grads = (sharded.local_grads() if sharded is not None
                         else self._norms.step_gradients(self.module.parameters()))
                batch = step.step_batch or step.local_bsz or 0
                m0 = step.init_batch_size or batch
                self._pair.observe(grads, batch, step.pair, self._loss_scale_sqr(),
                                   self.noise, scale=batch / max(m0, 1) * self._probe_interval)
            return
        if sharded is not None:
            sharded.fold(self.noise, self._loss_scale_sqr())
        else:
            self._norms.fold(self.noise, self._loss_scale_sqr())

    def set_grad_stats(self, stats: GradientStats | None) -> None:
        """Use these statistics (agreed across ranks) for gains and learning rates."""
        self.grad_stats = stats
        if len(self.job.models) > 1:
            refresh_followers_stats(self)

    def step_gain(self, batch_size: int | None) -> tuple[float, float]:
        """(scale, gain) of an optimizer step at total ``batch_size``."""
        init = self._step.init_batch_size
        if batch_size is None or init is None:
            return 1.0, 1.0
        scale = batch_size / init
        stats = self.grad_stats
        if stats is None:
            return scale, 1.0
        if stats.var + stats.sqr <= 0:
            return scale, scale
        return scale, (stats.var + stats.sqr) / max(stats.var / scale + stats.sqr, 1e-30)

    # -- the optimizer's step (patched: pollux.torch.optimizer_patches) ------------------------

    def _set_bypass(self, bypass: bool) -> None:
        """While True, the optimizer's step and zero_grad run unpatched (the state-dict
        helpers of an FSDP checkpoint step once, with zero gradients, to create state)."""
        self._bypass_patches = bypass

    def _optimizer_step(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self._bypass_patches:
            return original(*args, **kwargs)
        if self.accumulating:
            return None
        self._fold_gradient_stats()
        step = self._step
        scale, step_gain = self.step_gain(step.step_batch)
        factor = self.scaling_rule.lr_factor(scale, step_gain, self._trainer.progress)
        groups = self.optimizer.param_groups
        base = [group["lr"] for group in groups]
        if factor != 1.0:  # (1: e.g. at the initial batch size, nothing to scale)
            for group, lr in zip(groups, base):
                group["lr"] = lr * factor
        try:
            result = original(*args, **kwargs)
        except torch.OutOfMemoryError:  # e.g. Adam's state, created at the first step
            self.restart_after_out_of_memory()
            raise
        finally:
            if factor != 1.0:
                for group, lr in zip(groups, base):
                    group["lr"] = lr
        step.grads_pending = False
        if self.memory_bound is not None and step.local_bsz is not None:
            self.memory_bound.observe_step(step.local_bsz)
        self._trainer.optimizer_steps += 1
        self._trainer.progress += step_gain
        step.gain = step_gain
        step.lr_factor = factor
        return result

    # -- module overrides ---------------------------------------------------------------------

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        if self.training and torch.is_grad_enabled():
            self._step.grads_pending = True
        try:
            if self._sharded is not None:
                return self.module(*inputs, **kwargs)
            return super().forward(*inputs, **kwargs)
        except torch.OutOfMemoryError:
            self.restart_after_out_of_memory()
            raise

    def restart_after_out_of_memory(self) -> None:
        """The step ran out of memory: lower the bound and exit 75 to restart from the last
        checkpoint at a batch that fits; returns when nothing smaller can help (the caller
        re-raises). The forward pass and the optimizer step call it; around a backward
        pass, call it in ``except torch.OutOfMemoryError`` (the integrations do)."""
        limits = getattr(self.job.current_dataloader, "limits", None)
        local = self._step.local_bsz
        if (self.memory_bound is None or limits is None or local is None
                or not self.job.checkpoint.enabled):
            return
        leave_after_out_of_memory(self.memory_bound, local, limits.local_bsz_bounds[0],
                                  self.job.close, self.job.device)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._step.grads_pending:  # keep accumulated gradients
            return
        super().zero_grad(set_to_none)

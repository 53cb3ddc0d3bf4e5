"""Pollux for Lightning: :class:`AdaptiveStrategy` (extra ``[lightning]``).

One argument changes in a Lightning script::

    trainer = lightning.Trainer(max_epochs=10, accelerator="cpu",
                                strategy=AdaptiveStrategy(max_batch_size=1024,
                                                          local_bsz_bounds=(16, 256)))
    trainer.fit(module)

The module's own ``train_dataloader()`` becomes the agent's
:class:`~pollux.torch.AdaptiveDataLoader`: its ``batch_size`` is the initial batch per
replica (the initial total batch ``M0`` is that times the replicas of the first launch,
and kept on every restart), its ``shuffle`` and ``drop_last`` are kept, and Pollux picks
the batch size between ``M0`` and ``max_batch_size``. The model is wrapped in
:class:`~pollux.torch.AdaptiveDataParallel` (DDP with the gradient noise scale and the
learning-rate rule, AdamScale for Adam and AdamW), hints go to the scheduler, and SIGTERM
checkpoints (model, optimizer, schedulers, Lightning's loop counters, callbacks, the
data cursor) and exits with 75; a relaunch on any number of replicas resumes the same
epoch, global step and sample order. It runs under the Pollux scheduler, ``torchrun``,
or as a single process. Validation, test and prediction loaders stay Lightning's (each
replica evaluates its share).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.fabric.plugins import ClusterEnvironment
from lightning.fabric.utilities import rank_zero as fabric_rank_zero
from lightning.fabric.utilities.optimizer import _optimizers_to_device
from lightning.pytorch.strategies import ParallelStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero as pl_rank_zero
from torch.optim import Optimizer

import pollux.torch as pt
from pollux.errors import ConfigError
from pollux.integrations._lightning_loader import (
    LightningState,
    LightningTrainLoader,
    StepBoundary,
    adaptive_loader_options,
)
from pollux.torch.adam_scale import scaling_rule_for
from pollux.torch.distributed import default_device
from pollux.torch.epochs import epoch_scope

__all__ = ["AdaptiveStrategy", "PolluxEnvironment"]

logger = logging.getLogger(__name__)

STATE_KEY = "lightning/trainer"
"""The key of Lightning's state in the job's checkpoints."""


class PolluxEnvironment(ClusterEnvironment):
    """Lightning's view of where this replica sits, read from its launcher (the Pollux
    scheduler, ``torchrun``, or none) by :func:`pollux.torch.read_launch_environment`.
    The processes are started by the launcher, never by Lightning."""

    def __init__(self, launch: pt.LaunchEnvironment | None = None) -> None:
        self.launch = launch if launch is not None else pt.read_launch_environment()

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return str(self.launch.master_addr or "127.0.0.1")

    @property
    def main_port(self) -> int:
        return int(self.launch.master_port or 0)

    @staticmethod
    def detect() -> bool:
        return True

    def world_size(self) -> int:
        return self.launch.num_replicas

    def set_world_size(self, size: int) -> None:
        """The launcher decides (Lightning's ``devices``/``num_nodes`` are not used)."""

    def global_rank(self) -> int:
        return self.launch.rank

    def set_global_rank(self, rank: int) -> None:
        """The launcher decides."""

    def local_rank(self) -> int:
        return self.launch.local_rank

    def node_rank(self) -> int:
        return self.launch.node_rank

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Any ``devices``/``num_nodes``: one process per replica, as launched."""


def _check_bounds(max_batch_size: int | None,
                  local_bsz_bounds: tuple[int, int] | None) -> None:
    if max_batch_size is not None and (isinstance(max_batch_size, bool)
                                       or not isinstance(max_batch_size, int)
                                       or max_batch_size < 1):
        raise ConfigError("max_batch_size", max_batch_size,
                          "an integer >= 1 (None: keep the initial batch size)")
    if local_bsz_bounds is not None:
        ok = (len(local_bsz_bounds) == 2
              and all(isinstance(b, int) and not isinstance(b, bool) for b in local_bsz_bounds)
              and 1 <= local_bsz_bounds[0] <= local_bsz_bounds[1])
        if not ok:
            raise ConfigError("local_bsz_bounds", local_bsz_bounds,
                              "a pair (low, high) of integers with 1 <= low <= high")
        if max_batch_size is None:
            raise ConfigError("local_bsz_bounds", local_bsz_bounds,
                              "give max_batch_size too (the bounds apply when the batch "
                              "size adapts)")


def _skip_sigterm_broadcast(trainer: pl.Trainer) -> None:
    """Drop Lightning's per-batch broadcast of its SIGTERM flag (a blocking collective
    on every batch, a sixth of a small model's step on 2 replicas): with the agent's
    handler installed Lightning's flag stays False, and the agent's stop watch already
    agrees on stops without blocking (:class:`pollux.torch.agreement.StopWatch`)."""
    epoch_loop = trainer.fit_loop.epoch_loop
    if hasattr(type(epoch_loop), "_broadcast_sigterm_tensor"):
        epoch_loop._broadcast_sigterm_tensor = _no_broadcast  # type: ignore[method-assign]


def _no_broadcast() -> None:
    """Stands in for Lightning's SIGTERM broadcast (see :func:`_skip_sigterm_broadcast`)."""


class AdaptiveStrategy(ParallelStrategy):
    """Lightning strategy that trains with the Pollux agent (see the module).

    ``max_batch_size``: the largest total batch Pollux may choose (None: the batch size
    stays the initial one, the job is still elastic and resumable); ``local_bsz_bounds``:
    (low, high) per replica. ``checkpoint_dir``, ``config`` and ``scaling_rule`` go to the
    agent (:func:`pollux.torch.init_process_group`, :class:`pollux.torch.AgentConfig`,
    :class:`pollux.torch.AdaptiveDataParallel`); ``seed`` seeds the sample order; other
    keyword arguments go to DDP (e.g. ``find_unused_parameters=True``).

    >>> trainer = lightning.Trainer(strategy=AdaptiveStrategy(max_batch_size=512))  # doctest: +SKIP
    """

    strategy_name = "pollux_adaptive"

    def __init__(self, max_batch_size: int | None = None,
                 local_bsz_bounds: tuple[int, int] | None = None, *,
                 checkpoint_dir: str | None = None, config: pt.AgentConfig | None = None,
                 scaling_rule: pt.ScalingRule | None = None, seed: int = 0,
                 accelerator: Any = None, **ddp_kwargs: Any) -> None:
        _check_bounds(max_batch_size, local_bsz_bounds)
        environment = PolluxEnvironment()
        super().__init__(accelerator=accelerator, cluster_environment=environment)
        self.max_batch_size = max_batch_size
        self.local_bsz_bounds = (None if local_bsz_bounds is None
                                 else (int(local_bsz_bounds[0]), int(local_bsz_bounds[1])))
        self.checkpoint_dir = checkpoint_dir
        self.agent_config = config
        self.scaling_rule = scaling_rule
        self.seed = int(seed)
        self._ddp_kwargs = ddp_kwargs
        self.job: pt.JobContext | None = None
        """The agent's context of this process (from ``setup_environment``)."""
        self.adaptive_model: pt.AdaptiveDataParallel | None = None
        self.train_loader: LightningTrainLoader | None = None
        self._state: LightningState | None = None
        self._boundary = StepBoundary()
        self._sigterm_handler: Callable[..., Any] | int | None = None
        self._epoch_scope = contextlib.ExitStack()
        # only rank 0 prints Lightning's rank-zero messages (Lightning reads no Pollux
        # variables to know the rank)
        pl_rank_zero.rank_zero_only.rank = environment.global_rank()  # type: ignore[attr-defined]
        fabric_rank_zero.rank_zero_only.rank = environment.global_rank()  # type: ignore[attr-defined]

    # -- where this replica runs ------------------------------------------------------------

    @property
    def cluster(self) -> PolluxEnvironment:
        environment = self.cluster_environment
        assert isinstance(environment, PolluxEnvironment)
        return environment

    @property
    def root_device(self) -> torch.device:
        if self.job is not None:
            return self.job.device
        if self.accelerator is not None and isinstance(
                self.accelerator, pl.accelerators.CUDAAccelerator):
            return default_device(self.cluster.local_rank())
        return torch.device("cpu")

    @property
    def is_distributed(self) -> bool:
        """True (Lightning syncs ``sync_dist`` metrics and shards the evaluation loaders
        with its DistributedSampler), except while Lightning prepares the training
        loader: the agent splits that one itself."""
        module = self.lightning_module
        trainer = module._trainer if module is not None else None
        preparing = (trainer is not None and trainer.training and self.job is not None
                     and self.train_loader is None)
        return not preparing

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    def setup_environment(self) -> None:
        if self.job is None:
            self.job = pt.init_process_group(checkpoint_dir=self.checkpoint_dir,
                                             config=self.agent_config)
            if threading.current_thread() is threading.main_thread():
                self._sigterm_handler = signal.getsignal(signal.SIGTERM)
        super().setup_environment()

    def model_to_device(self) -> None:
        assert self.model is not None
        self.model.to(self.root_device)

    # -- the model, its optimizer and the state checkpointed ----------------------------------

    def setup(self, trainer: pl.Trainer) -> None:
        assert self.accelerator is not None and self.model is not None
        self.accelerator.setup(trainer)
        self.model = self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        if trainer.state.fn == TrainerFn.FITTING:
            self._setup_fitting(trainer)
        self.setup_precision_plugin()
        if trainer.state.fn == TrainerFn.FITTING:
            _optimizers_to_device(self.optimizers, self.root_device)

    def _setup_fitting(self, trainer: pl.Trainer) -> None:
        job = self.job
        module = self.lightning_module
        assert job is not None and module is not None
        if not module.automatic_optimization:
            raise ConfigError("automatic_optimization", False,
                              "AdaptiveStrategy drives Lightning's automatic optimization "
                              "(one optimizer); remove automatic_optimization = False")
        if trainer.accumulate_grad_batches != 1:
            raise ConfigError("accumulate_grad_batches", trainer.accumulate_grad_batches,
                              "leave it at 1: Pollux chooses the batch size")
        self.setup_optimizers(trainer)
        if len(self.optimizers) != 1:
            raise ConfigError("configure_optimizers()", len(self.optimizers),
                              "return exactly one optimizer under AdaptiveStrategy")
        optimizer = self.optimizers[0]
        rule = self.scaling_rule or scaling_rule_for(optimizer)
        scaler = getattr(self.precision_plugin, "scaler", None)
        kwargs = dict(self._ddp_kwargs)
        self.adaptive_model = pt.AdaptiveDataParallel(module, optimizer, scaling_rule=rule,
                                                      job=job, grad_scaler=scaler, **kwargs)
        self.model = self.adaptive_model
        self._state = LightningState(trainer)
        job.checkpoint.register(STATE_KEY, self._state)
        # Lightning's epochs are an epoch loop: one training pass per epoch, resumed
        # after a restart, the epoch moved by this strategy (pollux.torch.passes)
        self._epoch_scope.enter_context(epoch_scope(job))
        callbacks: list[Any] = trainer.callbacks  # type: ignore[attr-defined]
        if self._boundary not in callbacks:
            callbacks.append(self._boundary)

    # -- the training loader ---------------------------------------------------------------

    def process_dataloader(self, dataloader: object) -> object:
        module = self.lightning_module
        trainer = module.trainer if module is not None else None
        if trainer is None or not trainer.training or self.job is None:
            return dataloader
        if self._state is None:
            raise ConfigError("trainer.estimated_stepping_batches", None,
                              "the training loader was asked for before the model was "
                              "wrapped (in configure_optimizers?): under AdaptiveStrategy "
                              "the steps depend on the batch sizes chosen; size the "
                              "schedule from the epochs and the data set")
        if self.train_loader is not None:
            return self.train_loader
        dataset, local_bsz, shuffle, drop_last, options = adaptive_loader_options(dataloader)
        state = self._state
        if state.init_batch_size is None:
            state.init_batch_size = local_bsz * self.job.num_replicas
        loader = pt.AdaptiveDataLoader(dataset, batch_size=state.init_batch_size,
                                       shuffle=shuffle, job=self.job, seed=self.seed,
                                       drop_last=drop_last, name="lightning_train",
                                       **options)
        if self.max_batch_size is not None:
            loader.autoscale_batch_size(self.max_batch_size, self.local_bsz_bounds)
        self.train_loader = LightningTrainLoader(loader, trainer)
        self._boundary.loader = self.train_loader
        return self.train_loader

    def on_train_start(self) -> None:
        # Lightning's SIGTERM handler (installed after setup) would end the fit at the
        # next batch without a checkpoint: the agent's checkpoints first, then exits 75
        if self._sigterm_handler is not None and callable(self._sigterm_handler) and (
                threading.current_thread() is threading.main_thread()):
            signal.signal(signal.SIGTERM, self._sigterm_handler)
            module = self.lightning_module
            if module is not None and module._trainer is not None:
                _skip_sigterm_broadcast(module._trainer)

    def on_train_end(self) -> None:
        if self.job is not None:
            self.job.checkpoint.save()  # a finished job relaunched ends at once

    # -- one optimizer step ------------------------------------------------------------------

    def optimizer_step(self, optimizer: Optimizer, closure: Callable[[], Any],
                       model: pl.LightningModule | torch.nn.Module | None = None,
                       **kwargs: Any) -> Any:
        """Clear the gradients, run the closure (forward and backward), then step: the
        agent's step reads the gradients the closure made (noise scale, learning rate)."""
        if self.adaptive_model is None:
            return super().optimizer_step(optimizer, closure, model, **kwargs)
        optimizer.zero_grad()  # the agent keeps pending (accumulated) gradients
        try:
            result = closure()
        except torch.OutOfMemoryError:  # in the backward pass (the forward's is caught)
            self.adaptive_model.restart_after_out_of_memory()
            raise
        if result is None:  # training_step returned None: no backward, no step
            return None
        return super().optimizer_step(optimizer, lambda: result, model, **kwargs)

    # -- collectives --------------------------------------------------------------------------

    def _group(self) -> Any:
        return self.job.control_group if self.job is not None else None

    def barrier(self, name: str | None = None) -> None:
        if self.world_size > 1 and dist.is_initialized():
            dist.barrier(group=self._group())

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if self.world_size == 1 or not dist.is_initialized():
            return obj
        holder = [obj]
        dist.broadcast_object_list(holder, src, group=self._group())
        return holder[0]

    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        """All-reduce ``tensor`` over the replicas: ``mean``/``avg`` (default), ``sum``,
        ``max``, ``min`` (a name or a ``ReduceOp``)."""
        if not isinstance(tensor, torch.Tensor) or self.world_size == 1 or (
                not dist.is_initialized()):
            return tensor
        name = str(getattr(reduce_op, "name", reduce_op) or "mean").lower()
        name = name.rsplit(".", 1)[-1]
        ops = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM,
               "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
        if name not in ops:
            raise ConfigError("reduce_op", reduce_op, "use mean, sum, max or min")
        result = tensor.detach().clone() if tensor.dtype.is_floating_point else tensor.clone()
        if name in ("mean", "avg") and not result.dtype.is_floating_point:
            result = result.double()
        dist.all_reduce(result, op=ops[name], group=group)
        if name in ("mean", "avg"):
            result = result / self.world_size
        return result

    # -- the end ------------------------------------------------------------------------------

    def teardown(self) -> None:
        module = self.lightning_module
        if self.adaptive_model is not None and module is not None:
            self.model = module
        fitting = module is not None and module._trainer is not None and (
            module._trainer.state.fn == TrainerFn.FITTING)
        super().teardown()
        self._epoch_scope.close()
        if fitting and self.job is not None:
            self.job.close()
            self.job = None
            self.adaptive_model = None
            self.train_loader = None
            self._boundary.loader = None

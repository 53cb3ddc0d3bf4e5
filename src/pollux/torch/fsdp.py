"""FSDP2 (``torch.distributed.fsdp.fully_shard``) under the agent: the gradient noise from
sharded gradients, accumulation, and checkpoints that restore on any replica count.

:class:`~pollux.torch.data_parallel.AdaptiveDataParallel` accepts a module sharded with
``fully_shard`` (every replica holds a shard of each parameter, its gradient and its
optimizer state). No full gradient is ever gathered to measure the noise:

* each replica's own squared gradient norm (before averaging) is read where FSDP has it
  whole anyway: the input of each reduce-scatter, through FSDP's public custom
  reduce-scatter hook (:class:`NormCapturingReduceScatter`); summed over the FSDP units of
  the model it is the replica's ``|g_i|^2``;
* the averaged gradient's squared norm is the sum over replicas of the squared norms of
  their shards;

the two local sums travel in one two-element all-reduce at the optimizer step. With one
replica (no reduce-scatter) the first micro-batch's gradient is read from the shards, as
:mod:`pollux.torch.gradient_norms` does for DDP. Accumulation micro-steps run without
gradient synchronization (``set_requires_gradient_sync(False)``); the accumulated sum is
divided by the number of micro-steps before the optimizer step.

Checkpoints hold full (unsharded) state dicts gathered to rank 0's memory on the CPU
(``torch.distributed.checkpoint.state_dict`` with ``full_state_dict=True``); on restore
every replica keeps its own shard of them, whatever the replica count.

Not supported: Adam's preconditioned noise metric (the divisor of each element lives on
the replica that holds its shard only): an Adam-like optimizer keeps square-root scaling,
measured on the plain gradients.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from pollux.torch.gradient_noise import GradientNoiseEstimator
from pollux.torch.gradient_norms import MicroStep, squared_norm

_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
"""The one-tensor reduce-scatter (``reduce_scatter_single`` since torch 2.10)."""
_LOW_RANGE_SAFE = (torch.float32, torch.bfloat16)
"""Reduce dtypes FSDP reduces without dividing the input first (see predivide_factor)."""


def is_fully_sharded(module: torch.nn.Module) -> bool:
    """Whether ``module`` (the root) was sharded with ``fully_shard`` (FSDP2)."""
    return isinstance(module, FSDPModule)


def predivide_factor(dtype: torch.dtype, world_size: int) -> float:
    """What FSDP divides a reduce-scatter's input by before reducing it: 1 for float32 and
    bfloat16, about ``sqrt(world_size)`` (a power of two) for dtypes that could overflow."""
    if dtype in _LOW_RANGE_SAFE:
        return 1.0
    factor, pre = float(world_size), 1
    while factor % pre == 0 and factor / pre > pre:
        pre *= 2
    return float(pre)


class NormCapturingReduceScatter:
    """FSDP's reduce-scatter (the interface ``FSDPModule.set_custom_reduce_scatter``
    takes: ``allocate`` and a call), which on measured steps first adds the squared norm of its
    input (this replica's whole gradient of one FSDP unit, not averaged yet) to the
    step's local parts, and marks the end of the backward computation."""

    def __init__(self, step: MicroStep, world_size: int, mark: Callable[[], Any]) -> None:
        self.step = step
        self.world_size = world_size
        self.mark = mark

    def allocate(self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, op: Any, async_op: bool = False) -> Any:
        step = self.step
        if step.collect:
            pre = predivide_factor(input_tensor.dtype, self.world_size)
            step.local_parts.append(squared_norm(input_tensor) * (pre * pre))
        if step.mark_compute_end:  # the last unit's reduce comes at the end of backward
            step.compute_end_mark = self.mark()
        return _REDUCE_SCATTER(output_tensor, input_tensor, op=op, group=group,
                               async_op=async_op)


class ShardedGradients:
    """The gradient side of an FSDP2 model under :class:`AdaptiveDataParallel`."""

    def __init__(self, module: torch.nn.Module, step: MicroStep, *, world_size: int,
                 process_group: Any, mark: Callable[[], Any]) -> None:
        self.module = module
        self.step = step
        self.world_size = world_size
        self.process_group = process_group
        self.params = [p for p in module.parameters() if p.requires_grad]
        comm = NormCapturingReduceScatter(step, world_size, mark)
        for sub in module.modules():
            if isinstance(sub, FSDPModule):
                sub.set_custom_reduce_scatter(comm)  # type: ignore[arg-type]
        self._syncing = True

    def set_sync(self, sync: bool) -> None:
        """Reduce-scatter at the end of this backward pass (False: accumulate unsharded)."""
        if sync != self._syncing:
            assert isinstance(self.module, FSDPModule)
            self.module.set_requires_gradient_sync(sync)
            self._syncing = sync

    def local_grads(self) -> list[torch.Tensor]:
        """This replica's shards of the gradients (views: writing them writes the grads)."""
        grads = []
        for param in self.params:
            grad = param.grad
            if grad is not None:
                grads.append(grad.to_local() if isinstance(grad, DTensor) else grad)
        return grads

    def local_sqr(self) -> torch.Tensor:
        """Sum of the squared entries of this replica's gradient shards (float64)."""
        grads = self.local_grads()
        if not grads:
            return torch.zeros((), dtype=torch.float64)
        norms = torch._foreach_norm(grads)
        return torch.stack([n.double() for n in norms]).square().sum()

    def average_micro_steps(self) -> None:
        """Turn the accumulated sum of the micro-steps' mean gradients into their mean."""
        micro = self.step.num_micro
        grads = self.local_grads()
        if micro > 1 and grads:
            torch._foreach_div_(grads, float(micro))

    def fold(self, noise: GradientNoiseEstimator, loss_scale_sqr: torch.Tensor | float) -> None:
        """Give a measured step's two norms to ``noise`` (after
        :meth:`average_micro_steps`): several replicas measure within the step; one
        replica needs accumulation (its first micro-batch against the whole step)."""
        step = self.step
        if not step.collect or step.local_bsz is None:
            return
        b, micro, world = step.local_bsz, step.num_micro, self.world_size
        big_local = self.local_sqr()
        m0 = step.init_batch_size
        if world > 1:
            if not step.local_parts:
                return
            small_local = torch.stack(step.local_parts).sum().to(big_local.device)
            both = torch.stack([small_local / (micro * micro), big_local])
            dist.all_reduce(both, group=self.process_group)
            small = both[0] / world / loss_scale_sqr
            big = both[1] / loss_scale_sqr
            small_bsz, big_bsz = b * micro, world * b * micro
        else:
            if step.first_micro_sqr is None:
                return
            small = step.first_micro_sqr / loss_scale_sqr
            big = big_local / loss_scale_sqr
            small_bsz, big_bsz = b, step.step_batch or b * micro
        m0 = m0 or big_bsz
        noise.update(small, small_bsz, big, big_bsz, scale=big_bsz / m0 * step.weight_steps)
        step.local_parts = []


_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)
"""Save: full state gathered to rank 0's CPU memory (other ranks get nothing)."""
_LOAD = StateDictOptions(full_state_dict=True)
"""Load: every rank has read the full state and keeps its own shard."""


class ShardedModelState:
    """Checkpoint state of a sharded module: its full state dict (rank 0 holds it)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def state_dict(self) -> dict[str, Any]:
        return dict(get_model_state_dict(self.module, options=_FULL))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_model_state_dict(self.module, state, options=_LOAD)


class ShardedOptimizerState:
    """Checkpoint state of an optimizer over sharded parameters, keyed by parameter name
    (so it restores on any replica count). ``bypass`` is called around the calls that
    may run the optimizer's ``step`` to initialize its state (with zero gradients and a
    zero learning rate): the agent must not count that as a training step."""

    def __init__(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 bypass: Callable[[bool], None]) -> None:
        self.module = module
        self.optimizer = optimizer
        self.bypass = bypass

    def state_dict(self) -> dict[str, Any]:
        self.bypass(True)
        try:
            return dict(get_optimizer_state_dict(self.module, self.optimizer, options=_FULL))
        finally:
            self.bypass(False)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.bypass(True)
        try:
            set_optimizer_state_dict(self.module, self.optimizer, state, options=_LOAD)
        finally:
            self.bypass(False)

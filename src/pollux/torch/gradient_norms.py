"""Gradient-norm collection: the squared norms the noise estimator needs, read from the
gradients a data-parallel step computes anyway.

:class:`GradientNormCollector` is the state of :class:`~pollux.torch.data_parallel.
AdaptiveDataParallel`'s DDP communication hook. The hook averages each gradient bucket
over replicas *and* accumulation micro-steps and, on steps chosen for measurement, reads

* with several replicas: each replica's own squared norm (summed over replicas by riding
  on the last bucket's all-reduce: no extra collective for small buckets) and the
  averaged gradient's;
* with one replica and accumulation: the first micro-batch's accumulated gradient (read
  before the second micro-step) and the averaged gradient's;
* with one replica without accumulation (:class:`GradientPair`): every
  ``probe_interval_steps``-th step's gradient is kept and paired with the next step's,
  two independent batches of the same size; the loader's batches keep their size.

:meth:`GradientNormCollector.fold` hands the two norms to a
:class:`~pollux.torch.gradient_noise.GradientNoiseEstimator` at the optimizer step.
Everything stays on the device: no host synchronization.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

import torch
import torch.distributed as dist

from pollux.torch.gradient_noise import GradientNoiseEstimator

EXACT_DTYPES = (torch.float32, torch.float64)
PIGGYBACK_MAX_NUMEL = 1 << 18
"""Up to this size the last bucket is copied to carry the replicas' norms in its own
all-reduce; above it, copying costs more than a separate tiny all-reduce."""


class Preconditioner(Protocol):
    """Squared norms of gradients in a preconditioned metric (see
    :class:`pollux.torch.adam_scale.AdamPreconditioner`)."""

    def squared_norm(self, params: Iterable[torch.Tensor],
                     flat: torch.Tensor | None = None) -> torch.Tensor: ...

    def divisor(self, param: torch.Tensor) -> torch.Tensor | None: ...


class MicroStep:
    """Where the current optimizer step stands (a plain object: setting attributes on an
    ``nn.Module`` costs microseconds each, which tiny models would notice)."""

    __slots__ = ("index", "num_micro", "local_bsz", "step_batch", "init_batch_size",
                 "collect", "grads_pending", "local_parts", "global_parts", "local_sqr_sum",
                 "first_micro_sqr", "mark_compute_end", "compute_end_mark", "gain",
                 "lr_factor", "weight_steps", "pair")

    def __init__(self) -> None:
        self.index = 0
        self.num_micro = 1
        self.local_bsz: int | None = None
        self.step_batch: int | None = None
        self.init_batch_size: int | None = None
        self.collect = False
        self.grads_pending = False
        self.local_parts: list[torch.Tensor] = []
        self.global_parts: list[torch.Tensor] = []
        self.local_sqr_sum: torch.Tensor | None = None
        self.first_micro_sqr: torch.Tensor | None = None
        self.mark_compute_end = False
        self.compute_end_mark: Any = None
        self.gain = 1.0
        self.lr_factor = 1.0
        self.weight_steps = 1
        """Optimizer steps this step's measurement stands for (until the next one)."""
        self.pair = False
        """One replica without accumulation: keep this step's gradient to pair it with
        the next step's (:class:`GradientPair`)."""

    def reset_norms(self) -> None:
        """Forget the previous step's norms (at micro-step 0)."""
        self.grads_pending = False
        self.local_parts = []
        self.global_parts = []
        self.local_sqr_sum = None
        self.first_micro_sqr = None
        self.compute_end_mark = None


def all_reduce(tensor: torch.Tensor, group: Any) -> torch.futures.Future[Any]:
    """Asynchronous SUM all-reduce straight on the process group: ``dist.all_reduce``'s
    Python checks cost ~20 us a call, which a step of a few milliseconds notices."""
    return group.allreduce([tensor]).get_future()


def _total(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.stack(parts).sum()


def squared_norm(tensor: torch.Tensor) -> torch.Tensor:
    """``|tensor|^2`` in float64 (low-precision tensors are reduced in float32)."""
    dtype = None if tensor.dtype in EXACT_DTYPES else torch.float32
    return torch.linalg.vector_norm(tensor, dtype=dtype).double().square()


def accumulated_grad_sqr(parameters: Iterable[torch.nn.Parameter],
                         device: torch.device) -> torch.Tensor:
    """Squared norm of the gradients accumulated so far in ``parameters``."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.zeros((), dtype=torch.float64, device=device)
    norms = torch._foreach_norm(grads)
    return torch.stack([n.double() for n in norms]).square().sum()


class GradientNormCollector:
    """The communication hook's state: averages buckets and collects squared norms."""

    def __init__(self, step: MicroStep, *, world_size: int, process_group: Any,
                 mark: Callable[[], Any]) -> None:
        self.step = step
        self.world_size = world_size
        self.process_group = process_group
        self.mark = mark
        """Clock mark taken when the last bucket is ready (if the step asks for it)."""
        self.piggyback_max_numel = PIGGYBACK_MAX_NUMEL
        self.preconditioner: Preconditioner | None = None
        """Measure the norms of preconditioned gradients (AdamScale), or plain ones."""

    def bucket_sqr(self, bucket: dist.GradBucket, flat: torch.Tensor) -> torch.Tensor:
        """Squared norm of a bucket's gradients (``flat``: its buffer, or the average)."""
        if self.preconditioner is None:
            return squared_norm(flat)
        return self.preconditioner.squared_norm(bucket.parameters(), flat)

    def params_sqr(self, parameters: Iterable[torch.nn.Parameter],
                   device: torch.device) -> torch.Tensor:
        """Squared norm of the gradients accumulated so far in ``parameters``."""
        if self.preconditioner is None:
            return accumulated_grad_sqr(parameters, device)
        return self.preconditioner.squared_norm(parameters).to(device)

    def step_gradients(self, parameters: Iterable[torch.nn.Parameter]) -> list[torch.Tensor]:
        """The gradients of ``parameters`` in the measured metric (preconditioned for
        AdamScale; none before Adam's first step) for :class:`GradientPair`."""
        params = [p for p in parameters if p.grad is not None]
        grads = [p.grad for p in params if p.grad is not None]
        if self.preconditioner is None:
            return grads
        divisors = [self.preconditioner.divisor(p) for p in params]
        if any(d is None for d in divisors):
            return []
        return [g / d for g, d in zip(grads, divisors) if d is not None]

    def on_bucket(self, bucket: dist.GradBucket) -> torch.futures.Future[Any]:
        step = self.step
        buffer = bucket.buffer()
        buffer.div_(self.world_size * step.num_micro)
        collect = step.collect
        last = bucket.is_last()
        if last and step.mark_compute_end:
            step.compute_end_mark = self.mark()
        if collect and self.world_size > 1:
            step.local_parts.append(self.bucket_sqr(bucket, buffer))
            if last:
                return self._reduce_with_local_norms(bucket, buffer)
        future = all_reduce(buffer, self.process_group)

        def finish(fut: torch.futures.Future[Any]) -> torch.Tensor:
            averaged = fut.value()[0]
            if collect:
                step.global_parts.append(self.bucket_sqr(bucket, averaged))
            return averaged

        return future.then(finish)

    def _reduce_with_local_norms(self, bucket: dist.GradBucket,
                                 buffer: torch.Tensor) -> torch.futures.Future[Any]:
        """All-reduce the last bucket and the sum of the replicas' squared norms.

        A small bucket carries the sum in one extra element of its own all-reduce; a
        large (or low-precision) one is left alone and a one-element all-reduce follows.
        """
        step = self.step
        local_total = _total(step.local_parts)
        size = buffer.numel()
        group = self.process_group
        if buffer.dtype in EXACT_DTYPES and size <= self.piggyback_max_numel:
            extended = torch.cat([buffer, local_total.to(buffer.dtype).reshape(1)])
            future = all_reduce(extended, group)

            def finish(fut: torch.futures.Future[Any]) -> torch.Tensor:
                out = fut.value()[0]
                step.local_sqr_sum = out[size].double()
                averaged = out[:size]
                step.global_parts.append(self.bucket_sqr(bucket, averaged))
                return averaged

            return future.then(finish)
        norms = local_total.reshape(1)
        norms_work = dist.all_reduce(norms, group=group, async_op=True)
        future = all_reduce(buffer, group)

        def finish_mixed(fut: torch.futures.Future[Any]) -> torch.Tensor:
            norms_work.wait()
            step.local_sqr_sum = norms[0]
            averaged = fut.value()[0]
            step.global_parts.append(self.bucket_sqr(bucket, averaged))
            return averaged

        return future.then(finish_mixed)

    def fold(self, noise: GradientNoiseEstimator, loss_scale_sqr: torch.Tensor | float) -> None:
        """Give this step's two norms (if measured) to ``noise``; one update stands for the
        ``weight_steps`` optimizer steps until the next one."""
        step = self.step
        if not step.collect or not step.global_parts or step.local_bsz is None:
            return
        big = _total(step.global_parts) / loss_scale_sqr
        b, micro, world = step.local_bsz, step.num_micro, self.world_size
        if world > 1:
            if step.local_sqr_sum is None:
                return
            small = step.local_sqr_sum * world / loss_scale_sqr
            small_bsz, big_bsz = b * micro, world * b * micro
        else:
            if step.first_micro_sqr is None:
                return
            small = step.first_micro_sqr / loss_scale_sqr
            # the first micro-batch against the whole step (a probe's halves may differ
            # by one sample)
            small_bsz, big_bsz = b, step.step_batch or b * micro
        m0 = step.init_batch_size or big_bsz
        noise.update(small, small_bsz, big, big_bsz, scale=big_bsz / m0 * step.weight_steps)
        step.global_parts = []


class GradientPair:
    """The noise measurement of one replica without accumulation, at no extra compute.

    Two optimizer steps in a row see two independent batches of ``b`` samples: their
    gradients ``g1`` and ``g2`` give the mean squared norm at ``b`` samples,
    ``(|g1|^2 + |g2|^2) / 2``, and the squared norm of their average ``|(g1 + g2) / 2|^2``
    at ``2b``, the two norms :func:`~pollux.torch.gradient_noise.two_batch_estimates`
    solves. A chosen step's gradient is copied (unscaled, on its device) at its optimizer
    step and folded in with the next step's; nothing else is kept between steps. The
    update of the weights between the two steps makes ``g2`` see slightly different
    weights; at learning rates that train stably this drift is small next to the
    sampling noise of a batch (exact at learning rate 0, which the tests measure).
    """

    def __init__(self) -> None:
        self._kept: list[torch.Tensor] | None = None
        self._kept_sqr: torch.Tensor | None = None
        self._kept_batch = 0

    @property
    def holding(self) -> bool:
        return self._kept is not None

    def observe(self, grads: list[torch.Tensor], batch: int, keep: bool,
                loss_scale_sqr: torch.Tensor | float, noise: GradientNoiseEstimator,
                scale: float) -> None:
        """At an optimizer step of ``batch`` samples: fold the pair if a gradient was kept
        at the previous step (of the same size), then keep this one if ``keep``. ``scale``
        is the update's weight in the estimator (steps it stands for x batch / M0)."""
        inverse = (1.0 / loss_scale_sqr ** 0.5 if isinstance(loss_scale_sqr, float)
                   else loss_scale_sqr.rsqrt().float())
        if self._kept is not None and self._kept_sqr is not None:
            if batch == self._kept_batch and len(grads) == len(self._kept) and grads:
                current = _unscaled(grads, inverse)
                second = _sqr_sum(current)
                torch._foreach_add_(self._kept, current)
                small = (self._kept_sqr + second) / 2
                big = _sqr_sum(self._kept) / 4
                noise.update(small, batch, big, 2 * batch, scale=scale)
            self._kept = self._kept_sqr = None
        if keep and grads:
            self._kept = _unscaled(grads, inverse)
            self._kept_sqr = _sqr_sum(self._kept)
            self._kept_batch = batch


def _unscaled(grads: list[torch.Tensor], inverse: torch.Tensor | float) -> list[torch.Tensor]:
    """Copies of ``grads`` times ``inverse`` (new tensors, never the gradients)."""
    if isinstance(inverse, float) and inverse == 1.0:
        return [g.detach().clone() for g in grads]
    return list(torch._foreach_mul([g.detach() for g in grads], inverse))


def _sqr_sum(tensors: list[torch.Tensor]) -> torch.Tensor:
    norms = torch._foreach_norm(tensors)
    return torch.stack([n.double() for n in norms]).square().sum()


def comm_hook(state, bucket):
    # No annotations on purpose: DDP compares them with the real classes, and
    # ``from __future__ import annotations`` would turn them into strings.
    return state.on_bucket(bucket)

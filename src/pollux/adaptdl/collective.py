"""``adaptdl.collective``: reductions and broadcasts of picklable Python objects.

Every replica calls these functions in the same order (they are collectives over the
job's control group, made by ``init_process_group``). Meant for small objects (metrics,
decisions, a port number); use ``torch.distributed`` for tensors.

>>> from pollux.adaptdl import collective
>>> collective.allreduce(3)  # 3 on each of 2 replicas  # doctest: +SKIP
6
>>> collective.allreduce({"best": 0.9}, lambda a, b: {"best": max(a["best"], b["best"])})  # doctest: +SKIP
{'best': 0.9}
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch.distributed as dist

from pollux.adaptdl.default_job import DEFAULT_JOB

ReduceFn = Callable[[Any, Any], Any]


def default_reduce_fn(a: Any, b: Any) -> Any:
    """``a + b`` (AdaptDL's default: numbers add up, lists concatenate)."""
    return a + b


def _gather(value: Any, what: str) -> list[Any]:
    job = DEFAULT_JOB.require(f"adaptdl.collective.{what}")
    if job.num_replicas == 1 or not dist.is_initialized():
        return [value]
    gathered: list[Any] = [None] * job.num_replicas
    dist.all_gather_object(gathered, value, group=job.control_group)
    return gathered


def allreduce(value: Any, reduce_fn: ReduceFn = default_reduce_fn) -> Any:
    """``value`` of every replica folded with ``reduce_fn`` in rank order; every replica
    gets the same result."""
    return functools.reduce(reduce_fn, _gather(value, "allreduce"))


def allreduce_async(value: Any, reduce_fn: ReduceFn = default_reduce_fn) -> Future[Any]:
    """:func:`allreduce` with AdaptDL's future-returning shape (``.result()``). The
    reduction runs now, in call order with every other collective (a background one
    could interleave with the agent's own collectives); the future is already done."""
    future: Future[Any] = Future()
    future.set_result(allreduce(value, reduce_fn))
    return future


def broadcast(value: Any) -> Any:
    """Rank 0's ``value`` on every replica (the others' ``value`` is ignored)."""
    job = DEFAULT_JOB.require("adaptdl.collective.broadcast")
    if job.num_replicas == 1 or not dist.is_initialized():
        return value
    box = [value if job.rank == 0 else None]
    dist.broadcast_object_list(box, src=0, group=job.control_group)
    return box[0]


def allgather(value: Any) -> list[Any]:
    """Every replica's ``value``, in rank order (a Pollux addition)."""
    return _gather(value, "allgather")

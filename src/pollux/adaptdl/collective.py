"""``adaptdl.collective``: reductions and broadcasts of picklable Python objects.

Every replica calls these functions in the same order (they are collectives over the
job's control group, made by ``init_process_group``, or by :func:`initialize` for a
script that needs only these collectives). Meant for small objects (metrics,
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

from pollux.adaptdl import process_group
from pollux.adaptdl.default_job import DEFAULT_JOB

ReduceFn = Callable[[Any, Any], Any]


def default_reduce_fn(a: Any, b: Any) -> Any:
    """``a + b`` (AdaptDL's default: numbers add up, lists concatenate)."""
    return a + b


def initialize(master_addr: str | None = None, master_port: int | None = None,
               replica_rank: int | None = None, num_replicas: int | None = None) -> None:
    """Join the job so that these collectives work, without ``init_process_group``
    (AdaptDL's ``initialize``); blocks until every replica has called it.

    Each argument left out is read from the launch environment (``adaptdl.env``:
    Pollux's, torchrun's or AdaptDL's variables); any given one names the launch
    explicitly and wins over them. It makes the process's default job on gloo, as
    ``adaptdl.torch.init_process_group("gloo")`` would, so call one of the two, once
    (a second call raises ``RuntimeError``, as in AdaptDL).
    """
    given = (master_addr, master_port, replica_rank, num_replicas)
    if all(value is None for value in given):
        process_group.join("gloo", None, None)
        return
    from pollux.adaptdl import env

    rank = env.replica_rank() if replica_rank is None else int(replica_rank)
    replicas = env.num_replicas() if num_replicas is None else int(num_replicas)
    port = env.master_port() if master_port is None else int(master_port)
    if replicas > 1 and port == 0:
        raise ValueError("invalid master_port=0: several replicas need the rank-0 "
                         "replica's port (give master_port= or set ADAPTDL_MASTER_PORT)")
    process_group.join("gloo", process_group.explicit_environ(
        master_addr or env.master_addr(), port, rank, replicas), None)


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

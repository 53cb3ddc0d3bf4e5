"""``adaptdl.torch`` over the Pollux agent: AdaptDL's training API, unchanged.

>>> import pollux.adaptdl.torch as adl  # was: import adaptdl.torch as adl
>>> adl.init_process_group("gloo")  # doctest: +SKIP
>>> model = adl.AdaptiveDataParallel(net, optimizer, scheduler)  # doctest: +SKIP
>>> for epoch in adl.remaining_epochs_until(30):  # doctest: +SKIP
...     for x, y in loader: ...

:func:`init_process_group` makes the process's default job
(:mod:`pollux.adaptdl.default_job`) that every other name here uses. It works under
the Pollux scheduler, under ``torchrun`` and as a single process; a job launched by
AdaptDL's own scheduler is not supported (use ``pollux submit``).
"""

from __future__ import annotations

import atexit
import os

from pollux.adaptdl.default_job import DEFAULT_JOB
from pollux.adaptdl.torch.accumulator import Accumulator
from pollux.adaptdl.torch.data import (
    AdaptiveDataLoader,
    AdaptiveDataLoaderMixin,
    current_dataloader,
)
from pollux.adaptdl.torch.epoch import current_epoch, finished_epochs, remaining_epochs_until
from pollux.adaptdl.torch.parallel import AdaptiveDataParallel
from pollux.adaptdl.torch.scaling_rules import (
    AdamScale,
    AdaScale,
    LEGWScale,
    LinearScale,
    ScalingRuleBase,
    SqrtScale,
)
from pollux.jobenv import CHECKPOINT_DIR
from pollux.torch import distributed
from pollux.torch.job import AgentConfig, JobContext

ADAPTDL_CHECKPOINT_PATH = "ADAPTDL_CHECKPOINT_PATH"
"""AdaptDL's checkpoint variable, honoured when ``POLLUX_CHECKPOINT_DIR`` is unset."""


def _environ(init_method: str | None, world_size: int | None,
             rank: int | None) -> dict[str, str] | None:
    """torchrun's variables from AdaptDL's explicit ``init_method="tcp://host:port"``."""
    if init_method is None:
        return None
    if not init_method.startswith("tcp://") or world_size is None or rank is None:
        raise ValueError(f"invalid init_method={init_method!r}: give 'tcp://host:port' "
                         "with world_size= and rank= (or none of them)")
    host, _, port = init_method[len("tcp://"):].partition("?")[0].rpartition(":")
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLLUX_")
           or k == CHECKPOINT_DIR}
    env.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
               MASTER_ADDR=host, MASTER_PORT=port)
    return env


def init_process_group(backend: str | None = None, init_method: str | None = None,
                       world_size: int | None = None, rank: int | None = None, *,
                       config: AgentConfig | None = None) -> JobContext:
    """Join the job and make it this process's default job; returns it (AdaptDL returns
    nothing; the native API takes it explicitly).

    ``backend``: ``"gloo"`` or ``"nccl"`` (None: NCCL with CUDA, else gloo). Without
    ``init_method``, the launcher's environment says where the job is (Pollux, torchrun,
    or a single process); ``init_method="tcp://host:port"`` with ``world_size`` and
    ``rank`` names it explicitly. Checkpoints go to ``POLLUX_CHECKPOINT_DIR``, else
    ``ADAPTDL_CHECKPOINT_PATH``, else ``./pollux-checkpoints/<script>``. The job is
    closed (checkpoint writes flushed, group left) when the process exits.
    """
    if DEFAULT_JOB.job is not None:
        raise RuntimeError("init_process_group was already called in this process")
    checkpoint_dir = None
    if CHECKPOINT_DIR not in os.environ and os.environ.get(ADAPTDL_CHECKPOINT_PATH):
        checkpoint_dir = os.environ[ADAPTDL_CHECKPOINT_PATH]
    job = distributed.init_process_group(backend, checkpoint_dir=checkpoint_dir,
                                         config=config,
                                         environ=_environ(init_method, world_size, rank))
    DEFAULT_JOB.set(job)
    atexit.register(_close_at_exit, job)
    return job


def _close_at_exit(job: JobContext) -> None:
    if DEFAULT_JOB.job is job:
        destroy_process_group()


def destroy_process_group() -> None:
    """Close the default job (flush, leave the group) and forget it: a later
    :func:`init_process_group` starts a new one (tests do this)."""
    job = DEFAULT_JOB.job
    DEFAULT_JOB.clear()
    if job is not None:
        job.close()


def default_job() -> JobContext:
    """The job made by :func:`init_process_group`, for the native API's ``job=``."""
    return DEFAULT_JOB.require("default_job")


__all__ = [
    "Accumulator",
    "AdaScale",
    "AdamScale",
    "AdaptiveDataLoader",
    "AdaptiveDataLoaderMixin",
    "AdaptiveDataParallel",
    "LEGWScale",
    "LinearScale",
    "ScalingRuleBase",
    "SqrtScale",
    "current_dataloader",
    "current_epoch",
    "default_job",
    "destroy_process_group",
    "finished_epochs",
    "init_process_group",
    "remaining_epochs_until",
]


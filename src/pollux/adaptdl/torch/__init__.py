"""``adaptdl.torch`` over the Pollux agent: AdaptDL's training API, unchanged.

>>> import pollux.adaptdl.torch as adl  # was: import adaptdl.torch as adl
>>> adl.init_process_group("gloo")  # doctest: +SKIP
>>> model = adl.AdaptiveDataParallel(net, optimizer, scheduler)  # doctest: +SKIP
>>> for epoch in adl.remaining_epochs_until(30):  # doctest: +SKIP
...     for x, y in loader: ...

:func:`init_process_group` makes the process's default job
(:mod:`pollux.adaptdl.default_job`) that every other name here uses. It works under
the Pollux scheduler, under ``torchrun``, with AdaptDL's standalone variables
(``ADAPTDL_REPLICA_RANK``, ``ADAPTDL_NUM_REPLICAS``, ``ADAPTDL_MASTER_ADDR``,
``ADAPTDL_MASTER_PORT``, ...) and as a single process; a job launched by AdaptDL's own
Kubernetes scheduler is not supported (use ``pollux submit``).
"""

from __future__ import annotations

from pollux.adaptdl.default_job import DEFAULT_JOB
from pollux.adaptdl.process_group import destroy_process_group, init_process_group
from pollux.adaptdl.torch.accumulator import Accumulator
from pollux.adaptdl.torch.data import (
    AdaptiveDataLoader,
    AdaptiveDataLoaderMixin,
    ElasticSampler,
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
from pollux.torch.job import JobContext


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
    "ElasticSampler",
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


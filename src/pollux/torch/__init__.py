"""The Pollux agent for PyTorch (extra ``[torch]``).

A few lines in an ordinary training script make the job measure itself, train at the
goodput-optimal batch size and learning rate, report hints to the scheduler, and
survive being resized or killed without losing or repeating a sample::

    job = pollux.torch.init_process_group()
    model = AdaptiveDataParallel(net, optimizer, scheduler, job=job)
    loader = AdaptiveDataLoader(dataset, batch_size=64, shuffle=True, job=job)
    loader.autoscale_batch_size(1024, local_bsz_bounds=(16, 256))
    for epoch in remaining_epochs_until(30, job):
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()

Works under the Pollux scheduler, under ``torchrun`` and as a single process.
"""

from __future__ import annotations

from pollux.torch.accumulator import Accumulator
from pollux.torch.batch_size import BatchConfig, BatchLimits
from pollux.torch.checkpoint import CheckpointManager
from pollux.torch.data_loader import AdaptiveDataLoader, BatchInfo
from pollux.torch.data_parallel import AdaptiveDataParallel
from pollux.torch.distributed import (
    LaunchEnvironment,
    LaunchSource,
    init_process_group,
    read_launch_environment,
    standalone_checkpoint_dir,
)
from pollux.torch.elastic_sampler import ElasticSampler, StepPlan, epoch_order, plan_step
from pollux.torch.epochs import (
    current_dataloader,
    current_epoch,
    epoch_scope,
    remaining_epochs_until,
)
from pollux.torch.gradient_noise import GradientNoiseEstimator
from pollux.torch.job import AgentConfig, JobContext
from pollux.torch.scaling_rules import (
    AdaScale,
    LinearScale,
    ScalingRule,
    SqrtScale,
    WarmupScale,
    default_scaling_rule,
)

__all__ = [
    "Accumulator",
    "AdaScale",
    "AdaptiveDataLoader",
    "AdaptiveDataParallel",
    "AgentConfig",
    "BatchConfig",
    "BatchInfo",
    "BatchLimits",
    "CheckpointManager",
    "ElasticSampler",
    "GradientNoiseEstimator",
    "JobContext",
    "LaunchEnvironment",
    "LaunchSource",
    "LinearScale",
    "ScalingRule",
    "SqrtScale",
    "StepPlan",
    "WarmupScale",
    "current_dataloader",
    "current_epoch",
    "default_scaling_rule",
    "epoch_order",
    "epoch_scope",
    "init_process_group",
    "plan_step",
    "read_launch_environment",
    "remaining_epochs_until",
    "standalone_checkpoint_dir",
]

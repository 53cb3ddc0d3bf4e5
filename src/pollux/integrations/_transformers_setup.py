"""Set-up helpers of :mod:`pollux.integrations.transformers`: the refused arguments,
accelerate's view of the replicas, the RNG states the Trainer's seeding would reset,
and the epochs' passes the Trainer iterates."""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import torch

from pollux.errors import ConfigError
from pollux.torch.data_loader import AdaptiveDataLoader
from pollux.torch.job import JobContext


def check_arguments(args: Any) -> None:
    if args.gradient_accumulation_steps != 1:
        raise ConfigError("gradient_accumulation_steps", args.gradient_accumulation_steps,
                          "use 1: the agent chooses the batch (raise max_batch_size)")
    if args.auto_find_batch_size:
        raise ConfigError("auto_find_batch_size", True,
                          "use False: the agent chooses the batch within local_bsz_bounds")
    for name in ("deepspeed", "fsdp"):
        if getattr(args, name, None):
            raise ConfigError(name, getattr(args, name),
                              "AdaptiveTrainer trains with data parallelism: remove it")


def align_accelerate(args: Any, job: JobContext) -> None:
    """Make accelerate (and so ``args.world_size``, ``args.process_index``) see the
    replicas Pollux launched: it reads torchrun's variables, which a ``pollux submit``
    launch does not set, then adopts the process group Pollux created."""
    if job.num_replicas == 1 or args.world_size == job.num_replicas:
        return
    from accelerate.state import AcceleratorState

    launch = job.launch
    os.environ.update({
        "RANK": str(job.rank), "WORLD_SIZE": str(job.num_replicas),
        "LOCAL_RANK": str(launch.local_rank),
        "LOCAL_WORLD_SIZE": str(max(job.num_replicas // max(job.num_nodes, 1), 1)),
        "MASTER_ADDR": str(launch.master_addr), "MASTER_PORT": str(launch.master_port)})
    AcceleratorState._reset_state(reset_partial_state=True)
    args.__dict__.pop("_setup_devices", None)  # the cached device set-up: run it again
    _ = args.device
    if args.world_size != job.num_replicas:
        raise ConfigError("TrainingArguments world_size", args.world_size,
                          f"accelerate sees another world than Pollux's {job.num_replicas} "
                          "replicas; create the Trainer before any accelerate state")


def is_hf_dataset(dataset: Any) -> bool:
    try:
        import datasets
    except ImportError:
        return False
    return isinstance(dataset, datasets.Dataset)


def rng_states() -> dict[str, Any]:
    states: dict[str, Any] = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                              "random": random.getstate()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    np.random.set_state(states["numpy"])
    random.setstate(states["random"])
    if "cuda" in states:
        torch.cuda.set_rng_state_all(states["cuda"])


class EpochPasses:
    """What the Trainer iterates: one full pass of the agent's loader per Trainer epoch.

    Its length is the most micro-batches a pass can hand out, plus one, so that the
    Trainer's loop always asks once more at the end of a pass; the pass then ends the
    job's epoch and the Trainer's (``should_epoch_stop``).
    """

    def __init__(self, trainer: Any, loader: AdaptiveDataLoader) -> None:
        self.trainer = trainer
        self.loader = loader
        self.dataset = loader.dataset
        self._pass: Any = None

    def __len__(self) -> int:
        job = self.loader.job
        smallest = job.num_replicas * self.loader.limits.local_bsz_bounds[0]
        return len(self.dataset) // smallest + 3

    def __iter__(self) -> Any:
        self._pass = self._one_pass()
        return self._pass

    def _one_pass(self) -> Any:
        job = self.loader.job
        epoch = job.epoch
        yield from self.loader
        if job.epoch == epoch:
            job.finish_epoch()
        self.trainer.control.should_epoch_stop = True

    def finish_pass(self) -> None:
        """Run the pass in progress to its end (its last step has trained)."""
        if self._pass is not None:
            next(self._pass, None)
            self._pass = None

"""The agent's per-process context: what the model wrapper, the loader and the epoch
iterator share (launch environment, checkpoints, profile, hints, stop requests).

Created by :func:`pollux.torch.init_process_group` and passed explicitly (``job=``);
there is no module-level state.
"""

from __future__ import annotations

import logging
import random
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NoReturn, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from pollux.errors import ConfigError
from pollux.jobenv import RESCALE_EXIT_CODE
from pollux.models.hints import check_gpu_type
from pollux.torch.batch_decider import DecisionRule
from pollux.torch.checkpoint import CheckpointManager
from pollux.torch.hints_reporter import HintsReporter
from pollux.torch.launch import LaunchEnvironment
from pollux.torch.metrics import MetricsWriter
from pollux.torch.profiler import ProfilesByType, StepProfiler, device_gpu_type
from pollux.torch.roles import DrivenModel, IteratedLoader

logger = logging.getLogger(__name__)

MODEL_KEY = "model"
"""The key of a job's model wrapped without ``name=``."""

Part = TypeVar("Part")


@dataclass(frozen=True)
class AgentConfig:
    """Tuning knobs of the agent (defaults suit most jobs).

    >>> config = AgentConfig(checkpoint_interval_s=60, tensorboard_dir="runs/pollux")
    >>> config.noise_interval_steps
    4
    >>> job = init_process_group(config=config)  # doctest: +SKIP
    """

    control_interval_s: float = 1.0
    """Target time between agreement points (stop requests, batch-size changes)."""
    max_control_interval_steps: int = 100
    """Never more optimizer steps than this between agreement points."""
    checkpoint_interval_s: float = 180.0
    """Periodic checkpoint every this many seconds (a crash loses at most this much)."""
    checkpoints_kept: int = 2
    """Complete checkpoints kept on disk."""
    hints_interval_s: float = 30.0
    """How often the hints are sent to the scheduler."""
    hints_timeout_s: float = 5.0
    """Timeout of one hints POST."""
    min_goodput_gain: float = 0.05
    """Change the batch configuration only if predicted goodput improves by this much
    (the rule: :mod:`pollux.torch.batch_decider`)."""
    batch_change_confirmations: int = 3
    """Agreement points in a row that must propose a change (in the same direction)
    before the batch configuration changes."""
    batch_reversal_gain: float = 0.25
    """Predicted goodput gain needed to move the batch size back the other way after a
    change (hysteresis: noise cannot make the batch size go back and forth)."""
    noise_smoothing: float = 0.999
    """Per-step decay of the gradient-statistics averages (at the initial batch)."""
    min_noise_updates: int = 10
    """Gradient-statistics updates needed before they drive the batch size."""
    noise_interval_steps: int = 4
    """Measure the gradient statistics on every this many-th optimizer step (the averages
    decay by as many steps per update); 1 = every step. Measuring costs reductions over
    the gradients and the replicas' norms in the last all-reduce (``bench/agent.py``
    measures its share of a step); measuring every 4th step costs a quarter as much."""
    probe_interval_steps: int = 4
    """With one replica and no accumulation, a loader that adapts its batch size
    (``autoscale_batch_size``) keeps the gradient of every this many-th optimizer step
    and pairs it with the next step's to measure the gradient noise (two independent
    batches of the same size; :class:`~pollux.torch.gradient_norms.GradientPair`): a copy
    of the gradients and two norms per this many steps, no extra forward or backward
    pass, and every batch keeps its size."""
    profile_warmup_steps: int = 2
    """Optimizer steps not profiled after each (re)configuration (warm-up outliers)."""
    min_profiled_steps: int = 10
    """Optimizer steps of the current configuration (placement and batch) the throughput
    fit must include before the batch size may change from it: until then the fit only
    extrapolates to it (after a rescale, or a change of batch), and acting on that made
    batch sizes go back and forth."""
    refit_interval_s: float = 5.0
    """Minimum time between two background refits of the throughput model."""
    process_group_timeout_s: float = 600.0
    """Timeout of collectives (a dead peer fails the job after at most this long)."""
    tensorboard_dir: str | None = None
    """Write TensorBoard scalars here (rank 0, when tensorboard is installed)."""
    gpu_type: str | None = None
    """The name of this device's type, under which the job's step-time profile is kept and
    reported (a job keeps one profile per type it runs on). Under the scheduler on a typed
    cluster the node's type (``POLLUX_GPU_TYPE``) wins; None: the CUDA device's name
    (``torch.cuda.get_device_name``), or ``"cpu"``."""
    log_level: str | None = "INFO"
    """Level of the agent's own messages (batch-size changes, checkpoints) printed on
    rank 0's stderr when the script has not configured logging; None: leave logging to
    the script."""

    def __post_init__(self) -> None:
        for name in ("control_interval_s", "checkpoint_interval_s", "hints_interval_s",
                     "hints_timeout_s", "process_group_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(name, getattr(self, name), "must be > 0")
        if self.noise_interval_steps < 1:
            raise ConfigError("noise_interval_steps", self.noise_interval_steps,
                              "must be >= 1 (1: every optimizer step)")
        if self.probe_interval_steps < 1:
            raise ConfigError("probe_interval_steps", self.probe_interval_steps,
                              "must be >= 1 (1: every optimizer step)")
        if self.min_profiled_steps < 0:
            raise ConfigError("min_profiled_steps", self.min_profiled_steps,
                              "must be >= 0 (0: decide on extrapolated fits too)")
        if self.max_control_interval_steps < 1:
            raise ConfigError("max_control_interval_steps", self.max_control_interval_steps,
                              "must be >= 1")
        self.decision_rule()  # checks min_goodput_gain and the batch-change thresholds
        if self.gpu_type is not None:
            check_gpu_type("gpu_type", self.gpu_type)
        if self.log_level is not None and not isinstance(
                logging.getLevelName(self.log_level.upper()), int):
            raise ConfigError("log_level", self.log_level,
                              "use DEBUG, INFO, WARNING or ERROR (or None)")


    def decision_rule(self) -> DecisionRule:
        """When the batch configuration may change (:class:`BatchDecider`'s rule)."""
        return DecisionRule(min_gain=self.min_goodput_gain,
                            confirmations=self.batch_change_confirmations,
                            reversal_gain=self.batch_reversal_gain)


def _show_agent_logs(level: str) -> logging.Handler | None:
    """Print the agent's log records on stderr unless the script configured logging
    (a handler on the root or on ``pollux``); returns the handler added."""
    package = logging.getLogger("pollux")
    if logging.getLogger().handlers or package.handlers:
        return None
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[pollux] %(message)s"))
    package.addHandler(handler)
    package.setLevel(level.upper())
    return handler


class RngStates:
    """Every rank's RNG states (torch, CUDA, numpy, random), gathered into one checkpoint.

    After a restart with more replicas, a rank with no saved state gets a fresh seed
    derived from its rank and the restart count.
    """

    def __init__(self, rank: int, num_replicas: int, group: Any, num_restarts: int) -> None:
        self.rank = rank
        self.num_replicas = num_replicas
        self.group = group
        self.num_restarts = num_restarts

    def _local(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "torch": torch.get_rng_state(),
            "numpy": np.random.get_state(),
            "random": random.getstate(),
        }
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state()
        return state

    def state_dict(self) -> list[dict[str, Any]]:
        local = self._local()
        if self.num_replicas == 1:
            return [local]
        gathered: list[Any] = [None] * self.num_replicas
        dist.all_gather_object(gathered, local, group=self.group)
        return gathered

    def load_state_dict(self, states: list[dict[str, Any]]) -> None:
        if self.rank < len(states):
            state = states[self.rank]
            torch.set_rng_state(state["torch"])
            np.random.set_state(state["numpy"])
            random.setstate(state["random"])
            if "cuda" in state and torch.cuda.is_available():
                torch.cuda.set_rng_state(state["cuda"])
            return
        seed = (self.num_restarts + 1) * 100_003 + self.rank
        torch.manual_seed(seed)
        np.random.seed(seed % 2**32)
        random.seed(seed)


class _JobState:
    """The checkpointed epoch counter."""

    def __init__(self) -> None:
        self.epoch = 0

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])


class JobContext:
    """What one training process knows about its job; see :func:`init_process_group`.

    >>> job = init_process_group()  # doctest: +SKIP
    >>> job.rank, job.num_replicas, job.device, job.epoch  # doctest: +SKIP
    (0, 1, device(type='cpu'), 0)
    >>> job.checkpoint.register("my/state", my_object)  # restored here after a restart  # doctest: +SKIP
    """

    def __init__(self, launch: LaunchEnvironment, *, device: torch.device, backend: str,
                 control_group: Any, config: AgentConfig,
                 install_signal_handler: bool = True, owns_process_group: bool = False) -> None:
        self.launch = launch
        self.device = device
        self.backend = backend
        self.control_group = control_group
        self.owns_process_group = owns_process_group
        """Whether :meth:`close` destroys the process group (init_process_group created it)."""
        self.config = config
        self._log_handler = (_show_agent_logs(config.log_level)
                             if launch.rank == 0 and config.log_level is not None else None)
        self.rank = launch.rank
        self.num_replicas = launch.num_replicas
        self.num_nodes = launch.num_nodes
        self.stop_requested = threading.Event()
        self.model: DrivenModel | None = None
        """The model that drives the batch size (the first one wrapped)."""
        self.models: dict[str, DrivenModel] = {}
        """Every wrapped model by name (several for a GAN: see ``name=``)."""
        self._loader_names: list[str] = []
        self.checkpoint = CheckpointManager(launch.checkpoint_dir, rank=self.rank,
                                            group=control_group,
                                            keep=config.checkpoints_kept)
        self.profiler = StepProfiler(device, refit_interval_s=config.refit_interval_s)
        """The step-time profile of this launch's GPU type."""
        self.gpu_type = device_gpu_type(device, launch.gpu_type, config.gpu_type)
        """The GPU type this replica runs on (see :func:`device_gpu_type`)."""
        self.profiles = ProfilesByType(self.gpu_type, self.profiler)
        """Every type's profile (this type's is :attr:`profiler`), checkpointed."""
        self.metrics = MetricsWriter(config.tensorboard_dir if self.rank == 0 else None)
        self.hints: HintsReporter | None = None
        if self.rank == 0 and launch.hints_target:
            self.hints = HintsReporter(launch.hints_target, token=launch.hints_token,
                                       interval_s=config.hints_interval_s,
                                       timeout_s=config.hints_timeout_s)
        self._state = _JobState()
        self.checkpoint.register("pollux/job", self._state)
        self.checkpoint.register("pollux/rng", RngStates(self.rank, self.num_replicas,
                                                         control_group, launch.num_restarts))
        self.checkpoint.register("pollux/profile", self.profiles)
        self._parts: dict[type, Any] = {}
        self.current_dataloader: IteratedLoader | None = None
        """The data loader being iterated now (None between epochs)."""
        self._previous_handlers: dict[int, Any] = {}
        if install_signal_handler:
            self._install_signal_handlers()
        if self.rank == 0:
            self._announce_checkpoints()

    def _announce_checkpoints(self) -> None:
        directory = self.launch.checkpoint_dir
        where = (f"rank 0 of {self.num_replicas} ({self.launch.source.value}, "
                 f"{self.backend} on {self.device})")
        if directory is None:
            logger.warning("%s: checkpointing is off, so a stop or a crash loses the "
                           "progress (set POLLUX_CHECKPOINT_DIR or checkpoint_dir=)", where)
        elif self.checkpoint.is_restored():
            logger.info("%s: resuming from the checkpoint in %s (delete it to start afresh)",
                        where, directory)
        else:
            logger.info("%s: checkpoints in %s", where, directory)

    # -- epochs ---------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The current epoch (restored from the checkpoint on restart)."""
        return self._state.epoch

    def finish_epoch(self) -> None:
        """Advance the epoch counter (called by :func:`remaining_epochs_until`)."""
        self._state.epoch += 1

    # -- wiring ---------------------------------------------------------------------------

    def check_model_name(self, name: str | None) -> str:
        """The key of a model about to be wrapped under ``name`` (None: the only one)."""
        key = MODEL_KEY if name is None else name
        if key in self.models or (name is None and self.models):
            raise ConfigError("AdaptiveDataParallel name", name,
                              "give each model of a job its own name= (e.g. a GAN's "
                              "name='generator' and name='discriminator')")
        return key

    def part(self, kind: type[Part], make: Callable[[], Part]) -> Part:
        """The job's one object of ``kind``, made by ``make`` on first use: per-job state
        of a part built on the context (every accumulator's checkpointed values), kept here
        without the context importing that part."""
        if kind not in self._parts:
            self._parts[kind] = make()
        found = self._parts[kind]
        assert isinstance(found, kind)
        return found

    def attach_model(self, model: DrivenModel, name: str | None = None) -> None:
        """Track ``model``; the first one drives the batch size, later ones (each with its
        own ``name``) follow its micro-steps (:mod:`pollux.torch.model_followers`)."""
        self.models[self.check_model_name(name)] = model
        if self.model is None:
            self.model = model

    def followers(self) -> list[DrivenModel]:
        """The models after the first (they follow its micro-steps)."""
        return [m for m in self.models.values() if m is not self.model]

    def new_loader_name(self, name: str | None) -> str:
        chosen = name if name is not None else f"loader{len(self._loader_names)}"
        if chosen in self._loader_names:
            raise ConfigError("AdaptiveDataLoader name", chosen, "give each loader a unique name")
        self._loader_names.append(chosen)
        return chosen

    # -- stopping -------------------------------------------------------------------------

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            logger.warning("not in the main thread: SIGTERM and SIGINT will not trigger a "
                           "checkpoint")
            return

        def on_signal(signum: int, frame: Any) -> None:
            if signum == signal.SIGINT:
                if self.stop_requested.is_set():  # a second Ctrl-C: quit at once
                    raise KeyboardInterrupt
                logger.warning("interrupted: checkpointing at the next step, then exiting "
                               "(Ctrl-C again to quit without a checkpoint)")
            self.stop_requested.set()

        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous_handlers[signum] = signal.signal(signum, on_signal)

    def request_stop(self) -> None:
        """Ask the job to checkpoint and exit at the next agreement point (as SIGTERM does)."""
        self.stop_requested.set()

    def exit_for_rescale(self) -> NoReturn:
        """Leave after the stop checkpoint: exit with ``RESCALE_EXIT_CODE``."""
        if self.checkpoint.enabled:
            logger.info("checkpointed in %s on request; exiting with code %d (run again to "
                        "resume)", self.launch.checkpoint_dir, RESCALE_EXIT_CODE)
        else:
            logger.warning("stopped on request without a checkpoint (checkpointing is off); "
                           "exiting with code %d", RESCALE_EXIT_CODE)
        self.close()
        raise SystemExit(RESCALE_EXIT_CODE)

    def close(self, *, leave_timeout_s: float = 30.0) -> None:
        """Flush background work (checkpoint writes, hints, metrics) and leave the group.

        Call on every rank at the end of training: the ranks wait for each other (at most
        ``leave_timeout_s``) before the process group is destroyed, so that no rank tears
        its connections down while a peer still uses them.
        """
        self.checkpoint.wait()
        if self.hints is not None:
            self.hints.close()
        self.metrics.close()
        for signum, previous in self._previous_handlers.items():
            signal.signal(signum, previous)
        self._previous_handlers = {}
        if self._log_handler is not None:
            logging.getLogger("pollux").removeHandler(self._log_handler)
            self._log_handler = None
        if self.owns_process_group and dist.is_initialized():
            if self.num_replicas > 1:
                try:
                    dist.monitored_barrier(group=self.control_group,
                                           timeout=timedelta(seconds=leave_timeout_s))
                except RuntimeError as exc:  # a peer is gone: leave anyway
                    logger.warning("leaving without every peer: %s", exc)
            dist.destroy_process_group()
            self.owns_process_group = False

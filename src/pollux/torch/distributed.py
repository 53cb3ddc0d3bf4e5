"""The launch environment of a training process and ``init_process_group``.

Three ways to be launched, tried in this order:

* by the Pollux scheduler: ``POLLUX_*`` variables (:mod:`pollux.jobenv`);
* by ``torchrun``: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ...;
* by nothing: a single process (world size 1, an in-process store).

``init_process_group`` picks NCCL on GPUs and gloo on CPU, creates a gloo group for the
agent's small host-side agreements, and returns the :class:`~pollux.torch.job.JobContext`
that the other pieces of the agent share.
"""

from __future__ import annotations

import enum
import ipaddress
import logging
import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from pollux import jobenv
from pollux.errors import ConfigError

if TYPE_CHECKING:
    from pollux.torch.job import AgentConfig, JobContext

logger = logging.getLogger(__name__)


class LaunchSource(enum.Enum):
    """Who started this process.

    >>> read_launch_environment({"RANK": "1", "WORLD_SIZE": "2", "MASTER_PORT": "29500"}).source
    <LaunchSource.TORCHRUN: 'torchrun'>
    """

    POLLUX = "pollux"
    TORCHRUN = "torchrun"
    SINGLE = "single"


@dataclass(frozen=True)
class LaunchEnvironment(jobenv.JobEnvironment):
    """Where this replica sits in its job, and who launched it: the launch contract
    (:class:`pollux.jobenv.JobEnvironment`) plus its source.

    >>> env = read_launch_environment({})
    >>> env.source.value, env.rank, env.num_replicas
    ('single', 0, 1)
    """

    source: LaunchSource = LaunchSource.POLLUX

    def __post_init__(self) -> None:
        if self.num_replicas < 1:
            raise ConfigError("num_replicas", self.num_replicas, "must be >= 1")
        if not 0 <= self.rank < self.num_replicas:
            raise ConfigError("rank", self.rank, f"must lie in [0, {self.num_replicas})")
        if not 1 <= self.num_nodes <= self.num_replicas:
            raise ConfigError("num_nodes", self.num_nodes,
                              f"must lie in [1, num_replicas={self.num_replicas}]")
        if self.num_replicas > 1 and (self.master_addr is None or self.master_port is None):
            raise ConfigError("master_addr/master_port", (self.master_addr, self.master_port),
                              "several replicas need a rendezvous address and port")


def _integer(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        if default is None:
            raise ConfigError(name, None, "the launcher must set this variable")
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ConfigError(name, raw, "must be an integer") from exc


def read_launch_environment(environ: Mapping[str, str] | None = None) -> LaunchEnvironment:
    """Read the launch environment (Pollux, then torchrun, else a single process).

    >>> read_launch_environment({"RANK": "1", "WORLD_SIZE": "2", "MASTER_PORT": "29500"}).rank
    1
    """
    env = os.environ if environ is None else environ
    pollux_env = LaunchEnvironment.from_env(env)
    if pollux_env is not None:
        return pollux_env
    # Outside the scheduler, the Pollux variables that make sense alone are still honoured.
    checkpoint_dir = env.get(jobenv.CHECKPOINT_DIR) or None
    hints_target = env.get(jobenv.HINTS_TARGET) or None
    hints_token = env.get(jobenv.HINTS_TOKEN) or None
    gpu_type = env.get(jobenv.GPU_TYPE) or None
    if "RANK" in env and "WORLD_SIZE" in env:
        world = _integer(env, "WORLD_SIZE")
        local_world = _integer(env, "LOCAL_WORLD_SIZE", world)
        return LaunchEnvironment(
            source=LaunchSource.TORCHRUN,
            rank=_integer(env, "RANK"),
            num_replicas=world,
            local_rank=_integer(env, "LOCAL_RANK", 0),
            node_rank=_integer(env, "GROUP_RANK", 0),
            num_nodes=max(1, -(-world // max(local_world, 1))),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=_integer(env, "MASTER_PORT"),
            job_id=env.get("TORCHELASTIC_RUN_ID", "torchrun"),
            checkpoint_dir=checkpoint_dir,
            hints_target=hints_target,
            hints_token=hints_token,
            num_restarts=_integer(env, "TORCHELASTIC_RESTART_COUNT", 0),
            gpu_type=gpu_type,
        )
    return LaunchEnvironment(source=LaunchSource.SINGLE, job_id="local", rank=0,
                             num_replicas=1, checkpoint_dir=checkpoint_dir,
                             hints_target=hints_target, hints_token=hints_token,
                             gpu_type=gpu_type)


def default_backend() -> str:
    """``nccl`` when CUDA is available, else ``gloo``."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def default_device(local_rank: int) -> torch.device:
    """The GPU of this replica (``local_rank`` modulo visible GPUs), else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def loopback_listener(host: str, port: int) -> socket.socket | None:
    """A socket listening on ``host:port`` when ``host`` is a loopback address (a job of
    the local backend), else None. The rendezvous store of rank 0 then accepts only local
    connections; TCPStore on its own listens on every interface."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if not address.is_loopback:
        return None
    listener = socket.socket(socket.AF_INET6 if address.version == 6 else socket.AF_INET)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(512)
    except OSError:
        listener.close()
        raise
    return listener


def rendezvous_store(host: str, port: int, rank: int, num_replicas: int,
                     timeout: timedelta) -> dist.TCPStore:
    """The job's TCPStore: rank 0 serves it (on loopback only when ``host`` is a loopback
    address), the others connect to it."""
    listener = loopback_listener(host, port) if rank == 0 else None
    return dist.TCPStore(host, port, num_replicas, is_master=rank == 0, timeout=timeout,
                         master_listen_fd=None if listener is None else listener.detach())


def init_process_group(
    backend: str | None = None,
    *,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    config: AgentConfig | None = None,
    environ: Mapping[str, str] | None = None,
    install_signal_handler: bool = True,
) -> JobContext:
    """Join the job's process group and return the agent's :class:`JobContext`.

    ``checkpoint_dir`` overrides the launcher's (``POLLUX_CHECKPOINT_DIR``); without
    either, a job run outside the scheduler checkpoints in
    ``./pollux-checkpoints/<script name>`` (:func:`standalone_checkpoint_dir`) and
    resumes from there when run again; ``""`` (argument or variable) turns checkpointing
    off. With ``install_signal_handler``, SIGTERM and SIGINT (Ctrl-C) ask the job to
    checkpoint at the next agreed step and exit with ``RESCALE_EXIT_CODE`` (75).

    >>> job = init_process_group(checkpoint_dir=tmp_path)  # doctest: +SKIP
    >>> job.rank, job.num_replicas, job.device  # doctest: +SKIP
    (0, 1, device(type='cpu'))
    """
    from pollux.torch.job import AgentConfig, JobContext

    cfg = config if config is not None else AgentConfig()
    launch = read_launch_environment(environ)
    chosen = backend or default_backend()
    if chosen not in ("gloo", "nccl"):
        raise ConfigError("backend", chosen, "use 'gloo' or 'nccl' (or None to pick)")
    device = default_device(launch.local_rank) if chosen == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = timedelta(seconds=cfg.process_group_timeout_s)
    created = not dist.is_initialized()
    if not created:
        if dist.get_world_size() != launch.num_replicas:
            raise ConfigError("WORLD_SIZE", dist.get_world_size(),
                              f"the default group disagrees with the launcher "
                              f"({launch.num_replicas} replicas)")
        chosen = dist.get_backend()
    elif launch.num_replicas == 1:
        dist.init_process_group(chosen, store=dist.HashStore(), rank=0, world_size=1,
                                timeout=timeout)
    else:  # several replicas: master_addr and master_port were checked by LaunchEnvironment
        store = rendezvous_store(str(launch.master_addr), int(launch.master_port or 0),
                                 launch.rank, launch.num_replicas, timeout)
        dist.init_process_group(chosen, store=store, rank=launch.rank,
                                world_size=launch.num_replicas, timeout=timeout)
    control_group = (dist.group.WORLD if chosen == "gloo"
                     else dist.new_group(backend="gloo", timeout=timeout))
    if checkpoint_dir is not None:
        launch = _with_checkpoint_dir(launch, os.fspath(checkpoint_dir) or None)
    elif launch.checkpoint_dir is None and jobenv.CHECKPOINT_DIR not in (
            os.environ if environ is None else environ):
        launch = _with_checkpoint_dir(launch, standalone_checkpoint_dir())
    return JobContext(launch, device=device, backend=chosen, control_group=control_group,
                      config=cfg, install_signal_handler=install_signal_handler,
                      owns_process_group=created)


def standalone_checkpoint_dir(argv0: str | None = None) -> str:
    """``pollux-checkpoints/<script>`` under the working directory: where a job launched
    outside the scheduler checkpoints unless told otherwise.

    >>> standalone_checkpoint_dir("examples/train_digits.py")
    'pollux-checkpoints/train_digits'
    """
    script = os.path.splitext(os.path.basename(argv0 if argv0 is not None else sys.argv[0]))[0]
    if not script or script.startswith("-"):  # python -c, an interactive session
        script = "python"
    return os.path.join("pollux-checkpoints", script)


def _with_checkpoint_dir(launch: LaunchEnvironment, path: str | None) -> LaunchEnvironment:
    from dataclasses import replace

    return replace(launch, checkpoint_dir=path)

"""``init_process_group``: join the job's process group, whoever launched it.

The launch environment (Pollux scheduler, ``torchrun``, or a single process) is read by
:mod:`pollux.torch.launch`. ``init_process_group`` picks NCCL on GPUs and gloo on CPU,
creates a gloo group for the agent's small host-side agreements, and returns the
:class:`~pollux.torch.job.JobContext` that the other pieces of the agent share.

Under ``torchrun`` the rendezvous store already exists: torchrun's own agent serves it on
``MASTER_ADDR:MASTER_PORT`` (``TORCHELASTIC_USE_AGENT_STORE=True``), so every replica,
rank 0 included, joins it as a client, as PyTorch's ``env://`` does. Otherwise rank 0
serves the store.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import replace
from datetime import timedelta

import torch
import torch.distributed as dist

from pollux.errors import ConfigError
from pollux.torch.job import AgentConfig, JobContext
from pollux.torch.launch import (
    LaunchEnvironment,
    LaunchSource,
    effective_checkpoint_dir,
    read_launch_environment,
    standalone_checkpoint_dir,
)

__all__ = [
    "LaunchEnvironment",
    "LaunchSource",
    "default_backend",
    "default_device",
    "init_process_group",
    "read_launch_environment",
    "rendezvous_store",
    "standalone_checkpoint_dir",
]

logger = logging.getLogger(__name__)


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
                     timeout: timedelta, *, served_elsewhere: bool = False) -> dist.TCPStore:
    """The job's TCPStore: rank 0 serves it (on loopback only when ``host`` is a loopback
    address), the others connect to it. ``served_elsewhere``: a launcher (torchrun's
    agent) already serves it at ``host:port``, so every rank connects."""
    serve = rank == 0 and not served_elsewhere
    listener = loopback_listener(host, port) if serve else None
    return dist.TCPStore(host, port, num_replicas, is_master=serve, timeout=timeout,
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
                                 launch.rank, launch.num_replicas, timeout,
                                 served_elsewhere=launch.launcher_store)
        dist.init_process_group(chosen, store=store, rank=launch.rank,
                                world_size=launch.num_replicas, timeout=timeout)
    control_group = (dist.group.WORLD if chosen == "gloo"
                     else dist.new_group(backend="gloo", timeout=timeout))
    if checkpoint_dir is not None:
        launch = _with_checkpoint_dir(launch, os.fspath(checkpoint_dir) or None)
    else:
        launch = _with_checkpoint_dir(launch, effective_checkpoint_dir(environ, launch))
    return JobContext(launch, device=device, backend=chosen, control_group=control_group,
                      config=cfg, install_signal_handler=install_signal_handler,
                      owns_process_group=created)


def _with_checkpoint_dir(launch: LaunchEnvironment, path: str | None) -> LaunchEnvironment:
    return replace(launch, checkpoint_dir=path)

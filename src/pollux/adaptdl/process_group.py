"""Joining the job, AdaptDL's way: ``adaptdl.torch.init_process_group`` and
``adaptdl.collective.initialize`` both make the process's default job here.

Where the job is comes from the launcher's environment (:mod:`pollux.torch.launch`:
Pollux's ``POLLUX_*``, torchrun's, AdaptDL's ``ADAPTDL_*``, in that order of
precedence), unless the call names it (``init_method="tcp://host:port"`` with
``world_size`` and ``rank``; or ``initialize(master_addr, master_port, replica_rank,
num_replicas)``), which then wins over every variable, as in AdaptDL.
"""

from __future__ import annotations

import atexit
import os

from pollux.adaptdl.default_job import DEFAULT_JOB
from pollux.jobenv import CHECKPOINT_DIR
from pollux.torch import distributed, launch
from pollux.torch.job import AgentConfig, JobContext

_ADAPTDL_SHAPE = (launch.ADAPTDL_REPLICA_RANK, launch.ADAPTDL_NUM_REPLICAS,
                  launch.ADAPTDL_NUM_NODES, launch.ADAPTDL_MASTER_ADDR,
                  launch.ADAPTDL_MASTER_PORT)
_TORCHRUN_SHAPE = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                   "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE")


def explicit_environ(master_addr: str, master_port: int, rank: int,
                     world_size: int) -> dict[str, str]:
    """This process's environment with the launch named explicitly: the given rendezvous
    as torchrun's variables, every other launcher's shape variables removed (the job's
    checkpoint directory and restart count are kept)."""
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith("POLLUX_") and k != CHECKPOINT_DIR)
           and k not in _ADAPTDL_SHAPE and k not in _TORCHRUN_SHAPE}
    env.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
               MASTER_ADDR=master_addr, MASTER_PORT=str(master_port))
    return env


def _from_init_method(init_method: str | None, world_size: int | None,
                      rank: int | None) -> dict[str, str] | None:
    """The environment named by AdaptDL's ``init_method="tcp://host:port"``."""
    if init_method is None:
        return None
    if not init_method.startswith("tcp://") or world_size is None or rank is None:
        raise ValueError(f"invalid init_method={init_method!r}: give 'tcp://host:port' "
                         "with world_size= and rank= (or none of them)")
    host, _, port = init_method[len("tcp://"):].partition("?")[0].rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"invalid init_method={init_method!r}: give 'tcp://host:port'")
    return explicit_environ(host, int(port), rank, world_size)


def join(backend: str | None, environ: dict[str, str] | None,
         config: AgentConfig | None) -> JobContext:
    """Make the default job (once per process) and close it when the process exits."""
    if DEFAULT_JOB.job is not None:
        raise RuntimeError("the job was already joined in this process (by "
                           "adaptdl.torch.init_process_group or adaptdl.collective."
                           "initialize): call only one of them, once")
    job = distributed.init_process_group(backend, config=config, environ=environ)
    DEFAULT_JOB.set(job)
    atexit.register(_close_at_exit, job)
    return job


def init_process_group(backend: str | None = None, init_method: str | None = None,
                       world_size: int | None = None, rank: int | None = None, *,
                       config: AgentConfig | None = None) -> JobContext:
    """Join the job and make it this process's default job; returns it (AdaptDL returns
    nothing; the native API takes it explicitly).

    ``backend``: ``"gloo"`` or ``"nccl"`` (None: NCCL with CUDA, else gloo). Without
    ``init_method``, the launcher's environment says where the job is (Pollux, torchrun,
    AdaptDL's variables, or a single process); ``init_method="tcp://host:port"`` with
    ``world_size`` and ``rank`` names it explicitly. Checkpoints go to
    ``POLLUX_CHECKPOINT_DIR``, else ``ADAPTDL_CHECKPOINT_PATH``, else
    ``./pollux-checkpoints/<script>``. The job is closed (checkpoint writes flushed,
    group left) when the process exits.
    """
    return join(backend, _from_init_method(init_method, world_size, rank), config)


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

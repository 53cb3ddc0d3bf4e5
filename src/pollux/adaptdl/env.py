"""``adaptdl.env``: where this replica sits in its job, read from the launch.

Same functions as AdaptDL's, answered from the launcher's environment as the agent reads
it (:func:`pollux.torch.read_launch_environment`: the Pollux scheduler's ``POLLUX_*``
variables, then torchrun's, then AdaptDL's own ``ADAPTDL_*``, else a single process), or
from the job once ``init_process_group`` has run (then :func:`checkpoint_path` is the
directory the agent really uses, including the standalone default
``./pollux-checkpoints/<script>``).

>>> from pollux.adaptdl import env
>>> env.replica_rank(), env.num_replicas()  # a single process  # doctest: +SKIP
(0, 1)
"""

from __future__ import annotations

import os

from pollux.adaptdl.default_job import DEFAULT_JOB
from pollux.torch.launch import (
    ADAPTDL_SUPERVISOR_URL,
    LaunchEnvironment,
    effective_checkpoint_dir,
    read_launch_environment,
)

SHARE_DIR = "POLLUX_SHARE_DIR"
"""A directory every replica of the job can read and write (data sets, artifacts)."""
ADAPTDL_SHARE_PATH = "ADAPTDL_SHARE_PATH"
"""AdaptDL's name for it, honoured when ``POLLUX_SHARE_DIR`` is unset."""


def _launch() -> LaunchEnvironment:
    job = DEFAULT_JOB.job
    return job.launch if job is not None else read_launch_environment()


def checkpoint_path() -> str | None:
    """The job's checkpoint directory (``POLLUX_CHECKPOINT_DIR``, else
    ``ADAPTDL_CHECKPOINT_PATH``, else ``./pollux-checkpoints/<script>``), or None when
    checkpointing is off (``POLLUX_CHECKPOINT_DIR=""``)."""
    job = DEFAULT_JOB.job
    return job.launch.checkpoint_dir if job is not None else effective_checkpoint_dir()


def share_path() -> str | None:
    """A directory shared by the job's replicas (``POLLUX_SHARE_DIR``, else AdaptDL's
    ``ADAPTDL_SHARE_PATH``), or None when neither is set (as in AdaptDL)."""
    return os.environ.get(SHARE_DIR) or os.environ.get(ADAPTDL_SHARE_PATH) or None


def job_id() -> str:
    """The job's id: the scheduler's, else ``ADAPTDL_JOB_ID``, else
    ``TORCHELASTIC_RUN_ID`` under torchrun, else ``local`` (AdaptDL: None outside its
    cluster)."""
    return _launch().job_id


def get_job_name() -> str:
    """The job's name, as AdaptDL's TensorBoard tutorial names its log directory: the
    job's id (:func:`job_id`)."""
    return job_id()


def master_addr() -> str:
    """Address of the rank-0 replica (``127.0.0.1`` for a single process)."""
    return _launch().master_addr or "127.0.0.1"


def master_port() -> int:
    """Rendezvous port of the rank-0 replica (0 for a single process)."""
    return int(_launch().master_port or 0)


def replica_rank() -> int:
    """Rank of this replica, 0 to ``num_replicas() - 1``."""
    return _launch().rank


def num_replicas() -> int:
    """Replicas in the job (processes, one per GPU)."""
    return _launch().num_replicas


def num_nodes() -> int:
    """Distinct nodes the replicas run on."""
    return _launch().num_nodes


def num_restarts() -> int:
    """How many times the job was restarted (rescaled or resumed) so far."""
    return _launch().num_restarts


def supervisor_url() -> str | None:
    """AdaptDL's Kubernetes supervisor (``ADAPTDL_SUPERVISOR_URL``), which Pollux never
    sets: its scheduler hands the rendezvous address to every replica."""
    return os.environ.get(ADAPTDL_SUPERVISOR_URL) or None


def adaptdl_sched_version() -> None:
    """AdaptDL's scheduler version: none under Pollux."""
    return None


def from_ray() -> bool:
    """Whether AdaptDL's Ray Tune integration launched this process: never here."""
    return False

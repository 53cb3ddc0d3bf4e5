"""The launch contract between the scheduler's backends and the in-job agent.

Backends set these environment variables for every replica; the agent reads them
(``pollux.torch``). Kept here, free of torch and of the service, so both sides share
one definition.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from pollux.errors import ConfigError

JOB_ID = "POLLUX_JOB_ID"
RANK = "POLLUX_RANK"
"""Global rank of this replica, 0..num_replicas-1."""
NUM_REPLICAS = "POLLUX_NUM_REPLICAS"
"""World size: replicas of this job in this allocation."""
LOCAL_RANK = "POLLUX_LOCAL_RANK"
"""Rank among this job's replicas on the same node."""
NODE_RANK = "POLLUX_NODE_RANK"
NUM_NODES = "POLLUX_NUM_NODES"
MASTER_ADDR = "POLLUX_MASTER_ADDR"
MASTER_PORT = "POLLUX_MASTER_PORT"
CHECKPOINT_DIR = "POLLUX_CHECKPOINT_DIR"
"""Directory where the job's checkpoints live across restarts."""
HINTS_TARGET = "POLLUX_HINTS_TARGET"
"""Where the agent reports hints: a file path or an ``http(s)://`` URL."""
HINTS_TOKEN = "POLLUX_HINTS_TOKEN"
"""Bearer token for posting hints (this job's own)."""
NUM_RESTARTS = "POLLUX_NUM_RESTARTS"
"""How many times the job has been (re)started before this launch."""
GPU_TYPE = "POLLUX_GPU_TYPE"
"""The GPU type of the nodes this launch runs on, as the scheduler names it (the node's
declared type); the agent keys its step-time profile by it. Set only on typed clusters;
a user may set it by hand to name a CPU or a device."""

ON_CORRUPT_CHECKPOINT = "POLLUX_ON_CORRUPT_CHECKPOINT"
"""What the agent does when every checkpoint is corrupt: ``fail`` (default) or ``fresh``."""

INHERITED_LAUNCH_PREFIXES = ("POLLUX_", "ADAPTDL_")
"""Prefixes of variables that describe one launch (Pollux's own, and AdaptDL's, which the
agent also reads): a backend never passes them from the server's own environment to a
replica, where a stale value would disagree with the launch's (the agent refuses two
sources that disagree). A job's ``env`` and the backend's own variables still reach it."""

_Env = TypeVar("_Env", bound="JobEnvironment")

RESCALE_EXIT_CODE = 75
"""Exit code of a replica that checkpointed and stopped because it was asked to (SIGTERM)."""
CORRUPT_SUFFIX = ".corrupt"
"""Appended by the agent to a checkpoint found corrupt when the job starts over."""
CORRUPT_CHECKPOINT_EXIT_CODE = 76
"""Exit code of a replica that found only corrupt checkpoints and was told not to start
over (``on_corrupt_checkpoint: fail``): the job fails at once, with that reason."""


@dataclass(frozen=True)
class JobEnvironment:
    """The launch environment of one replica: where it sits in its job and where the job
    keeps its checkpoints and sends its hints. Backends write it with :meth:`to_env`; the
    agent reads it (``pollux.torch.distributed.LaunchEnvironment`` extends it with who
    launched the process)."""

    job_id: str
    rank: int
    num_replicas: int
    local_rank: int = 0
    node_rank: int = 0
    num_nodes: int = 1
    master_addr: str | None = None
    """Rendezvous host of the job's process group (needed with several replicas)."""
    master_port: int | None = None
    checkpoint_dir: str | None = None
    """Where checkpoints live across restarts; None disables checkpointing."""
    hints_target: str | None = None
    hints_token: str | None = None
    num_restarts: int = 0
    on_corrupt_checkpoint: str = "fail"
    gpu_type: str | None = None
    """The GPU type of this launch's nodes (a job's allocation never spans types); None
    when the cluster declares none."""

    def to_env(self) -> dict[str, str]:
        env = {
            JOB_ID: self.job_id,
            RANK: str(self.rank),
            NUM_REPLICAS: str(self.num_replicas),
            LOCAL_RANK: str(self.local_rank),
            NODE_RANK: str(self.node_rank),
            NUM_NODES: str(self.num_nodes),
            NUM_RESTARTS: str(self.num_restarts),
            ON_CORRUPT_CHECKPOINT: self.on_corrupt_checkpoint,
        }
        if self.master_addr is not None:
            env[MASTER_ADDR] = self.master_addr
        if self.master_port is not None:
            env[MASTER_PORT] = str(self.master_port)
        if self.checkpoint_dir is not None:
            env[CHECKPOINT_DIR] = self.checkpoint_dir
        if self.hints_target:
            env[HINTS_TARGET] = self.hints_target
        if self.hints_token:
            env[HINTS_TOKEN] = self.hints_token
        if self.gpu_type:
            env[GPU_TYPE] = self.gpu_type
        return env

    @classmethod
    def from_env(cls: type[_Env], environ: Mapping[str, str] | None = None) -> _Env | None:
        """Read the Pollux variables (as this class, or a subclass whose own fields have
        defaults); None when this process was not launched by Pollux."""
        env = os.environ if environ is None else environ
        if JOB_ID not in env:
            return None

        def integer(name: str, default: int | None = None) -> int:
            raw = env.get(name)
            if raw is None:
                if default is None:
                    raise ConfigError(name, None, "the Pollux launcher must set it")
                return default
            try:
                return int(raw)
            except ValueError as exc:
                raise ConfigError(name, raw, "must be an integer") from exc

        return cls(
            job_id=env[JOB_ID],
            rank=integer(RANK),
            num_replicas=integer(NUM_REPLICAS),
            local_rank=integer(LOCAL_RANK, 0),
            node_rank=integer(NODE_RANK, 0),
            num_nodes=integer(NUM_NODES, 1),
            master_addr=env.get(MASTER_ADDR, "127.0.0.1"),
            master_port=integer(MASTER_PORT),
            checkpoint_dir=env.get(CHECKPOINT_DIR, "."),
            hints_target=env.get(HINTS_TARGET),
            hints_token=env.get(HINTS_TOKEN),
            num_restarts=integer(NUM_RESTARTS, 0),
            on_corrupt_checkpoint=env.get(ON_CORRUPT_CHECKPOINT, "fail"),
            gpu_type=env.get(GPU_TYPE) or None,
        )

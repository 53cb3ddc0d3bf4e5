"""Who launched this training process, and where it sits in its job.

Three ways to be launched, tried in this order:

* by the Pollux scheduler: ``POLLUX_*`` variables (:mod:`pollux.jobenv`);
* by ``torchrun``: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ...;
* by nothing: a single process (world size 1, an in-process store).

Reading the environment needs no process group (:mod:`pollux.torch.distributed` joins
one).
"""

from __future__ import annotations

import enum
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from pollux import jobenv
from pollux.errors import ConfigError


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
    launcher_store: bool = False
    """The launcher already serves the rendezvous store at ``master_addr:master_port``
    (torchrun's agent: ``TORCHELASTIC_USE_AGENT_STORE=True``); rank 0 joins it too."""

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
            launcher_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
        )
    return LaunchEnvironment(source=LaunchSource.SINGLE, job_id="local", rank=0,
                             num_replicas=1, checkpoint_dir=checkpoint_dir,
                             hints_target=hints_target, hints_token=hints_token,
                             gpu_type=gpu_type)


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

"""Who launched this training process, and where it sits in its job.

Three launchers are understood, in this order of precedence:

1. the Pollux scheduler: ``POLLUX_*`` variables (:mod:`pollux.jobenv`), when
   ``POLLUX_JOB_ID`` is set;
2. ``torchrun``: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ...,
   when ``RANK`` and ``WORLD_SIZE`` are set;
3. AdaptDL's standalone launch: ``ADAPTDL_REPLICA_RANK``, ``ADAPTDL_NUM_REPLICAS``,
   ``ADAPTDL_MASTER_ADDR``, ``ADAPTDL_MASTER_PORT``, ``ADAPTDL_NUM_NODES``,
   ``ADAPTDL_NUM_RESTARTS`` (any of them set);

else a single process (world size 1, an in-process store). The first launcher present
is the :class:`LaunchSource`; every field is taken from the first source that sets it,
so a lower source still fills what the higher one leaves out (``ADAPTDL_CHECKPOINT_PATH``
or ``POLLUX_CHECKPOINT_DIR`` under torchrun). Two sources that both set a field of the
job's shape or its checkpoint directory (:data:`MUST_AGREE`) to different values are an
error naming both variables: either reading could be the intended one, and guessing
wrong trains replicas apart or checkpoints where no restart looks. Labels (the job id)
are taken from the first source without a check.

Reading the environment needs no process group (:mod:`pollux.torch.distributed` joins
one).
"""

from __future__ import annotations

import enum
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pollux import jobenv
from pollux.errors import ConfigError

ADAPTDL_REPLICA_RANK = "ADAPTDL_REPLICA_RANK"
ADAPTDL_NUM_REPLICAS = "ADAPTDL_NUM_REPLICAS"
ADAPTDL_NUM_NODES = "ADAPTDL_NUM_NODES"
"""Nodes the replicas run on (AdaptDL: ``ADAPTDL_NUM_REPLICAS`` when unset, one
replica per node); ranks are taken to fill the nodes in order."""
ADAPTDL_MASTER_ADDR = "ADAPTDL_MASTER_ADDR"
ADAPTDL_MASTER_PORT = "ADAPTDL_MASTER_PORT"
ADAPTDL_NUM_RESTARTS = "ADAPTDL_NUM_RESTARTS"
ADAPTDL_JOB_ID = "ADAPTDL_JOB_ID"
ADAPTDL_CHECKPOINT_PATH = "ADAPTDL_CHECKPOINT_PATH"
ADAPTDL_SUPERVISOR_URL = "ADAPTDL_SUPERVISOR_URL"
"""Set by AdaptDL's Kubernetes scheduler, which Pollux does not replace in-cluster."""

MUST_AGREE = ("rank", "num_replicas", "local_rank", "node_rank", "num_nodes",
              "master_addr", "master_port", "num_restarts", "checkpoint_dir")
"""Fields that two launch sources may both set only to the same value."""

_INTEGERS = frozenset({"rank", "num_replicas", "local_rank", "node_rank", "num_nodes",
                       "master_port", "num_restarts"})


class LaunchSource(enum.Enum):
    """Who started this process.

    >>> read_launch_environment({"RANK": "1", "WORLD_SIZE": "2", "MASTER_PORT": "29500"}).source
    <LaunchSource.TORCHRUN: 'torchrun'>
    """

    POLLUX = "pollux"
    TORCHRUN = "torchrun"
    ADAPTDL = "adaptdl"
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


@dataclass
class _Reading:
    """What one launcher's variables say: the fields they set and by which variable."""

    source: LaunchSource
    launches: bool
    """Whether these variables describe a launch (else they only fill fields)."""
    values: dict[str, Any] = field(default_factory=dict)
    variables: dict[str, str] = field(default_factory=dict)

    def take(self, env: Mapping[str, str], name: str, variable: str) -> None:
        """Read ``variable`` into ``name`` if it is set (an empty value is unset, except
        ``POLLUX_CHECKPOINT_DIR=""``, which turns checkpointing off)."""
        raw = env.get(variable)
        if raw is None or (raw == "" and variable != jobenv.CHECKPOINT_DIR):
            return
        self.values[name] = _parse_int(variable, raw) if name in _INTEGERS else raw or None
        self.variables[name] = variable


def _parse_int(variable: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError as exc:
        raise ConfigError(variable, raw, "must be an integer") from exc


_POLLUX_ALONE = {"checkpoint_dir": jobenv.CHECKPOINT_DIR, "hints_target": jobenv.HINTS_TARGET,
                 "hints_token": jobenv.HINTS_TOKEN, "gpu_type": jobenv.GPU_TYPE,
                 "on_corrupt_checkpoint": jobenv.ON_CORRUPT_CHECKPOINT}
_POLLUX_LAUNCH = {"job_id": jobenv.JOB_ID, "rank": jobenv.RANK,
                  "num_replicas": jobenv.NUM_REPLICAS, "local_rank": jobenv.LOCAL_RANK,
                  "node_rank": jobenv.NODE_RANK, "num_nodes": jobenv.NUM_NODES,
                  "master_addr": jobenv.MASTER_ADDR, "master_port": jobenv.MASTER_PORT,
                  "num_restarts": jobenv.NUM_RESTARTS}
_TORCHRUN = {"rank": "RANK", "num_replicas": "WORLD_SIZE", "local_rank": "LOCAL_RANK",
             "node_rank": "GROUP_RANK", "master_addr": "MASTER_ADDR",
             "master_port": "MASTER_PORT", "job_id": "TORCHELASTIC_RUN_ID",
             "num_restarts": "TORCHELASTIC_RESTART_COUNT"}
_ADAPTDL_LAUNCH = {"rank": ADAPTDL_REPLICA_RANK, "num_replicas": ADAPTDL_NUM_REPLICAS,
                   "num_nodes": ADAPTDL_NUM_NODES, "master_addr": ADAPTDL_MASTER_ADDR,
                   "master_port": ADAPTDL_MASTER_PORT, "num_restarts": ADAPTDL_NUM_RESTARTS}
_ADAPTDL_ALONE = {"job_id": ADAPTDL_JOB_ID, "checkpoint_dir": ADAPTDL_CHECKPOINT_PATH}


def _pollux(env: Mapping[str, str]) -> _Reading:
    launches = jobenv.JOB_ID in env
    if launches:
        jobenv.JobEnvironment.from_env(env)  # its own checks: the variables it requires
    reading = _Reading(LaunchSource.POLLUX, launches)
    for name, variable in {**(_POLLUX_LAUNCH if launches else {}), **_POLLUX_ALONE}.items():
        reading.take(env, name, variable)
    return reading


def _torchrun(env: Mapping[str, str]) -> _Reading:
    reading = _Reading(LaunchSource.TORCHRUN, "RANK" in env and "WORLD_SIZE" in env)
    if not reading.launches:
        return reading
    for name, variable in _TORCHRUN.items():
        reading.take(env, name, variable)
    if env.get("LOCAL_WORLD_SIZE"):
        local_world = max(_parse_int("LOCAL_WORLD_SIZE", env["LOCAL_WORLD_SIZE"]), 1)
        reading.values["num_nodes"] = max(1, -(-reading.values["num_replicas"] // local_world))
        reading.variables["num_nodes"] = "LOCAL_WORLD_SIZE"
    reading.values["launcher_store"] = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    return reading


def _adaptdl(env: Mapping[str, str]) -> _Reading:
    reading = _Reading(LaunchSource.ADAPTDL,
                       any(env.get(variable) for variable in _ADAPTDL_LAUNCH.values()))
    for name, variable in {**(_ADAPTDL_LAUNCH if reading.launches else {}),
                           **_ADAPTDL_ALONE}.items():
        reading.take(env, name, variable)
    return reading


def _check_agreement(readings: list[_Reading]) -> None:
    for name in MUST_AGREE:
        setters = [(r.variables[name], r.values[name]) for r in readings if name in r.variables]
        if len({value for _, value in setters}) > 1:
            said = ", ".join(f"{variable}={value!r}" for variable, value in setters)
            raise ConfigError(
                name, setters[0][1],
                f"the launch variables disagree ({said}): unset the ones that do not "
                "describe this launch (precedence: POLLUX_*, then torchrun's, then "
                "ADAPTDL_*; see docs/train/from-adaptdl.md)")


def _adaptdl_defaults(values: dict[str, Any], env: Mapping[str, str]) -> None:
    """AdaptDL's defaults: one replica per node unless ``ADAPTDL_NUM_NODES`` says, ranks
    filling the nodes in order; several replicas need ``ADAPTDL_MASTER_PORT``."""
    replicas = int(values.get("num_replicas", 1))
    nodes = int(values.setdefault("num_nodes", replicas))
    if replicas > 1 and "master_port" not in values:
        fix = ("set it to a free port on the rank-0 node, the same for every replica "
               "(with ADAPTDL_MASTER_ADDR)")
        if env.get(ADAPTDL_SUPERVISOR_URL):
            fix = ("AdaptDL's Kubernetes scheduler is not supported: run the job with "
                   "`pollux submit`, or launch it standalone and " + fix)
        raise ConfigError(ADAPTDL_MASTER_PORT, None, fix)
    per_node = -(-replicas // max(nodes, 1))
    rank = int(values.get("rank", 0))
    values.setdefault("local_rank", rank % per_node)
    values.setdefault("node_rank", rank // per_node)
    values.setdefault("master_addr", "127.0.0.1")


def read_launch_environment(environ: Mapping[str, str] | None = None) -> LaunchEnvironment:
    """Read the launch environment (Pollux, then torchrun, then AdaptDL's variables, else
    a single process; see the module for the precedence and the agreement check).

    >>> read_launch_environment({"RANK": "1", "WORLD_SIZE": "2", "MASTER_PORT": "29500"}).rank
    1
    >>> read_launch_environment({"ADAPTDL_REPLICA_RANK": "1", "ADAPTDL_NUM_REPLICAS": "2",
    ...                          "ADAPTDL_MASTER_PORT": "47000"}).source.value
    'adaptdl'
    """
    env = os.environ if environ is None else environ
    readings = [_pollux(env), _torchrun(env), _adaptdl(env)]
    _check_agreement(readings)
    launching = next((r for r in readings if r.launches), None)
    values: dict[str, Any] = {}
    for reading in reversed(readings):  # the first source that sets a field wins
        values.update(reading.values)
    source = launching.source if launching is not None else LaunchSource.SINGLE
    if source is not LaunchSource.TORCHRUN:  # only torchrun's own launch has its store
        values.pop("launcher_store", None)
    if source is LaunchSource.ADAPTDL:
        _adaptdl_defaults(values, env)
    elif source is LaunchSource.POLLUX:
        values.setdefault("checkpoint_dir", ".")
        values.setdefault("master_addr", "127.0.0.1")
    elif source is LaunchSource.TORCHRUN:
        if "master_port" not in values:
            raise ConfigError("MASTER_PORT", None, "the launcher must set this variable")
        values.setdefault("master_addr", "127.0.0.1")
        values.setdefault("job_id", "torchrun")
    values.setdefault("job_id", "local")
    values.setdefault("rank", 0)
    values.setdefault("num_replicas", 1)
    return LaunchEnvironment(source=source, **values)


def effective_checkpoint_dir(environ: Mapping[str, str] | None = None,
                             launch: LaunchEnvironment | None = None) -> str | None:
    """Where a job launched so checkpoints: the launch's directory
    (``POLLUX_CHECKPOINT_DIR``, else ``ADAPTDL_CHECKPOINT_PATH``), else
    :func:`standalone_checkpoint_dir`; None when ``POLLUX_CHECKPOINT_DIR=""`` turned
    checkpointing off.

    >>> effective_checkpoint_dir({"ADAPTDL_CHECKPOINT_PATH": "/ck"})
    '/ck'
    """
    env = os.environ if environ is None else environ
    launch = read_launch_environment(env) if launch is None else launch
    if launch.checkpoint_dir is not None or jobenv.CHECKPOINT_DIR in env:
        return launch.checkpoint_dir
    return standalone_checkpoint_dir()


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

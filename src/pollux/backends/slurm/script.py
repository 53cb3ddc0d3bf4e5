"""What a launch asks of Slurm: its name, each replica's ``srun`` step, and (cluster
mode) the ``sbatch`` script that holds them.

Each replica is one job step of one task and one GPU, pinned to the node the policy
chose (``srun --nodelist NODE --ntasks 1 --exact --gres gpu[:TYPE]:1``), so Slurm sets
its ``CUDA_VISIBLE_DEVICES``. The step runs the job's command under the exit-status
wrapper (:mod:`pollux.backends.slurm.step_wrapper`), with the launch contract
(:mod:`pollux.jobenv`) in its environment (from a file only the server's user reads),
its output appended to
``<log_dir>/replica-<rank>.log`` by the wrapper within the log budget (never by
``srun --output`` straight into the file).

In cluster mode one ``sbatch`` per launch allocates exactly the policy's placement: the
nodes (``--nodelist``), and per node as many tasks and GPUs as replicas there
(``--distribution arbitrary`` with a host file, ``--gpus-per-task 1``), so all replicas
start together when the allocation does. Its script starts one step per replica and
waits; a requeued run of it exits at once (a launch never runs twice). Slurm's own
output goes to ``<log_dir>/slurm-launch-<generation>-<slurm job id>.out``.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from pollux.backends.base import LaunchRequest
from pollux.backends.exit_status import exit_status_path
from pollux.backends.replica_log import DEFAULT_LOG_BUDGET_BYTES
from pollux.backends.slurm.step_wrapper import wrapped_step
from pollux.data_dir import replica_log
from pollux.jobenv import INHERITED_LAUNCH_PREFIXES

NAME_PREFIX = "pollux"
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
GLOO_INTERFACE_ENV = "GLOO_SOCKET_IFNAME"
LOOPBACK_INTERFACE = "lo"
SLURM_INPUT_PREFIXES = ("SBATCH_", "SALLOC_", "SRUN_", "SLURM_")
"""Variables Slurm's commands read as options (command line > environment > script):
none reaches ``sbatch`` or ``srun`` from the server's environment or a job's ``env``."""
KEPT_SLURM_VARS = ("SLURM_CONF",)
"""The Slurm client setting passed on (which cluster to talk to); every other variable
of :data:`SLURM_INPUT_PREFIXES` is left out, so it cannot change a launch's options."""
CLIENT_ENV_NAMES = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR",
                    "SLURM_CONF")
"""The allow list of the environment of Slurm's commands (``sbatch``, ``srun``,
``squeue``, ...), with ``LC_*``: nothing else of the server's environment reaches them.
A job's own environment travels in its replicas' environment files instead."""


def work_prefix(instance_id: str) -> str:
    """The start of the name of every piece of Slurm work of one Pollux data directory."""
    return f"{NAME_PREFIX}-{instance_id[:12]}-"


def launch_name(instance_id: str, job_id: str, generation: int) -> str:
    """Slurm job (or step) name of a launch: ``pollux-<instance>-<job id>-g<generation>``,
    so ``squeue`` shows whose work it is."""
    return f"{work_prefix(instance_id)}{job_id}-g{generation}"


def step_name(instance_id: str, job_id: str, generation: int, rank: int) -> str:
    return f"{launch_name(instance_id, job_id, generation)}-r{rank}"


def gres_request(gpu_type: str | None, count: int = 1) -> str:
    return f"gpu:{count}" if gpu_type is None else f"gpu:{gpu_type}:{count}"


def client_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of Slurm's commands: :data:`CLIENT_ENV_NAMES` and ``LC_*`` of
    ``base`` (default: the server's), nothing else (no ``SBATCH_*``, ``SALLOC_*``,
    ``SRUN_*``, ``SQUEUE_*``... that would change what a command does)."""
    source = os.environ if base is None else base
    return {k: v for k, v in source.items() if k in CLIENT_ENV_NAMES or k.startswith("LC_")}


def is_slurm_input(name: str) -> bool:
    """Whether Slurm's commands would read variable ``name`` as one of their options."""
    return name.startswith(SLURM_INPUT_PREFIXES) and name not in KEPT_SLURM_VARS


def job_environment(request: LaunchRequest, loopback: bool,
                    base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment all replicas of a launch share: the server's (less Pollux's and
    Slurm's option variables), the job's ``env``, thread counts, and gloo's loopback
    interface when every node is this machine. It reaches the replicas through their
    environment files (:func:`env_file`), never through ``sbatch``'s or ``srun``'s."""
    source = os.environ if base is None else base
    env = {k: v for k, v in source.items()
           if not k.startswith(INHERITED_LAUNCH_PREFIXES) and not is_slurm_input(k)}
    env.update((k, v) for k, v in request.spec.env.items() if not is_slurm_input(k))
    threads = str(max(1, int(request.spec.resources.cpu)))
    for name in THREAD_ENV_VARS:
        if name not in request.spec.env:
            env[name] = threads
    if loopback and GLOO_INTERFACE_ENV not in env:
        env[GLOO_INTERFACE_ENV] = LOOPBACK_INTERFACE
    return env


def cpus_per_task(request: LaunchRequest) -> int:
    return max(1, int(request.spec.resources.cpu))


def env_file(request: LaunchRequest, rank: int) -> Path:
    """Where replica ``rank``'s environment (the job's, :func:`job_environment`, and its
    launch contract, hints token included) is written for its wrapper: a file only the
    server's user reads, never a command line that ``ps`` shows every user of the node,
    nor the environment of ``sbatch``/``srun``."""
    return Path(request.log_dir) / f"replica-{rank}.launch-{request.generation}.env"


def write_env_file(path: Path, env: Mapping[str, str]) -> None:
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        json.dump(dict(env), handle)


def step_command(request: LaunchRequest, instance_id: str, rank: int, node: str,
                 job_id: str | None = None,
                 log_budget_bytes: int = DEFAULT_LOG_BUDGET_BYTES) -> list[str]:
    """``srun`` of one replica (``job_id``: in that allocation, allocation mode); its own
    variables are in :func:`env_file`. The command's output reaches
    ``replica-<rank>.log`` through its wrapper, within ``log_budget_bytes``
    (:mod:`pollux.backends.replica_log`); ``srun --output`` gets the wrapper's own
    messages only."""
    log_dir = Path(request.log_dir)
    status = exit_status_path(log_dir, request.generation, rank)
    args = ["srun"]
    if job_id is not None:
        args.append(f"--jobid={job_id}")
    args += [f"--nodelist={node}", "--nodes=1", "--ntasks=1", "--exact",
             "--distribution=block", f"--cpus-per-task={cpus_per_task(request)}",
             f"--gres={gres_request(request.gpu_type)}",
             f"--job-name={step_name(instance_id, request.job_id, request.generation, rank)}",
             f"--output={output_pattern(wrapper_output(request, rank))}",
             "--open-mode=append",
             "--kill-on-bad-exit=0", "--quiet"]
    return [*args, *wrapped_step(str(status), str(env_file(request, rank)),
                                 list(request.spec.command),
                                 str(replica_log(log_dir, rank)), log_budget_bytes)]


def wrapper_output(request: LaunchRequest, rank: int) -> Path:
    """Where a replica's ``srun`` writes its task's own output: its wrapper's messages
    only (the command's output goes through the wrapper into the bounded log)."""
    return Path(request.log_dir) / f"replica-{rank}.launch-{request.generation}.wrapper.out"


def log_header(request: LaunchRequest, rank: int, node: str, where: str) -> str:
    """The line each replica's log gets before its output (as on the other backends)."""
    return (f"=== pollux {time.strftime('%Y-%m-%d %H:%M:%S')}: launch {request.generation}, "
            f"rank {rank} of {len(request.allocation)} on {node} ({where}) ===")


def output_pattern(path: Path) -> str:
    """``path`` as a Slurm output file name: its own ``%`` doubled (Slurm expands
    ``%j``, ``%u``...; ``%%`` is a literal one)."""
    return str(path).replace("%", "%%")


def batch_options(request: LaunchRequest, name: str, partition: str | None,
                  account: str | None) -> list[str]:
    """The options of a launch's ``sbatch`` (cluster mode), given on its command line
    (one argument each, never parsed from ``#SBATCH`` lines of the script); the
    request's own account (its job's team's) before the backend's ``account``."""
    nodes = list(dict.fromkeys(request.allocation))
    out = output_pattern(Path(request.log_dir)) + f"/slurm-launch-{request.generation}-%j.out"
    options = [f"--job-name={name}", f"--output={out}",
               f"--chdir={request.spec.working_dir}", "--no-requeue", "--export=ALL",
               f"--nodes={len(nodes)}", f"--ntasks={len(request.allocation)}",
               f"--nodelist={','.join(nodes)}", "--distribution=arbitrary",
               f"--gpus-per-task={gres_request(request.gpu_type)[4:]}",
               f"--cpus-per-task={cpus_per_task(request)}"]
    if partition:
        options.append(f"--partition={partition}")
    if request.account or account:
        options.append(f"--account={request.account or account}")
    return options


def host_file(request: LaunchRequest) -> Path:
    """Where a launch's task layout (one node per replica, rank order) is written for
    ``--distribution arbitrary``."""
    return Path(request.log_dir) / f"launch-{request.generation}.hosts"


def batch_script(request: LaunchRequest,
                 steps: Sequence[tuple[int, str, Sequence[str]]]) -> str:
    """The script of a launch's ``sbatch``: ``steps`` are (rank, node, srun command).
    It has no ``#SBATCH`` line (the options are :func:`batch_options`, on ``sbatch``'s
    command line), and every word from a job or a path is quoted."""
    lines = ["#!/bin/bash",
             "# one Pollux launch: one step per replica; a requeued run never starts again",
             'if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then',
             '  echo "pollux: requeued by Slurm; this launch does not run twice" >&2',
             "  exit 1", "fi", "unset SLURM_HOSTFILE SLURM_DISTRIBUTION"]
    for rank, node, command in steps:
        log = replica_log(request.log_dir, rank)
        before, _, after = log_header(request, rank, node, "Slurm job @").partition("@")
        lines.append(f"printf '%s\\n' {shlex.quote(before)}\"$SLURM_JOB_ID\""
                     f"{shlex.quote(after)} >> {shlex.quote(str(log))}")
        lines.append(f"{shlex.join(command)} &")
    lines += ["wait", ""]
    return "\n".join(lines)

"""The Slurm backend: the policy's nodes are Slurm's nodes, and each launch is Slurm work
placed exactly where the policy decided.

Two modes (``mode``; default: ``allocation`` inside an allocation, i.e. when
``SLURM_JOB_ID`` is set, else ``cluster``):

- **cluster**: Pollux schedules a partition (or the nodes ``nodes`` names). Each launch
  is one ``sbatch`` job of exactly the policy's placement
  (:mod:`pollux.backends.slurm.script`); GPUs that other Slurm jobs hold are not free.
- **allocation**: Pollux schedules the nodes and GPUs of one allocation (the server runs
  inside it); each replica is a job step of it (``srun --jobid``).

Every piece of work is named ``pollux-<instance>-<job id>-g<generation>[-r<rank>]`` (the
instance is one per data directory), so ``squeue`` shows whose it is and a restarted
server finds its predecessor's work by name: :meth:`SlurmBackend.recover` asks it to
checkpoint and stop (SIGTERM), cancels what is left after the grace, and each replica's
real exit status is the one its wrapper recorded. When Slurm cannot be reached, the
nodes are the last ones read and the replicas' state is UNKNOWN (never failed for it).
Checkpoint and log directories must be on a filesystem every node mounts at the same
path, with the same Python and Pollux installed.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pollux.backends.base import (
    Backend,
    LaunchedReplica,
    LaunchRequest,
    LiveReplica,
    ReplicaStatus,
)
from pollux.backends.exit_status import exit_status_path
from pollux.backends.replica_log import DEFAULT_LOG_BUDGET_BYTES, check_log_budget
from pollux.backends.slurm.commands import SlurmCommands, SlurmUnavailable
from pollux.backends.slurm.launches import ALLOCATION, CLUSTER, SlurmLaunch, SlurmReplica
from pollux.backends.slurm.nodes import NodeView, allocation_views, expand_hostlist, node_views
from pollux.backends.slurm.recovery import adoptable, recover_allocation, recover_cluster
from pollux.backends.slurm.script import (
    batch_options,
    batch_script,
    client_environment,
    env_file,
    host_file,
    is_slurm_input,
    job_environment,
    launch_name,
    log_header,
    step_command,
    step_name,
    work_prefix,
    write_env_file,
)
from pollux.backends.slurm.signals import signal_cluster, signal_steps
from pollux.backends.slurm.states import Phase, UnknownSlurmState, job_state
from pollux.backends.slurm.watch import SlurmWatch
from pollux.data_dir import replica_log
from pollux.errors import BackendError, ConfigError, JobSpecError
from pollux.job_spec import JobSpec
from pollux.resources import NodeInfo

logger = logging.getLogger(__name__)

MODES = (CLUSTER, ALLOCATION)
PENDING_TIMEOUT_S = 120.0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


class SlurmBackend(Backend):
    """Replicas as Slurm job steps: of one ``sbatch`` per launch, or of one allocation."""

    name = "slurm"

    def __init__(self, instance_id: str, partition: str | None = None,
                 account: str | None = None, nodes: str | None = None,
                 mode: str | None = None, allocation_job_id: str | None = None,
                 commands: SlurmCommands | None = None,
                 pending_timeout_s: float = PENDING_TIMEOUT_S,
                 log_budget_bytes: int = DEFAULT_LOG_BUDGET_BYTES) -> None:
        """``pending_timeout_s``: how long a launch may wait for its nodes (e.g. GPUs a
        foreign job took since the round) before it is withdrawn and ends non-zero, so
        the job is placed again. ``log_budget_bytes``: each replica's log budget
        (:mod:`pollux.backends.replica_log`)."""
        try:
            check_log_budget(log_budget_bytes)
        except ValueError as exc:
            raise ConfigError("log_budget", log_budget_bytes, str(exc)) from None
        self.log_budget_bytes = log_budget_bytes
        if pending_timeout_s <= 0:
            raise ConfigError("pending_timeout_s", pending_timeout_s, "must be > 0")
        self.pending_timeout_s = pending_timeout_s
        if mode is None:
            mode = ALLOCATION if os.environ.get("SLURM_JOB_ID") else CLUSTER
        if mode not in MODES:
            raise ConfigError("slurm_mode", mode, "choose cluster or allocation")
        self.mode = mode
        self.instance_id = instance_id
        self.partition = partition or None
        self.account = account or None
        self.allowed = None if not nodes else expand_hostlist(nodes)
        self.commands = commands or SlurmCommands()
        self.allocation_job_id: str | None = None
        if mode == ALLOCATION:
            job = allocation_job_id or os.environ.get("SLURM_JOB_ID")
            if not job:
                raise ConfigError("slurm_mode", mode, "allocation mode runs inside a Slurm "
                                  "allocation (SLURM_JOB_ID unset); use --slurm-mode cluster")
            if partition or account:
                raise ConfigError("slurm_partition" if partition else "slurm_account",
                                  partition or account, "applies to cluster mode only; "
                                  "the allocation's own partition and account are used")
            self.allocation_job_id = job
        self._launches: dict[str, SlurmLaunch] = {}
        self._views: dict[str, NodeView] = {}
        self._watch = SlurmWatch(self.commands)
        self._unreachable_since: float | None = None
        self._partitions: set[str] = set()
        self._reported_states: set[str] = set()
        try:
            found = self._read_nodes()
            if partition and partition not in self._partitions:
                raise ConfigError("slurm_partition", partition, "no such partition; Slurm "
                                  f"has {', '.join(sorted(self._partitions)) or 'none'}")
        except SlurmUnavailable as exc:
            raise ConfigError("backend", "slurm", f"cannot reach Slurm ({exc}); check "
                              "SLURM_CONF and that slurmctld runs") from exc
        except ConfigError:
            raise
        except BackendError as exc:
            raise ConfigError("backend", "slurm", str(exc)) from exc
        if not found:
            where = (f"allocation {self.allocation_job_id}" if mode == ALLOCATION
                     else f"partition {partition}" if partition else "the cluster")
            logger.warning("slurm backend: no schedulable node with GPUs in %s", where)
        logger.info("slurm backend (%s mode): %d nodes", mode, len(found))

    # --- nodes ------------------------------------------------------------------------

    def _is_ours(self, name: str) -> bool:
        return name.startswith(work_prefix(self.instance_id))

    def _read_nodes(self) -> list[NodeView]:
        sinfo = self.commands.nodes()
        self._partitions = {str(p) for node in sinfo for p in node.get("partitions") or []}
        if self.mode == ALLOCATION:
            assert self.allocation_job_id is not None
            jobs = self.commands.jobs([self.allocation_job_id])
            if not jobs:
                raise BackendError(f"Slurm no longer lists allocation {self.allocation_job_id}")
            views = allocation_views(jobs[0], sinfo)
            if self.allowed is not None:
                views = [v for v in views if v.info.name in self.allowed]
        else:
            running = [j for j in self.commands.jobs() if self._holds_resources(j)]
            views = node_views(sinfo, running, self._is_ours, self.partition, self.allowed)
        self._views = {view.info.name: view for view in views}
        return views

    @staticmethod
    def _holds_resources(job: Mapping[str, Any]) -> bool:
        try:
            return job_state(job.get("job_state")).phase in (Phase.RUNNING, Phase.ENDING)
        except UnknownSlurmState:
            return True  # unknown: assume it holds what it lists

    def nodes(self) -> list[NodeInfo]:
        try:
            views = self._read_nodes()
        except SlurmUnavailable as exc:
            self._note_unreachable(exc)
            return [view.info for view in self._views.values()]
        self._note_reachable()
        return [view.info for view in views]

    def _note_unreachable(self, exc: Exception) -> None:
        if self._unreachable_since is None:
            self._unreachable_since = time.monotonic()
            logger.warning("Slurm is unreachable (%s): keeping the last known nodes and "
                           "jobs until it answers again", exc)

    def _note_reachable(self) -> None:
        if self._unreachable_since is not None:
            logger.warning("Slurm answers again after %.0f s",
                           time.monotonic() - self._unreachable_since)
            self._unreachable_since = None

    def validate(self, spec: JobSpec) -> None:
        if spec.resources.gpu != 1:
            raise JobSpecError("resources.gpu", spec.resources.gpu,
                               "the slurm backend gives each replica exactly one GPU; use 1")
        if not Path(spec.working_dir).is_dir():
            raise JobSpecError("working_dir", spec.working_dir,
                               "no such directory (it must exist on every Slurm node)")
        for name, value in spec.env.items():
            if is_slurm_input(name):
                raise JobSpecError(f"env.{name}", value, "Slurm's commands read SBATCH_*, "
                                   "SALLOC_*, SRUN_* and SLURM_* variables as options, so "
                                   "the slurm backend refuses them in a job's env (the "
                                   "server's --slurm-* flags set what a launch asks)")

    # --- launching --------------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> list[LaunchedReplica]:
        previous = self._launches.get(request.job_id)
        if previous is not None and not previous.ended:
            raise BackendError(f"job {request.job_id} still has live replicas")
        missing = [n for n in dict.fromkeys(request.allocation) if n not in self._views]
        if missing:
            self.nodes()
            missing = [n for n in missing if n not in self._views]
            if missing:
                raise BackendError(f"node {missing[0]!r} is not (or no longer) schedulable")
        log_dir = Path(request.log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        addresses = [self._views[node].address for node in request.allocation]
        loopback = all(is_loopback(a) for a in addresses)
        master = addresses[0]
        envs = request.environments(master, free_port("127.0.0.1" if loopback else ""))
        name = launch_name(self.instance_id, request.job_id, request.generation)
        replicas = []
        for env, node in zip(envs, request.allocation):
            status = exit_status_path(log_dir, request.generation, env.rank)
            status.unlink(missing_ok=True)
            replicas.append(SlurmReplica(env.rank, node, step_name(
                self.instance_id, request.job_id, request.generation, env.rank), status))
        shared = job_environment(request, loopback)
        for env in envs:
            write_env_file(env_file(request, env.rank), {**shared, **env.to_env()})
        client = client_environment(self.commands.env)
        commands = [step_command(request, self.instance_id, env.rank, node,
                                 self.allocation_job_id, self.log_budget_bytes)
                    for env, node in zip(envs, request.allocation)]
        if self.mode == CLUSTER:
            slurm_id = self._submit(request, name, client, commands)
        else:
            assert self.allocation_job_id is not None
            self._start_steps(request, client, commands, replicas)
            slurm_id = self.allocation_job_id
        launch = SlurmLaunch(request.job_id, request.generation, name, self.mode, slurm_id,
                             replicas, submitted_at=time.monotonic())
        self._launches[request.job_id] = launch
        return [LaunchedReplica(r.rank, r.node, launch.handle(r, self.instance_id))
                for r in replicas]

    def _submit(self, request: LaunchRequest, name: str, client: Mapping[str, str],
                commands: Sequence[Sequence[str]]) -> str:
        hosts = host_file(request)
        hosts.write_text("".join(f"{node}\n" for node in request.allocation))
        options = batch_options(request, name, self.partition, self.account)
        script = batch_script(request, [(rank, node, command) for rank, (node, command)
                                        in enumerate(zip(request.allocation, commands))])
        (Path(request.log_dir) / f"launch-{request.generation}.sbatch").write_text(script)
        try:
            return self.commands.sbatch(script, {**client, "SLURM_HOSTFILE": str(hosts)},
                                        options)
        except BackendError as exc:
            try:  # a submission that timed out may have been accepted: never run it twice
                self.commands.run(["scancel", f"--name={name}"])
            except BackendError:
                logger.warning("could not make sure %s is not queued", name)
            raise BackendError(f"sbatch failed: {exc}") from exc

    def _start_steps(self, request: LaunchRequest, client: Mapping[str, str],
                     commands: Sequence[Sequence[str]], replicas: list[SlurmReplica]) -> None:
        log_dir = Path(request.log_dir)
        try:
            for replica, command in zip(replicas, commands):
                header = log_header(request, replica.rank, replica.node,
                                    f"Slurm job {self.allocation_job_id}")
                with open(replica_log(log_dir, replica.rank), "a") as log:
                    log.write(header + "\n")
                srun_log = log_dir / f"srun-launch-{request.generation}-r{replica.rank}.out"
                with open(srun_log, "ab") as out:
                    replica.process = subprocess.Popen(
                        list(command), cwd=request.spec.working_dir, env=dict(client),
                        stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                        start_new_session=True)
        except OSError as exc:
            for replica in replicas:
                if replica.process is not None:
                    replica.process.kill()
                    replica.process.wait()
            raise BackendError(f"cannot start srun: {exc}") from exc

    # --- watching ---------------------------------------------------------------------

    def poll(self, job_id: str) -> list[ReplicaStatus]:
        launch = self._launches.get(job_id)
        if launch is None:
            return []
        if launch.mode == ALLOCATION:
            if launch.pending_signal is not None:
                self._signal(launch, launch.pending_signal)
            if not launch.adopted or launch.ended:
                return launch.from_processes()
            try:
                steps = self._watch.steps(launch.slurm_job_id)
            except SlurmUnavailable as exc:
                self._note_unreachable(exc)
                return launch.unknown()
            self._note_reachable()
            return launch.from_steps(steps)
        if launch.ended:
            return launch.unknown()  # every replica's exit is known
        try:
            entries = self._watch.jobs(frozenset(
                other.slurm_job_id for other in self._launches.values()
                if other.mode == CLUSTER and not other.ended))
        except SlurmUnavailable as exc:
            self._note_unreachable(exc)
            return launch.unknown()
        self._note_reachable()
        try:
            statuses = launch.from_job(entries.get(launch.slurm_job_id))
        except UnknownSlurmState as exc:
            if launch.slurm_job_id not in self._reported_states:
                self._reported_states.add(launch.slurm_job_id)
                logger.error("job %s (Slurm job %s): %s", job_id, launch.slurm_job_id, exc)
            return launch.unknown()
        if launch.last_phase is Phase.REQUEUED and not launch.cancelled_requeue:
            logger.warning("Slurm requeued job %s (Slurm job %s, %s): cancelling it; the job "
                           "resumes from its checkpoint in a new launch", job_id,
                           launch.slurm_job_id, launch.state_name)
            try:
                self.commands.cancel(launch.slurm_job_id)
                launch.cancelled_requeue = True
            except BackendError as exc:
                logger.warning("cannot cancel requeued Slurm job %s: %s",
                               launch.slurm_job_id, exc)
        if launch.pending_signal is not None and not launch.ended:
            self._signal(launch, launch.pending_signal)
        elif (launch.last_phase is Phase.WAITING and not launch.withdrawn
              and time.monotonic() - launch.submitted_at > self.pending_timeout_s):
            logger.warning("job %s: Slurm job %s still waits for its nodes after %.0f s "
                           "(%s); withdrawing it so that the job is placed again", job_id,
                           launch.slurm_job_id, self.pending_timeout_s, launch.state_name)
            try:
                self.commands.cancel(launch.slurm_job_id)  # Slurm then says CANCELLED
                launch.withdrawn = True
                self._watch.forget()
            except BackendError as exc:
                logger.warning("cannot withdraw Slurm job %s: %s", launch.slurm_job_id, exc)
        return statuses

    # --- stopping ---------------------------------------------------------------------

    def stop(self, job_id: str, force: bool = False) -> None:
        launch = self._launches.get(job_id)
        if launch is None or launch.ended:
            return
        self._signal(launch, "KILL" if force else "TERM")

    def _signal(self, launch: SlurmLaunch, signal_name: str) -> None:
        if launch.mode == CLUSTER:
            if signal_cluster(self.commands, launch, signal_name):
                self._watch.forget()
        else:
            signal_steps(self.commands, launch, signal_name)

    def release(self, job_id: str) -> None:
        launch = self._launches.get(job_id)
        if launch is not None and launch.ended:
            del self._launches[job_id]

    def recover(self, handles: Sequence[Mapping[str, Any]], grace_s: float) -> list[str]:
        """Find the work of a previous server on this data directory (by name, and by the
        recorded Slurm job ids), ask it to checkpoint and stop, cancel what is left after
        ``grace_s``. Each replica's exit status stays in its status file."""
        prefix = work_prefix(self.instance_id)
        keep = [launch for launch in self._launches.values() if launch.adopted]
        if self.mode == ALLOCATION:
            assert self.allocation_job_id is not None
            return recover_allocation(self.commands, self.allocation_job_id, prefix, grace_s,
                                      keep={r.step for launch in keep for r in launch.replicas})
        ids = {str(h["slurm_job_id"]) for h in handles
               if h.get("backend") == self.name and h.get("instance") == self.instance_id
               and h.get("slurm_job_id") is not None}
        return recover_cluster(self.commands, prefix, ids, grace_s,
                               keep={launch.slurm_job_id for launch in keep})

    def adopt(self, replicas: Sequence[LiveReplica]) -> set[str]:
        """The previous server's launches whose Slurm jobs (cluster mode) or steps
        (allocation mode) all still run are watched as this process's own (see
        :func:`adoptable`)."""
        adopted = adoptable(self.commands, self.instance_id, replicas,
                            self.allocation_job_id)
        for launch in adopted:
            self._launches[launch.job_id] = launch
            logger.info("job %s: adopted launch %d (Slurm job %s) of the previous server",
                        launch.job_id, launch.generation, launch.slurm_job_id)
        self._watch.forget()
        return {launch.job_id for launch in adopted}

    def close(self) -> None:
        for launch in self._launches.values():
            for replica in launch.replicas:
                if replica.process is not None:
                    replica.process.poll()

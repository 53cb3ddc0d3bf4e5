"""Local backend: each replica is a local process in its own process group.

One machine can act as ``num_nodes`` virtual nodes of ``slots_per_node`` slots each, so
multi-node placement is exercised, or as typed virtual nodes declared with a cluster spec
(``virtual_nodes="aws:2x2,rtx:1x4"``), so heterogeneous placement is too. A slot is a GPU (``CUDA_VISIBLE_DEVICES`` set to that
one device) when the machine has GPUs, else a CPU slot (``CUDA_VISIBLE_DEVICES`` empty,
``OMP_NUM_THREADS`` set to the replica's cpu count unless the job sets it). Each replica
appends its output to ``<log_dir>/replica-<rank>.log``, within its log budget
(:mod:`pollux.backends.replica_log`: the newest output kept, never the disk's reserve
for the job store). Each replica runs under the exit-status wrapper
(:mod:`pollux.backends.exit_status`), which records how it ended beside the log, so a
restarted server knows what finished while it was down; while the wrapper cannot write
that record (a full disk) the replica is UNKNOWN, never failed.

A graceful stop sends SIGTERM to each replica's first process (the wrapper passes it on;
the agent checkpoints and exits 75; wrapper scripts should ``exec`` the trainer); a forced stop, and the exit
of a replica's first process, SIGKILL its whole process tree: the wrapper is the
subreaper of what the command leaves behind (:mod:`pollux.backends.supervisor`), and
every process of a replica carries ``POLLUX_LOCAL_REPLICA`` (a token of its own), so
one started with ``setsid`` is found and killed too. Every replica carries
``POLLUX_LOCAL_BACKEND_ID`` in its environment, so a restarted server finds the
replicas of a dead predecessor even if it died before recording them.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pollux.backends.base import (
    Backend,
    LaunchedReplica,
    LaunchRequest,
    ReplicaState,
    ReplicaStatus,
)
from pollux.backends.exit_status import (
    check_fallback_dir,
    exit_status_path,
    fallback_dir,
    status_pending,
    wrapped_command,
)
from pollux.backends.processes import (
    is_alive,
    kill_group_but,
    kill_marked,
    marked_processes,
    process_start_ticks,
    signal_group,
)
from pollux.backends.replica_log import DEFAULT_LOG_BUDGET_BYTES, check_log_budget
from pollux.cluster_spec import parse_cluster_spec
from pollux.data_dir import replica_log
from pollux.errors import BackendError, ConfigError, JobSpecError
from pollux.job_spec import JobSpec
from pollux.jobenv import INHERITED_LAUNCH_PREFIXES
from pollux.resources import DEFAULT_GPU_TYPE, NodeInfo

logger = logging.getLogger(__name__)

MARKER_ENV = "POLLUX_LOCAL_BACKEND_ID"
"""Set on every replica to the backend's instance id (one per data directory)."""
SESSION_ENV = "POLLUX_LOCAL_BACKEND_SESSION"
"""Set on every replica to a token of the backend object that launched it, so that a
recovery running alongside new launches stops only the replicas of earlier servers."""
REPLICA_ENV = "POLLUX_LOCAL_REPLICA"
"""Set on every replica to a random token of its own: every process of the replica,
one that left its process group and session included, is found by it and ended."""
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
LOOPBACK_INTERFACE = "lo"
GLOO_INTERFACE_ENV = "GLOO_SOCKET_IFNAME"
"""Set to the loopback interface (unless the job or the server's environment sets it):
the replicas of a local job talk to each other on this machine only, so gloo's sockets
need not listen on the network (its rendezvous store listens on 127.0.0.1 already)."""
FORCE_WAIT_S = 3.0
"""How long a forced stop leaves a replica's wrapper to end what escaped its process
group before the whole group, wrapper included, is SIGKILLed."""
KILL_WAIT_S = 10.0
"""How long recovery waits for SIGKILLed processes to disappear."""


def detect_gpus(timeout_s: float = 10.0) -> list[str]:
    """Visible GPU ids: ``CUDA_VISIBLE_DEVICES`` when set, else ``nvidia-smi``'s list."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip() and d.strip() != "-1"]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=timeout_s, check=True)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def total_memory_bytes() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0.0


@dataclass
class _Replica:
    rank: int
    node: str
    slots: tuple[int, ...]
    process: subprocess.Popen[bytes]
    status_path: Path
    token: str = ""
    """The replica's :data:`REPLICA_ENV` value."""
    forced_at: float | None = None
    """``time.monotonic()`` of a forced stop (the wrapper then ends the tree)."""
    exit_code: int | None = None


class LocalBackend(Backend):
    """Replicas as local processes on virtual nodes of GPU or CPU slots."""

    name = "local"
    recovers_alongside_launches = True

    def __init__(self, instance_id: str, num_nodes: int = 1, slots_per_node: int | None = None,
                 device: str = "auto", gpu_ids: Sequence[str] | None = None,
                 master_addr: str = "127.0.0.1", virtual_nodes: str | None = None,
                 log_budget_bytes: int = DEFAULT_LOG_BUDGET_BYTES) -> None:
        """``num_nodes`` virtual nodes of ``slots_per_node`` slots each, or the typed
        virtual nodes of ``virtual_nodes``, a cluster spec such as ``aws:2x2,rtx:1x4``
        (:mod:`pollux.cluster_spec`: two ``aws`` nodes of 2 slots, one ``rtx`` node of
        4), named ``<type>-<i>``. ``log_budget_bytes``: each replica's log budget."""
        try:
            check_log_budget(log_budget_bytes)
        except ValueError as exc:
            raise ConfigError("log_budget", log_budget_bytes, str(exc)) from None
        self.log_budget_bytes = log_budget_bytes
        self.fallback_dir = fallback_dir()
        problem = check_fallback_dir(self.fallback_dir)
        if problem is not None:
            raise ConfigError("exit status fallback dir", str(self.fallback_dir),
                              f"{problem}: it keeps replicas' exit statuses when the disk "
                              "is full; remove it, or set XDG_RUNTIME_DIR to a private "
                              "(0700) directory of yours")
        if device not in ("auto", "gpu", "cpu"):
            raise ConfigError("device", device, "choose auto, gpu or cpu")
        if num_nodes < 1:
            raise ConfigError("nodes", num_nodes, "must be >= 1")
        if virtual_nodes is not None and (num_nodes != 1 or slots_per_node is not None):
            raise ConfigError("virtual_nodes", virtual_nodes,
                              "give either --virtual-nodes or --nodes/--slots-per-node")
        gpus = list(detect_gpus() if gpu_ids is None else gpu_ids) if device != "cpu" else []
        if device == "gpu" and not gpus:
            raise ConfigError("device", device, "no GPU is visible; use --device cpu")
        self.instance_id = instance_id
        self.session = os.urandom(8).hex()
        self.master_addr = master_addr
        self.use_gpus = bool(gpus)
        cpus = os.cpu_count() or 1
        if virtual_nodes is not None:
            cluster = parse_cluster_spec(virtual_nodes, field="virtual_nodes")
            layout = [(n.name, n.num_gpus, n.gpu_type) for n in cluster.node_infos()]
        else:
            if slots_per_node is None:
                slots_per_node = max(1, (len(gpus) if gpus else cpus) // num_nodes)
            if slots_per_node < 1:
                raise ConfigError("slots_per_node", slots_per_node, "must be >= 1")
            layout = [(f"node-{i}", slots_per_node, DEFAULT_GPU_TYPE) for i in range(num_nodes)]
        num_slots = sum(slots for _, slots, _ in layout)
        if gpus and num_slots > len(gpus):
            raise ConfigError("virtual_nodes" if virtual_nodes is not None else "slots_per_node",
                              virtual_nodes or slots_per_node,
                              f"{len(layout)} nodes with {num_slots} slots in all need "
                              f"{num_slots} GPUs; {len(gpus)} are visible")
        self.node_names = [name for name, _, _ in layout]
        self._slots = {name: slots for name, slots, _ in layout}
        self._gpu_types = {name: gpu_type for name, _, gpu_type in layout}
        self.slots_per_node = max(self._slots.values())
        """The most slots of any node (a replica asks for at most this many)."""
        self._devices: dict[str, list[str]] = {}
        first = 0
        for name, slots, _ in layout:
            self._devices[name] = gpus[first:first + slots] if gpus else []
            first += slots
        num_nodes = len(layout)
        self._cpus_per_node = {name: float(max(slots, cpus // num_nodes))
                               for name, slots, _ in layout}
        self._memory_per_node = total_memory_bytes() / num_nodes
        self._used_slots: dict[str, set[int]] = {name: set() for name in self.node_names}
        self._jobs: dict[str, list[_Replica]] = {}

    def nodes(self) -> list[NodeInfo]:
        return [NodeInfo(name, {"gpu": float(self._slots[name]),
                                "cpu": self._cpus_per_node[name],
                                "memory": self._memory_per_node},
                         gpu_type=self._gpu_types[name])
                for name in self.node_names]

    def validate(self, spec: JobSpec) -> None:
        if not Path(spec.working_dir).is_dir():
            raise JobSpecError("working_dir", spec.working_dir,
                               "no such directory on the server's machine")
        program = spec.command[0]
        path = spec.env.get("PATH", os.environ.get("PATH", ""))
        if "/" in program:
            resolved = Path(spec.working_dir, program)
            if not (resolved.is_file() and os.access(resolved, os.X_OK)):
                raise JobSpecError("command", program, "no such executable file")
        elif shutil.which(program, path=path) is None:
            raise JobSpecError("command", program, "program not found on the server's PATH")
        gpu = spec.resources.gpu
        if gpu != int(gpu) or gpu > self.slots_per_node:
            raise JobSpecError("resources.gpu", gpu, "the local backend gives whole slots, "
                                                     f"at most {self.slots_per_node} per replica")

    # --- launching --------------------------------------------------------------------

    def _take_slots(self, node: str, count: int) -> tuple[int, ...]:
        free = [s for s in range(self._slots[node]) if s not in self._used_slots[node]]
        if len(free) < count:
            raise BackendError(f"node {node} has {len(free)} free slots; {count} needed")
        self._used_slots[node].update(free[:count])
        return tuple(free[:count])

    def _free_slots(self, replica: _Replica) -> None:
        self._used_slots[replica.node].difference_update(replica.slots)

    def _replica_env(self, request: LaunchRequest, agent_env: Mapping[str, str],
                     slots: tuple[int, ...], node: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(INHERITED_LAUNCH_PREFIXES)}
        env.update(request.spec.env)
        env.update(agent_env)
        env[MARKER_ENV] = self.instance_id
        env[SESSION_ENV] = self.session
        env[REPLICA_ENV] = os.urandom(12).hex()
        if self.use_gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self._devices[node][s] for s in slots)
        else:
            env["CUDA_VISIBLE_DEVICES"] = ""
        threads = str(max(1, int(request.spec.resources.cpu)))
        for name in THREAD_ENV_VARS:
            if name not in request.spec.env:
                env[name] = threads
        if GLOO_INTERFACE_ENV not in env and Path("/sys/class/net", LOOPBACK_INTERFACE).exists():
            env[GLOO_INTERFACE_ENV] = LOOPBACK_INTERFACE
        return env

    def launch(self, request: LaunchRequest) -> list[LaunchedReplica]:
        if any(r.exit_code is None for r in self._jobs.get(request.job_id, [])):
            raise BackendError(f"job {request.job_id} still has live replicas")
        for node in request.allocation:
            if node not in self._used_slots:
                raise BackendError(f"unknown node {node!r}")
        if not Path(request.spec.working_dir).is_dir():
            raise BackendError(f"working directory {request.spec.working_dir} does not exist")
        log_dir = Path(request.log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        slots_per_replica = int(request.spec.resources.gpu)
        started: list[_Replica] = []
        try:
            envs = request.environments(self.master_addr, free_port(self.master_addr))
            for env, node in zip(envs, request.allocation):
                slots = self._take_slots(node, slots_per_replica)
                started.append(self._start(request, env.to_env(), env.rank, node, slots,
                                           replica_log(log_dir, env.rank)))
        except (OSError, BackendError) as exc:
            for replica in started:
                signal_group(replica.process.pid, signal.SIGKILL)
                replica.process.wait()
                self._free_slots(replica)
            raise BackendError(f"cannot start {request.spec.command[0]!r}: {exc}") from exc
        self._jobs[request.job_id] = started
        return [LaunchedReplica(r.rank, r.node, {
            "backend": self.name, "instance": self.instance_id, "pid": r.process.pid,
            "pgid": r.process.pid, "start_ticks": process_start_ticks(r.process.pid),
            "slots": list(r.slots)}) for r in started]

    def _start(self, request: LaunchRequest, agent_env: Mapping[str, str], rank: int,
               node: str, slots: tuple[int, ...], log_path: Path) -> _Replica:
        env = self._replica_env(request, agent_env, slots, node)
        header = (f"=== pollux {time.strftime('%Y-%m-%d %H:%M:%S')}: launch "
                  f"{request.generation}, rank {rank} of {len(request.allocation)} on {node} "
                  f"(slots {list(slots)}) ===\n")
        try:
            descriptor = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT
                                 | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with open(descriptor, "ab", buffering=0) as log:
                try:
                    log.write(header.encode())
                except OSError:  # a full disk: the header is not worth a failed launch
                    pass
                status_path = exit_status_path(log_path.parent, request.generation, rank)
                status_path.unlink(missing_ok=True)
                process = subprocess.Popen(
                    wrapped_command(status_path, list(request.spec.command), log=log_path,
                                    log_budget_bytes=self.log_budget_bytes,
                                    fallback=self.fallback_dir),
                    cwd=request.spec.working_dir, env=env,
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True)
        except OSError:
            self._used_slots[node].difference_update(slots)
            raise
        return _Replica(rank, node, slots, process, status_path, env[REPLICA_ENV])

    # --- watching and stopping --------------------------------------------------------

    def poll(self, job_id: str) -> list[ReplicaStatus]:
        statuses = []
        for replica in self._jobs.get(job_id, []):
            if replica.exit_code is None:
                code = replica.process.poll()
                if code is not None:
                    replica.exit_code = code
                    signal_group(replica.process.pid, signal.SIGKILL)  # stragglers
                    kill_marked(REPLICA_ENV, replica.token)  # and what left the group
                    self._free_slots(replica)
            if (replica.exit_code is None and replica.forced_at is not None
                    and time.monotonic() - replica.forced_at > FORCE_WAIT_S):
                signal_group(replica.process.pid, signal.SIGKILL)  # the wrapper is stuck
            if replica.exit_code is not None:
                state = ReplicaState.EXITED
            elif status_pending(replica.status_path):
                state = ReplicaState.UNKNOWN  # ended; its wrapper cannot record how yet
            else:
                state = ReplicaState.RUNNING
            statuses.append(ReplicaStatus(replica.rank, state, replica.exit_code))
        return statuses

    def stop(self, job_id: str, force: bool = False) -> None:
        for replica in self._jobs.get(job_id, []):
            if replica.exit_code is not None:
                continue
            if force:  # all but the wrapper: it ends what escaped, then exits -9
                replica.forced_at = replica.forced_at or time.monotonic()
                kill_group_but(replica.process.pid, replica.process.pid)
                kill_marked(REPLICA_ENV, replica.token, spared=replica.process.pid)
            else:
                try:
                    replica.process.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass

    def release(self, job_id: str) -> None:
        replicas = self._jobs.get(job_id, [])
        if all(r.exit_code is not None for r in replicas):
            self._jobs.pop(job_id, None)

    def recover(self, handles: Sequence[Mapping[str, Any]], grace_s: float) -> list[str]:
        leaders: dict[int, int | None] = {}
        for handle in handles:
            pid = handle.get("pid")
            if handle.get("instance") != self.instance_id or not isinstance(pid, int):
                continue
            if is_alive(pid) and process_start_ticks(pid) == handle.get("start_ticks"):
                leaders[pid] = process_start_ticks(pid)
        marked_pids = marked_processes(MARKER_ENV, self.instance_id)
        ours = set(marked_processes(SESSION_ENV, self.session))  # launched by this server
        marked = {pid: process_start_ticks(pid) for pid in marked_pids if pid not in ours}
        targets = {**marked, **leaders}
        if not targets:
            return []
        first_processes = []
        for pid in targets:
            try:
                if os.getpgid(pid) == pid:  # a replica's first process: let it checkpoint
                    first_processes.append(pid)
                    os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(
                is_alive(pid) and process_start_ticks(pid) == ticks
                for pid, ticks in targets.items()):
            time.sleep(0.1)
        survivors = {pid: ticks for pid, ticks in targets.items()
                     if is_alive(pid) and process_start_ticks(pid) == ticks}
        for pid in survivors:
            signal_group(pid, signal.SIGKILL)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + KILL_WAIT_S
        while time.monotonic() < deadline and any(
                is_alive(pid) and process_start_ticks(pid) == ticks
                for pid, ticks in survivors.items()):
            time.sleep(0.05)
        return [f"pid {pid}" for pid in sorted(first_processes or targets)]

    def close(self) -> None:
        for job_id in list(self._jobs):
            self.poll(job_id)

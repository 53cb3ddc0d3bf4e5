"""A real Slurm on this machine, for tests and benches: munged, slurmctld and several
slurmd (``slurmd -N nX``), every file (configuration, spool, logs, pid files, munge
socket) in one directory, on ports found free at start, stopped by the PIDs their pid
files name.

The nodes are virtual: ``NodeHostname=localhost``, one slurmd per node on its own port,
each with fake typed GPUs (gres.conf ``File=`` symlinks to /dev/null). Finished jobs stay
visible to ``squeue`` for ``MinJobAge`` seconds (there is no accounting database).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

SLURM_BINARIES = ("slurmctld", "slurmd", "munged", "sbatch", "srun", "squeue", "sinfo",
                  "scancel", "scontrol")
MUNGE_USER = "munge"
MUNGE_KEY = Path("/etc/munge/munge.key")
DEFAULT_NODES: tuple[tuple[str, str, int], ...] = (
    ("n1", "t4", 2), ("n2", "t4", 2), ("n3", "a100", 2), ("n4", "a100", 2))
"""(name, GPU type, GPUs) of the virtual nodes."""
CPUS_PER_NODE = 8
URGENT_PARTITION = "urgent"
"""A partition over the same nodes whose jobs preempt the default partition's."""
START_TIMEOUT_S = 30.0
COMPLETING_GRACE_S = 3.0
"""How long :meth:`SlurmCluster.reset` lets cancelled jobs complete before forcing it."""
STOP_TIMEOUT_S = 3.0
"""How long :meth:`SlurmCluster.stop` waits for the daemons to exit on SIGTERM."""


def missing_binaries() -> list[str]:
    """The Slurm/munge programs this machine lacks (install: apt-get install
    --no-install-recommends slurm-wlm munge)."""
    return [name for name in SLURM_BINARIES if shutil.which(name) is None]


def why_unavailable() -> str | None:
    """None when a Slurm can be started here, else why not (for a test's skip)."""
    missing = missing_binaries()
    if missing:
        return (f"Slurm is not installed (missing {', '.join(missing)}): apt-get install "
                "--no-install-recommends slurm-wlm munge")
    if os.geteuid() != 0:
        return "starting slurmd needs root"
    if not MUNGE_KEY.exists():
        return f"no munge key at {MUNGE_KEY}"
    return None


def free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def daemon_alive(pid_file: Path) -> bool:
    pid = read_pid(pid_file)
    return pid is not None and pid > 0 and pid_alive(pid)


@dataclass
class SlurmCluster:
    """One Slurm instance rooted at ``root`` (start it with :meth:`start`)."""

    root: Path
    nodes: Sequence[tuple[str, str, int]] = DEFAULT_NODES
    partition: str = "pollux"
    min_job_age_s: int = 300
    extra_conf: Sequence[str] = ()
    ctld_port: int = 0
    node_ports: dict[str, int] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """The environment a Slurm client needs to reach this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def node_pid_file(self, node: str) -> Path:
        return self.root / f"slurmd.{node}.pid"

    # --- configuration ----------------------------------------------------------------

    def _write_conf(self) -> None:
        ports = free_ports(1 + len(self.nodes))
        self.ctld_port = ports[0]
        self.node_ports = {name: port for (name, _, _), port in zip(self.nodes, ports[1:])}
        root = self.root
        lines = [
            "ClusterName=pollux-test", "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}", "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge",
            f"AuthInfo=socket={root / 'munge' / 'munge.socket'}",
            f"StateSaveLocation={root / 'ctld'}",
            f"SlurmdSpoolDir={root / 'spool'}/%n",
            f"SlurmctldPidFile={root / 'slurmctld.pid'}",
            f"SlurmdPidFile={root}/slurmd.%n.pid",
            f"SlurmctldLogFile={root / 'slurmctld.log'}",
            f"SlurmdLogFile={root}/slurmd.%n.log",
            "SlurmctldDebug=info", "SlurmdDebug=info",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none",
            "MpiDefault=none", "SwitchType=switch/none", "GresTypes=gpu",
            "SlurmdParameters=config_overrides", "ReturnToService=1",
            f"MinJobAge={self.min_job_age_s}", "KillWait=5", "InactiveLimit=0",
            "SlurmdTimeout=30", "SchedulerType=sched/backfill",
            "SchedulerParameters=batch_sched_delay=0,sched_min_interval=0",
            "MessageTimeout=5",
            # jobs of the `urgent` partition preempt those of the default one
            "PreemptType=preempt/partition_prio", "PreemptMode=REQUEUE",
        ]
        lines.extend(self.extra_conf)
        for name, gpu_type, gpus in self.nodes:
            lines.append(f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 "
                         f"Port={self.node_ports[name]} CPUs={CPUS_PER_NODE} RealMemory=1000 "
                         f"Gres=gpu:{gpu_type}:{gpus} State=UNKNOWN")
        names = ",".join(name for name, _, _ in self.nodes)
        lines.append(f"PartitionName={self.partition} Nodes={names} Default=YES "
                     "MaxTime=INFINITE State=UP OverSubscribe=NO")
        lines.append(f"PartitionName={URGENT_PARTITION} Nodes={names} PriorityTier=10 "
                     "PreemptMode=OFF MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")
        devices = root / "dev"
        devices.mkdir(exist_ok=True)
        gres = ["AutoDetect=off"]
        for name, gpu_type, gpus in self.nodes:
            for index in range(gpus):
                device = devices / f"{name}-gpu{index}"
                if not device.exists():
                    device.symlink_to("/dev/null")
            files = f"{devices}/{name}-gpu[0-{gpus - 1}]" if gpus > 1 else f"{devices}/{name}-gpu0"
            gres.append(f"NodeName={name} Name=gpu Type={gpu_type} File={files}")
        (root / "gres.conf").write_text("\n".join(gres) + "\n")

    # --- daemons ----------------------------------------------------------------------

    def _start_munge(self) -> None:
        """munged as user munge; where that user cannot run it (e.g. ``/`` not
        traversable by other users), as root with ``--force``."""
        directory = self.root / "munge"
        directory.mkdir(exist_ok=True)
        directory.chmod(0o755)
        shutil.chown(directory, MUNGE_USER, MUNGE_USER)
        options = [f"--socket={directory / 'munge.socket'}",
                   f"--pid-file={directory / 'munged.pid'}",
                   f"--log-file={directory / 'munged.log'}",
                   f"--seed-file={directory / 'munged.seed'}", f"--key-file={MUNGE_KEY}"]
        as_munge = subprocess.run(
            ["setpriv", f"--reuid={MUNGE_USER}", f"--regid={MUNGE_USER}", "--init-groups",
             "munged", *options], capture_output=True, text=True, timeout=20, check=False)
        if as_munge.returncode != 0:
            subprocess.run(["munged", "--force", *options], check=True, capture_output=True,
                           timeout=20)

    def start(self) -> SlurmCluster:
        """Write the configuration, start every daemon, wait until all nodes are idle."""
        self.root.mkdir(parents=True, exist_ok=True)
        for sub in ("ctld", "spool"):
            (self.root / sub).mkdir(exist_ok=True)
        self._write_conf()
        try:
            self._start_munge()
            self.start_controller()
            for name, _, _ in self.nodes:
                self.start_node(name)
            self.wait_idle([name for name, _, _ in self.nodes])
        except BaseException:
            self.stop()
            raise
        return self

    def start_controller(self) -> None:
        subprocess.run(["slurmctld", "-f", str(self.conf), "-i"], check=True,
                       capture_output=True, env=self.env, timeout=30)

    def start_node(self, node: str) -> None:
        (self.root / "spool" / node).mkdir(parents=True, exist_ok=True)
        subprocess.run(["slurmd", "-f", str(self.conf), "-N", node], check=True,
                       capture_output=True, env=self.env, timeout=30)

    def scontrol(self, *args: str) -> str:
        out = subprocess.run(["scontrol", *args], check=True, capture_output=True, text=True,
                             env=self.env, timeout=30)
        return out.stdout

    def node_states(self) -> dict[str, str]:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True,
                             text=True, env=self.env, timeout=30)
        states = {}
        for line in out.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2:
                states[parts[0]] = parts[1]
        return states

    def wait_idle(self, nodes: Sequence[str], timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        states: Mapping[str, str] = {}
        while time.monotonic() < deadline:
            states = self.node_states()
            if all(states.get(n, "").rstrip("*") in ("idle", "mixed", "allocated")
                   for n in nodes):
                return
            time.sleep(0.2)
        raise RuntimeError(f"Slurm nodes not idle after {timeout_s:.0f} s: {states}; "
                           f"see the logs in {self.root}")

    def stop_pid_file(self, path: Path, sig: int = signal.SIGTERM,
                      timeout_s: float = 10.0) -> None:
        pid = read_pid(path)
        if pid is None or not pid_alive(pid):
            return
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and pid_alive(pid):
            time.sleep(0.05)
        if pid_alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def stop_pid_files(self, paths: Sequence[Path], timeout_s: float = 10.0) -> None:
        """:meth:`stop_pid_file` for several daemons at once: SIGTERM to all, then one
        shared wait, then SIGKILL to those still alive."""
        pids = [pid for pid in map(read_pid, paths) if pid is not None and pid_alive(pid)]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(map(pid_alive, pids)):
            time.sleep(0.05)
        for pid in filter(pid_alive, pids):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def kill_node(self, node: str) -> None:
        """SIGKILL one slurmd (its node goes NOT_RESPONDING, then DOWN)."""
        self.stop_pid_file(self.node_pid_file(node), signal.SIGKILL)

    def stop_controller(self) -> None:
        self.stop_pid_file(self.root / "slurmctld.pid")

    def live_jobs(self) -> list[str]:
        out = subprocess.run(["squeue", "-h", "-o", "%i %T"], capture_output=True, text=True,
                             env=self.env, timeout=30)
        return [line.split()[0] for line in out.stdout.splitlines()
                if line.split() and line.split()[-1] not in ("COMPLETED", "CANCELLED",
                                                             "FAILED", "NODE_FAIL",
                                                             "TIMEOUT", "PREEMPTED")]

    def cancel_all(self) -> None:
        """Kill every job of every partition (steps and batch shells), and cancel it."""
        for partition in (self.partition, URGENT_PARTITION):
            for args in (["--full", "--signal=KILL"], []):
                subprocess.run(["scancel", *args, f"--partition={partition}"],
                               capture_output=True, env=self.env, timeout=15, check=False)

    def reset(self, timeout_s: float = 30.0) -> None:
        """After a test: every daemon up, every node in service, no job left."""
        if not daemon_alive(self.root / "slurmctld.pid"):
            self.start_controller()
        for name, _, _ in self.nodes:
            if not daemon_alive(self.node_pid_file(name)):
                self.start_node(name)
        self.cancel_all()
        deadline = time.monotonic() + timeout_s
        kick_at = time.monotonic() + COMPLETING_GRACE_S
        while self.live_jobs() and time.monotonic() < deadline:
            if time.monotonic() > kick_at:
                self._kick_completing()
                kick_at = deadline
            time.sleep(0.2)
        names = [name for name, _, _ in self.nodes]
        states = self.node_states()
        stuck = [n for n in names if states.get(n, "").rstrip("*~#!%$@^-") not in ("idle",)]
        if stuck:
            subprocess.run(["scontrol", "update", f"nodename={','.join(stuck)}",
                            "state=resume"], capture_output=True, env=self.env, timeout=15,
                           check=False)
        self.wait_idle(names, timeout_s)

    def _kick_completing(self) -> None:
        """Take the nodes of jobs still COMPLETING after a cancel DOWN and back: Slurm then
        drops the jobs at once (left alone, after a controller restart, one stayed
        COMPLETING for 40 s)."""
        out = subprocess.run(["squeue", "-h", "-t", "CG", "-o", "%N"], capture_output=True,
                             text=True, env=self.env, timeout=30)
        nodes = sorted({node for line in out.stdout.split() for node in
                        self.scontrol("show", "hostnames", line).split()})
        if nodes:
            for state in (["state=down", "reason=pollux-test-reset"], ["state=resume"]):
                subprocess.run(["scontrol", "update", f"nodename={','.join(nodes)}", *state],
                               capture_output=True, env=self.env, timeout=15, check=False)

    def stop(self) -> None:
        """Cancel every job, stop every daemon by its pid file (idempotent)."""
        if read_pid(self.root / "slurmctld.pid") is not None:
            self.cancel_all()
        # every slurmd and the controller at once, SIGKILL after 3 s (one by one, each
        # could take its 10 s: the session's end took 10.8 s); nothing of them is kept
        self.stop_pid_files([*(self.node_pid_file(name) for name, _, _ in self.nodes),
                             self.root / "slurmctld.pid"], timeout_s=STOP_TIMEOUT_S)
        self.stop_pid_file(self.root / "munge" / "munged.pid", timeout_s=STOP_TIMEOUT_S)
        for stepd in self._stepd_pids():
            try:
                os.kill(stepd, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _stepd_pids(self) -> list[int]:
        """slurmstepd processes of this cluster that outlived their slurmd."""
        found = []
        marker = str(self.conf).encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if (entry / "comm").read_text().strip() != "slurmstepd":
                    continue
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            if marker in environ:
                found.append(int(entry.name))
        return found

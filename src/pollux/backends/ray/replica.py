"""One replica on a Ray node: the body of the actor that runs the user's command.

The Ray backend creates one :class:`ReplicaProcess` actor per replica, inside that
replica's placement-group bundle, so the actor holds the bundle's resources (and, for
GPU slots, Ray sets ``CUDA_VISIBLE_DEVICES`` in it). The actor starts the training
command as a subprocess in its own process group, copies its output from a pipe into the
replica's bounded log (:class:`~pollux.backends.replica_log.BoundedLog`: within the
server's ``--log-budget``, above the disk reserve, as the local and Slurm backends), and
answers :meth:`wait` with the exit status.

If the actor dies (its node is lost, the server that owns it exits, ``ray.kill``), a
small detached watchdog process kills the replica's process group, so no replica
outlives its actor and trains on beside its own relaunch. The watchdog reads a pipe
whose write end only the actor holds: a byte means the replica ended normally,
end-of-file means the actor is gone.

Nothing here imports Ray at module level: the class is plain Python (the backend turns
it into an actor), so it can be tested on its own.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence

from pollux.backends.replica_log import DEFAULT_LOG_BUDGET_BYTES, BoundedLog
from pollux.jobenv import INHERITED_LAUNCH_PREFIXES

CANNOT_START_EXIT_CODE = 127
"""Reported when the command cannot be started (no such program or directory)."""
WATCHDOG_CODE = (
    "import os, signal, sys\n"
    "if os.fork():\n"
    "    os._exit(0)\n"
    "if not os.read(0, 1):\n"
    "    try:\n"
    "        os.killpg(int(sys.argv[1]), signal.SIGKILL)\n"
    "    except OSError:\n"
    "        pass\n"
)
"""The watchdog: detach (so it is no child of the actor: Ray kills an exiting worker's
children, which would take the watchdog along with the replica's first process but not
the rest of its group), wait on stdin, and on end-of-file (the actor died) kill the
replica's process group."""
READ_BYTES = 1 << 16
PUMP_JOIN_S = 5.0
"""How long :meth:`ReplicaProcess.wait` waits for the last output once the replica's
process group is gone (the pipe then has no writer left)."""


def replica_environment(base: Mapping[str, str], overlay: Mapping[str, str]) -> dict[str, str]:
    """The node's environment without stale launch variables (Pollux's and AdaptDL's),
    then the job's variables."""
    env = {k: v for k, v in base.items() if not k.startswith(INHERITED_LAUNCH_PREFIXES)}
    env.update(overlay)
    return env


class ReplicaProcess:
    """Starts, signals and waits for one replica's process (methods may run in
    parallel threads: the actor is created with ``max_concurrency`` > 1)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started = threading.Event()
        self._process: subprocess.Popen[bytes] | None = None
        self._watchdog_pipe: int | None = None
        self._exit_code: int | None = None
        self._stopped_before_start: int | None = None
        self._log: BoundedLog | None = None
        self._pump: threading.Thread | None = None

    def node_address(self) -> str:
        """This node's address as Ray knows it (the master address when rank 0)."""
        import ray

        return str(ray.util.get_node_ip_address())

    def address_and_port(self) -> tuple[str, int]:
        """This node's address and a port free on it now (for torch.distributed)."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", 0))
            port = int(sock.getsockname()[1])
        return self.node_address(), port

    def start(self, command: Sequence[str], working_dir: str, env: Mapping[str, str],
              log_path: str, header: str,
              log_budget_bytes: int = DEFAULT_LOG_BUDGET_BYTES) -> int | None:
        """Start the command, its output into the bounded log at ``log_path``; returns
        its pid, or None when it was not started (a stop arrived first, or it cannot be
        started: the reason is in the log)."""
        with self._lock:
            try:
                if self._stopped_before_start is not None or self._process is not None:
                    if self._exit_code is None:
                        self._exit_code = self._stopped_before_start
                    return None
                os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
                log = self._log = BoundedLog(log_path, log_budget_bytes)
                log.write(header.encode())
                try:
                    process = self._process = subprocess.Popen(
                        list(command), cwd=working_dir,
                        env=replica_environment(os.environ, env),
                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, start_new_session=True)
                except OSError as exc:
                    log.say(f"pollux: cannot start {command[0]!r} in {working_dir}: {exc}")
                    log.close()
                    self._log = None
                    self._exit_code = CANNOT_START_EXIT_CODE
                    return None
                self._pump = threading.Thread(target=self._copy_output, args=(process, log),
                                              name="replica-log", daemon=True)
                self._pump.start()
                self._start_watchdog(process.pid)
                return process.pid
            finally:
                self._started.set()

    @staticmethod
    def _copy_output(process: subprocess.Popen[bytes], log: BoundedLog) -> None:
        """Copy the replica's output into its log until every writer of the pipe is
        gone."""
        assert process.stdout is not None
        pipe = process.stdout.fileno()
        while True:
            try:
                data = os.read(pipe, READ_BYTES)
            except OSError:
                return
            if not data:
                return
            log.write(data)

    def _start_watchdog(self, pgid: int) -> None:
        read_end, write_end = os.pipe()
        try:
            launcher = subprocess.Popen(
                [sys.executable, "-c", WATCHDOG_CODE, str(pgid)], stdin=read_end,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            launcher.wait()  # it forks the watchdog and exits at once
        except OSError:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        self._watchdog_pipe = write_end  # not inheritable: only this process holds it

    def wait(self) -> int:
        """Block until the replica has ended; its exit status (-N: killed by signal N)."""
        self._started.wait()
        process = self._process
        if process is not None:
            code = process.wait()
            with self._lock:
                if self._exit_code is None:
                    self._exit_code = code
                self._release_watchdog()
                self._kill_group(process.pid)  # stragglers of the replica's group
            self._close_log(process)
        # without a process, start() recorded why (a stop before the start, or no program)
        return CANNOT_START_EXIT_CODE if self._exit_code is None else self._exit_code

    def signal(self, signum: int, group: bool = False) -> None:
        """Send ``signum`` to the replica's first process (``group``: its whole process
        group). Before the start, the replica is not started at all."""
        with self._lock:
            process = self._process
            if process is None:
                if self._stopped_before_start is None:
                    self._stopped_before_start = -int(signum)
                return
            if process.poll() is not None:
                return
            try:
                if group:
                    os.killpg(process.pid, signum)
                else:
                    process.send_signal(signum)
            except (ProcessLookupError, PermissionError):
                pass

    def _close_log(self, process: subprocess.Popen[bytes]) -> None:
        """Take the last output (the group is gone, so the pipe ends) and close the log."""
        pump, log = self._pump, self._log
        if pump is not None:
            pump.join(PUMP_JOIN_S)
        with self._lock:
            if log is not None and self._log is log and (pump is None or not pump.is_alive()):
                self._log = None
                log.close()
                if process.stdout is not None:
                    process.stdout.close()

    def _release_watchdog(self) -> None:
        if self._watchdog_pipe is not None:
            try:
                os.write(self._watchdog_pipe, b"x")  # ended normally: the watchdog leaves
            except OSError:
                pass
            os.close(self._watchdog_pipe)
            self._watchdog_pipe = None

    @staticmethod
    def _kill_group(pgid: int) -> None:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


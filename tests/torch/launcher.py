"""Launching real replica processes for the agent's tests (gloo on CPU, free ports)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pollux.jobenv import JobEnvironment

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_digits.py"
WORKERS = Path(__file__).resolve().parent / "workers"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun_env(rank: int, world_size: int, port: int, **extra: str) -> dict[str, str]:
    """This process's environment without ``POLLUX_*``, plus what torchrun sets for one
    replica on this machine (gloo on 127.0.0.1, one thread) and ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLLUX_")}
    env.update({"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", **extra})
    return env


class Replicas:
    """``num_replicas`` processes of one job launched like the Pollux local backend."""

    def __init__(self, argv: list[str], num_replicas: int, *, checkpoint_dir: Path,
                 log_dir: Path, num_restarts: int = 0, hints_target: str | None = None,
                 job_id: str = "test-job", environ: dict[str, str] | None = None) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.logs: list[Path] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        for rank in range(num_replicas):
            env = dict(os.environ)
            for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
                env.pop(key, None)
            env.update(JobEnvironment(
                job_id=job_id, rank=rank, num_replicas=num_replicas, local_rank=rank,
                node_rank=0, num_nodes=1, master_addr="127.0.0.1", master_port=port,
                checkpoint_dir=str(checkpoint_dir), hints_target=hints_target,
                num_restarts=num_restarts).to_env())
            env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                        "CUDA_VISIBLE_DEVICES": ""})
            env.update(environ or {})
            log = log_dir / f"launch{num_restarts}-rank{rank}.log"
            self.logs.append(log)
            with open(log, "wb") as out:
                self.procs.append(subprocess.Popen([sys.executable, *argv], env=env,
                                                   stdout=out, stderr=subprocess.STDOUT,
                                                   cwd=REPO))

    def signal(self, signum: int = signal.SIGTERM) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    def wait(self, timeout_s: float) -> list[int]:
        deadline = time.monotonic() + timeout_s
        codes = []
        try:
            for proc in self.procs:
                codes.append(proc.wait(max(deadline - time.monotonic(), 0.1)))
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"replicas timed out; logs:\n{self.output()}") from None
        return codes

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)

    def output(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-4000:]}"
                         for log in self.logs if log.exists())

    def json_lines(self, rank: int = 0) -> list[dict[str, Any]]:
        lines = [ln for ln in self.logs[rank].read_text().splitlines() if ln.startswith("{")]
        if not lines:
            raise AssertionError(f"no JSON output; logs:\n{self.output()}")
        return [dict(json.loads(line)) for line in lines]

    def last_json(self, rank: int = 0) -> dict[str, Any]:
        return self.json_lines(rank)[-1]

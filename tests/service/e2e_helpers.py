"""Running a real ``pollux server`` subprocess with real example jobs, for end-to-end
tests; every process started is killed when the test ends."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pollux.backends.local import MARKER_ENV
from pollux.backends.processes import marked_processes, signal_group
from pollux.client import PolluxClient, server_address

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_digits.py"
EQUAL_SHARE = "tests.service.service_test_policies:EqualSharePolicy"
"""The deterministic test policy, importable by a server subprocess from the repository."""
NUM_TRAIN_SAMPLES = 1797 - 360
"""scikit-learn digits minus the example's validation split."""


FINAL_STATES = ("Succeeded", "Failed", "Cancelled")
"""Job states that never change again."""


def states(client: PolluxClient) -> dict[str, str]:
    """Job id -> state, as the server reports them."""
    return {job["id"]: job["state"] for job in client.jobs()}


def all_final(client: PolluxClient) -> bool:
    return all(state in FINAL_STATES for state in states(client).values())


def wait_until(predicate: Callable[[], Any], timeout_s: float, what: str,
               interval_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


class ServerProcess:
    """``pollux server`` in its own session, on 2 virtual nodes x 2 CPU slots (or on the
    typed virtual nodes of ``virtual_nodes``, e.g. ``a:2x1,b:1x1``)."""

    def __init__(self, data_dir: Path, policy: str = EQUAL_SHARE, interval_s: float = 1.0,
                 virtual_nodes: str | None = None, extra_args: tuple[str, ...] = (),
                 extra_env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.extra_env = dict(extra_env or {})
        nodes = (["--nodes", "2", "--slots-per-node", "2"] if virtual_nodes is None
                 else ["--virtual-nodes", virtual_nodes])
        self.args = [sys.executable, "-m", "pollux.cli.main", "server", "--data-dir",
                     str(data_dir), "--port", "0", *nodes,
                     "--device", "cpu", "--interval", str(interval_s), "--policy", policy,
                     "--stop-grace", "30", *extra_args]
        self.process: subprocess.Popen[bytes] | None = None
        self.clients: list[PolluxClient] = []
        self.starts = 0

    def start(self, timeout_s: float = 60.0) -> PolluxClient:
        env = {k: v for k, v in os.environ.items() if k != "POLLUX_TOKEN"}  # not this one's
        env.update(self.extra_env)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
        self.starts += 1
        log = open(self.data_dir.parent / f"server-{self.starts}.log", "wb")  # noqa: SIM115
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=env,
                                        start_new_session=True)
        log.close()
        server_file = self.data_dir / "server.json"

        def ready() -> dict[str, Any] | None:
            assert self.process is not None and self.process.poll() is None, self.log_text()
            try:
                record = json.loads(server_file.read_text())
            except (OSError, ValueError):
                return None
            return record if record.get("pid") == self.process.pid else None

        record = wait_until(ready, timeout_s, "the server to start")
        self.clients.append(PolluxClient(server_address(record)))
        return self.clients[-1]

    def log_text(self) -> str:
        return "\n".join(p.read_text(errors="replace")
                         for p in sorted(self.data_dir.parent.glob("server-*.log")))

    def kill(self) -> None:
        """SIGKILL the server only (its replicas live on, as after a crash)."""
        assert self.process is not None
        self.process.kill()
        self.process.wait(timeout=10)

    def stop(self, timeout_s: float = 60.0) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=timeout_s)

    def cleanup(self) -> None:
        """Kill the server and every replica started from this data directory."""
        for client in self.clients:
            client.close()
        if self.process is not None and self.process.poll() is None:
            signal_group(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        instance = instance_id(self.data_dir)
        if instance is not None:
            for pid in marked_processes(MARKER_ENV, instance):
                signal_group(pid, signal.SIGKILL)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def instance_id(data_dir: Path) -> str | None:
    path = data_dir / "pollux.db"
    if not path.exists():
        return None
    with contextlib.closing(sqlite3.connect(path)) as conn:
        row = conn.execute("SELECT value FROM meta WHERE key='instance_id'").fetchone()
    return None if row is None else str(row[0])


def replica_pid(data_dir: Path, job_id: str, generation: int, rank: int) -> int:
    with contextlib.closing(sqlite3.connect(data_dir / "pollux.db")) as conn:
        row = conn.execute("SELECT handle FROM replicas WHERE job_id=? AND generation=? AND "
                           "rank=?", (job_id, generation, rank)).fetchone()
    assert row is not None, f"no replica {rank} of {job_id} launch {generation}"
    return int(json.loads(row[0])["pid"])


def launches(data_dir: Path, job_id: str) -> dict[int, list[str]]:
    """Generation -> node of each rank, from the job store."""
    with contextlib.closing(sqlite3.connect(data_dir / "pollux.db")) as conn:
        rows = conn.execute("SELECT generation, node FROM replicas WHERE job_id=? "
                            "ORDER BY generation, rank", (job_id,)).fetchall()
    found: dict[int, list[str]] = {}
    for generation, node in rows:
        found.setdefault(int(generation), []).append(str(node))
    return found


def replica_intervals(data_dir: Path, job_id: str) -> list[tuple[int, float, float | None]]:
    """(generation, first start, last exit) of each launch, from the store."""
    with contextlib.closing(sqlite3.connect(data_dir / "pollux.db")) as conn:
        rows = conn.execute("SELECT generation, MIN(started_at), MAX(exited_at) FROM replicas "
                            "WHERE job_id=? GROUP BY generation ORDER BY generation",
                            (job_id,)).fetchall()
    return [(int(g), float(s), None if e is None else float(e)) for g, s, e in rows]


def example_spec(name: str, max_replicas: int, epochs: int, step_delay_s: float = 0.05
                 ) -> dict[str, Any]:
    """The digits example; the batch size adapts up to 64 so epochs take ~1 s."""
    return {"name": name, "max_replicas": max_replicas, "working_dir": str(REPO),
            "command": [sys.executable, str(EXAMPLE), "--epochs", str(epochs),
                        "--max-batch-size", "64", "--step-delay-s", str(step_delay_s),
                        "--checkpoint-interval-s", "1", "--control-interval-s", "0.5"],
            "max_failures": 5}


def checkpoint_dir(data_dir: Path, job_id: str) -> Path:
    return data_dir / "jobs" / job_id / "checkpoint"


def agent_events(data_dir: Path, job_id: str) -> list[dict[str, Any]]:
    """The example's events.jsonl: one line per launch start and stop/end."""
    path = checkpoint_dir(data_dir, job_id) / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def started(data_dir: Path, job_id: str, launch: int | None = None) -> dict[str, Any] | None:
    """The agent's start event of ``launch`` (any launch when None), once written."""
    for event in agent_events(data_dir, job_id):
        if event["event"] == "start" and (launch is None or event["launch"] == launch):
            return event
    return None


def launch_log(data_dir: Path, job_id: str, generation: int, rank: int = 0) -> str:
    """What one replica printed during one launch (its per-replica log, that section)."""
    path = data_dir / "jobs" / job_id / "logs" / f"replica-{rank}.log"
    if not path.exists():
        return ""
    text = path.read_text(errors="replace")
    marker = f": launch {generation}, rank {rank} "
    if marker not in text:
        return ""
    section = text[text.index(marker):]
    following = section.find(": launch ", len(marker))
    return section if following < 0 else section[:following]


def finished_an_epoch(data_dir: Path, job_id: str, generation: int) -> bool:
    return "accuracy" in launch_log(data_dir, job_id, generation)


def checkpointed_after_an_epoch(data_dir: Path, job_id: str, generation: int) -> bool:
    """Whether rank 0 wrote a checkpoint after finishing an epoch in this launch (its
    state may still be of that epoch: a background save from its last sync point)."""
    log = launch_log(data_dir, job_id, generation)
    epoch_at = log.find("accuracy")
    return epoch_at >= 0 and "checkpoint written" in log[epoch_at:]


def check_sample_accounting(data_dir: Path, job_id: str, epochs: int) -> list[dict[str, Any]]:
    """Every training sample exactly once per epoch, over all launches and ranks."""
    path = checkpoint_dir(data_dir, job_id) / "samples.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for epoch in range(epochs):
        seen = Counter(i for r in records if r["epoch"] == epoch for i in r["indices"])
        assert sorted(seen) == list(range(NUM_TRAIN_SAMPLES)), f"{job_id} epoch {epoch}"
        assert set(seen.values()) == {1}, f"{job_id} epoch {epoch}: repeated samples"
    return records

"""What running on Slurm costs, side by side with the local backend, on the same jobs.

    python bench/slurm_latency.py                # starts its own Slurm (needs root,
                                                 # slurm-wlm and munge installed)
    python bench/slurm_latency.py --repeats 10 --json bench/results/slurm_latency.json

A replica here is a small Python process (no training), so the figures are the
backends' own overheads:

- **launch to running**: from ``launch()`` (an ``sbatch`` on Slurm, processes locally)
  until every replica has printed that it runs;
- **rescale**: from the SIGTERM (``stop()``) of a 2-replica launch until every replica of
  the next (3-replica) launch runs: the replicas exit 75, their exits are read, the new
  launch starts;
- **round**: what one scheduling round asks of the backend: ``nodes()`` and a ``poll()``
  of each of 3 running jobs.

Both backends run on this machine's virtual nodes: 4 Slurm nodes (2 x t4, 2 x a100, 2
fake GPUs each; ``tests/backends/slurm/cluster.py``) and the local backend's
``--virtual-nodes t4:2x2,a100:2x2``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the test helper that starts a real Slurm

from tests.backends.slurm.cluster import SlurmCluster, why_unavailable  # noqa: E402

from pollux.backends.base import Backend, LaunchRequest, ReplicaState  # noqa: E402
from pollux.backends.local import LocalBackend  # noqa: E402
from pollux.backends.slurm import SlurmBackend  # noqa: E402
from pollux.job_spec import JobSpec  # noqa: E402

REPLICA = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(75))
print("replica up", flush=True)
time.sleep(600)
"""
TIMEOUT_S = 60.0


def wait(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


class Jobs:
    """Launch requests of one backend's jobs, each in its own directory."""

    def __init__(self, root: Path, gpu_types: dict[str, str]) -> None:
        self.root = root
        self.gpu_types = gpu_types
        self.script = root / "replica.py"
        self.script.write_text(REPLICA)

    def request(self, job_id: str, generation: int, allocation: Sequence[str]
                ) -> LaunchRequest:
        spec = JobSpec.from_dict({"name": job_id, "command": [sys.executable, str(self.script)],
                                  "working_dir": str(self.root), "max_replicas": 4})
        return LaunchRequest(job_id=job_id, generation=generation, spec=spec,
                             allocation=tuple(allocation),
                             checkpoint_dir=str(self.root / job_id / "checkpoint"),
                             log_dir=str(self.root / job_id / "logs"),
                             gpu_type=self.gpu_types[allocation[0]])

    def up(self, request: LaunchRequest) -> bool:
        logs = Path(request.log_dir)
        marker = f": launch {request.generation}, rank "
        for rank in range(len(request.allocation)):
            path = logs / f"replica-{rank}.log"
            if not path.exists():
                return False
            text = path.read_text(errors="replace")
            if marker not in text or "replica up" not in text[text.rindex(marker):]:
                return False
        return True


def exited(backend: Backend, job_id: str) -> bool:
    statuses = backend.poll(job_id)
    return bool(statuses) and all(s.state is ReplicaState.EXITED for s in statuses)


def measure(backend: Backend, jobs: Jobs, nodes: dict[str, list[str]], repeats: int
            ) -> dict[str, Any]:
    """Launch-to-running, rescale and round times of ``backend``, ``repeats`` times."""
    launch_s, rescale_s, round_s = [], [], []
    t4, a100 = nodes["t4"], nodes["a100"]
    for i in range(repeats):
        job = f"bench-{i}"
        first = jobs.request(job, 1, [t4[0], t4[1]])
        start = time.perf_counter()
        backend.launch(first)
        wait(lambda first=first: jobs.up(first), "the first launch")
        launch_s.append(time.perf_counter() - start)
        others = [jobs.request(f"{job}-x{k}", 1, [a100[k]]) for k in range(2)]
        for other in others:
            backend.launch(other)
        for other in others:
            wait(lambda other=other: jobs.up(other), "the other jobs")
        rounds = []
        for _ in range(5):
            start = time.perf_counter()
            backend.nodes()
            for job_id in (job, *(o.job_id for o in others)):
                backend.poll(job_id)
            rounds.append(time.perf_counter() - start)
        round_s.append(statistics.median(rounds))
        start = time.perf_counter()
        backend.stop(job)
        wait(lambda job=job: exited(backend, job), "the rescaled launch to stop")
        backend.release(job)
        second = jobs.request(job, 2, [t4[0], t4[0], t4[1]])
        backend.launch(second)
        wait(lambda second=second: jobs.up(second), "the rescaled launch")
        rescale_s.append(time.perf_counter() - start)
        for job_id in (job, *(o.job_id for o in others)):
            backend.stop(job_id, force=True)
        for job_id in (job, *(o.job_id for o in others)):
            wait(lambda job_id=job_id: exited(backend, job_id), "the end")
            backend.release(job_id)
    return {name: {"median_s": round(statistics.median(values), 3),
                   "max_s": round(max(values), 3), "n": len(values)}
            for name, values in (("launch_to_running", launch_s), ("rescale", rescale_s),
                                 ("round", round_s))}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    reason = why_unavailable()
    if reason is not None:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="pollux-slurm-bench-"))
    root.chmod(0o755)
    cluster = SlurmCluster(root / "slurm")
    results: dict[str, Any] = {}
    try:
        cluster.start()
        os.environ["SLURM_CONF"] = str(cluster.conf)
        slurm_root = root / "slurm-jobs"
        slurm_root.mkdir()
        slurm = SlurmBackend("bench0000000001", mode="cluster")
        types = {n.name: n.gpu_type for n in slurm.nodes()}
        results["slurm"] = measure(slurm, Jobs(slurm_root, types), {
            "t4": ["n1", "n2"], "a100": ["n3", "n4"]}, args.repeats)
        local_root = root / "local-jobs"
        local_root.mkdir()
        local = LocalBackend("bench0000000002", device="cpu",
                             virtual_nodes="t4:2x2,a100:2x2")
        types = {n.name: n.gpu_type for n in local.nodes()}
        results["local"] = measure(local, Jobs(local_root, types), {
            "t4": ["t4-0", "t4-1"], "a100": ["a100-0", "a100-1"]}, args.repeats)
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(f"{'':20} {'slurm (median/max s)':>22} {'local (median/max s)':>22}")
    for name in ("launch_to_running", "rescale", "round"):
        cells = [f"{results[b][name]['median_s']:.3f} / {results[b][name]['max_s']:.3f}"
                 for b in ("slurm", "local")]
        print(f"{name:20} {cells[0]:>22} {cells[1]:>22}")
    if args.json is not None:
        args.json.write_text(json.dumps({"repeats": args.repeats, **results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

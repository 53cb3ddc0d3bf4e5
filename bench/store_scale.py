"""A store of 20,000 finished jobs (issue 30, item 11): latency of ``/api/dashboard``,
``/api/jobs``, ``/metrics`` and one ``describe``, old code beside new, on the same store.

Builds one job store (``--jobs`` finished jobs, each with a spec, hints with a fitted
model, six events and two replicas; schema created by the first tree given), then for
each tree (``--src NAME=PATH``: e.g. the code before the change from a ``git worktree``,
and this checkout's ``src``) copies it into a fresh data directory, starts a real
``pollux server`` from that tree on it (a tree that has ``--keep-finished`` gets
``--keep-finished`` above ``--jobs``: nothing is pruned, the store stays at 20,000),
and times ``--requests`` sequential GETs of each endpoint after a warm-up. Prints, per
tree and endpoint: p50, p95, max and the response size. Run from the repository root:

    git worktree add /tmp/old <base commit>
    nice -n 10 python bench/store_scale.py --src old=/tmp/old/src --src new=src
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ENDPOINTS = ("/api/dashboard", "/api/jobs", "/metrics")
HINTS = {"init_batch_size": 32, "max_batch_size": 512, "local_bsz_bounds": [16, 128],
         "batch_size": 64, "local_bsz": 64, "accum_steps": 0, "epoch": 3,
         "perf_params": {"alpha_c": 0.1, "beta_c": 0.01, "alpha_n": 0.2, "beta_n": 0.02,
                         "alpha_r": 0.01, "beta_r": 0.001, "gamma": 1.5},
         "grad_params": {"sqr": 1.0, "var": 10.0}}


def build_store(path: Path, src: Path, num_jobs: int) -> None:
    """The schema from ``src``'s JobStore, then ``num_jobs`` finished jobs in bulk."""
    env = {**os.environ, "PYTHONPATH": str(src.resolve())}
    subprocess.run([sys.executable, "-c", "import sys; from pollux.service.storage.store import "
                    "JobStore; JobStore(sys.argv[1]).close()", str(path)], env=env,
                   check=True)
    conn = sqlite3.connect(path)
    now = time.time() - 3600.0
    spec = {"name": "", "command": ["python", "train.py"], "working_dir": "/tmp",
            "max_replicas": 4}
    jobs, events, replicas = [], [], []
    for seq in range(1, num_jobs + 1):
        job_id = f"done{seq % 97}-{seq}"
        t = now + seq * 0.1
        jobs.append((seq, job_id, f"done{seq % 97}", json.dumps({**spec, "name": f"done{seq % 97}"}),
                     "Succeeded", json.dumps(["node-0", "node-0"]), 1, json.dumps(HINTS), t,
                     f"tok{seq}", 120.0, t, t + 1, t + 60, t + 60))
        for i, (kind, message) in enumerate((
                ("submitted", f"accepted as {job_id}"), ("Starting", "launch 1: 2 replicas"),
                ("Running", "all replicas running"), ("Batch size", "batch size 32 -> 64"),
                ("info", "hints updated"), ("Succeeded", "all 2 replicas exited 0"))):
            events.append((job_id, t + i, kind, message))
        for rank in range(2):
            replicas.append((job_id, 1, rank, "node-0", json.dumps(
                {"backend": "local", "pid": 1000 + rank}), t + 1, 0, t + 60))
    conn.executemany(
        "INSERT INTO jobs(seq, id, name, spec, state, allocation, num_launches, hints, "
        "hints_updated_at, hints_token, attained_service_s, submitted_at, started_at, "
        "finished_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", jobs)
    conn.executemany("INSERT INTO events(job_id, time, kind, message) VALUES (?, ?, ?, ?)",
                     events)
    conn.executemany("INSERT INTO replicas(job_id, generation, rank, node, handle, "
                     "started_at, exit_code, exited_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                     replicas)
    conn.commit()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def start_server(src: Path, data_dir: Path, extra: list[str]
                 ) -> tuple[subprocess.Popen[bytes], str, str]:
    command = [sys.executable, "-m", "pollux.cli.main", "server", "--data-dir",
               str(data_dir), "--port", "0", "--nodes", "2", "--slots-per-node", "2",
               "--device", "cpu", "--interval", "2", "--stop-grace", "5", *extra]
    env = {**os.environ, "PYTHONPATH": str(src.resolve())}
    env.pop("POLLUX_TOKEN", None)
    log_path = data_dir.parent / "server.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(log_path.read_text()[-2000:])
        try:
            record = json.loads((data_dir / "server.json").read_text())
            if record.get("pid") == process.pid:
                return process, record["url"], Path(record["token_file"]).read_text().strip()
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    process.kill()
    sys.exit("the server did not start within 180 s")


def percentiles(values_s: list[float]) -> dict[str, float]:
    ms = np.asarray(values_s) * 1e3
    return {"p50_ms": round(float(np.percentile(ms, 50)), 1),
            "p95_ms": round(float(np.percentile(ms, 95)), 1),
            "max_ms": round(float(ms.max()), 1)}


def run_tree(src: Path, store: Path, num_jobs: int, requests: int) -> dict[str, Any]:
    scratch = Path(tempfile.mkdtemp(prefix="pollux-store-scale-"))
    data_dir = scratch / "data"
    data_dir.mkdir(mode=0o700)
    shutil.copy(store, data_dir / "pollux.db")
    os.chmod(data_dir / "pollux.db", 0o600)
    has_retention = "--keep-finished" in (src / "pollux/cli/server.py").read_text()
    extra = ["--keep-finished", str(num_jobs * 10)] if has_retention else []
    process, url, token = start_server(src, data_dir, extra)
    results: dict[str, Any] = {}
    try:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"},
                          timeout=120) as client:
            job_id = client.get("/api/jobs", params={"limit": 1}).json()[-1]["id"]
            for path in (*ENDPOINTS, f"/api/jobs/{job_id}"):
                for _ in range(3):  # warm-up
                    client.get(path)
                times, size = [], 0
                for _ in range(requests):
                    started = time.perf_counter()
                    response = client.get(path)
                    times.append(time.perf_counter() - started)
                    response.raise_for_status()
                    size = len(response.content)
                key = "describe" if path.startswith("/api/jobs/") else path
                results[key] = {**percentiles(times), "bytes": size}
            results["jobs_in_store"] = sum(client.get("/metrics").text.count(
                f'pollux_jobs{{state="{s}"}} {num_jobs}.0') for s in ("Succeeded",))
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(scratch, ignore_errors=True)
    return results


def main() -> None:
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(f"signal {signum}"))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", action="append", required=True, metavar="NAME=PATH")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--old-requests", type=int, default=None,
                        help="requests per endpoint for every tree but the last (the old "
                             "code takes seconds a request at 20,000 jobs)")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    args = parser.parse_args()
    trees = [(name, Path(path)) for name, _, path in (s.partition("=") for s in args.src)]
    scratch = Path(tempfile.mkdtemp(prefix="pollux-store-scale-build-"))
    store = scratch / "pollux.db"
    build_store(store, trees[0][1], args.jobs)
    results = {}
    try:
        for i, (name, src) in enumerate(trees):
            count = (args.requests if args.old_requests is None or i == len(trees) - 1
                     else args.old_requests)
            results[name] = run_tree(src, store, args.jobs, count)
            results[name]["requests"] = count
            print(name, json.dumps(results[name]), flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if args.out is not None:
        args.out.write_text(json.dumps({"jobs": args.jobs, "requests": args.requests,
                                        **results}, indent=1))


if __name__ == "__main__":
    main()

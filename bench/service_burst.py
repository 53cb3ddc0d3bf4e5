"""The audit's burst: 1,000 submits at once, API latency under that load, old code beside new.

For each source tree given (``--src NAME=PATH``, e.g. the code before a change from a
``git worktree``, and this checkout's ``src``), starts a real ``pollux server`` (local
backend, CPU slots) from that tree in a scratch data directory, then fires ``--jobs``
submissions from ``--clients`` threads at once while a reader polls ``GET /api/jobs``
and ``GET /api/jobs/<id>`` (as a dashboard would), and keeps reading while the queue
drains for ``--drain-s`` seconds. Prints per tree: submit latency, read latency during
the burst and during the drain (p50/p95/max), submits refused or failed, jobs finished,
and the exactly-once check (each job appends its id to a file; none may appear twice).
The trees run one after the other on the same machine, in one run:

    git worktree add /tmp/old <base commit>
    nice -n 10 python bench/service_burst.py --src old=/tmp/old/src --src new=src
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np

FINAL_STATES = ("Succeeded", "Failed", "Cancelled")


def summary(values_s: list[float]) -> str:
    if not values_s:
        return "-"
    ms = np.asarray(values_s) * 1e3
    return (f"p50 {np.percentile(ms, 50):7.1f} ms  p95 {np.percentile(ms, 95):7.1f} ms  "
            f"max {ms.max():7.1f} ms  (n={len(ms)})")


def start_server(src: Path, scratch: Path, args: argparse.Namespace
                 ) -> tuple[subprocess.Popen[bytes], str, str]:
    data_dir = scratch / "data"
    command = [sys.executable, "-m", "pollux.cli.main", "server", "--data-dir",
               str(data_dir), "--port", "0", "--nodes", str(args.nodes), "--slots-per-node",
               str(args.slots_per_node), "--device", "cpu", "--interval", str(args.interval),
               "--policy", args.policy, "--stop-grace", "5"]
    env = {**os.environ, "PYTHONPATH": str(src.resolve())}
    env.pop("POLLUX_TOKEN", None)
    log = open(scratch / "server.log", "wb")  # noqa: SIM115 - handed to the child
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                               stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit((scratch / "server.log").read_text()[-2000:])
        try:
            record = json.loads((data_dir / "server.json").read_text())
            if record.get("pid") == process.pid:
                token = Path(record["token_file"]).read_text().strip()
                return process, record["url"], token
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    process.kill()
    sys.exit("the server did not start within 120 s")


def timed(latencies: list[float], call: Any, *args: Any, **kwargs: Any) -> Any:
    started = time.perf_counter()
    try:
        return call(*args, **kwargs)
    finally:
        latencies.append(time.perf_counter() - started)


def run_tree(name: str, src: Path, args: argparse.Namespace) -> dict[str, Any]:
    scratch = Path(tempfile.mkdtemp(prefix=f"pollux-burst-{name}-"))
    done_file = scratch / "done.txt"
    server, url, token = start_server(src, scratch, args)
    headers = {"Authorization": f"Bearer {token}"}
    submit_s: list[float] = []
    burst_reads_s: list[float] = []
    drain_reads_s: list[float] = []
    statuses: Counter[str] = Counter()
    ids: list[str] = []
    lock = threading.Lock()
    phase = {"reads": burst_reads_s}
    stop = threading.Event()
    opened: list[httpx.Client] = []
    spec = {"command": ["/bin/sh", "-c", f'sleep {args.job_s} && echo "$POLLUX_JOB_ID" '
                                         f'>> {done_file}'],
            "working_dir": str(scratch), "max_replicas": 1}
    try:
        clients = threading.local()

        def submit(i: int) -> None:  # each submitting thread keeps its own connection
            if not hasattr(clients, "client"):
                clients.client = httpx.Client(base_url=url, headers=headers, timeout=60)
                opened.append(clients.client)
            try:
                response = timed(submit_s, clients.client.post, "/api/jobs",
                                 json={**spec, "name": f"b{i}"})
                status = str(response.status_code)
                if response.status_code == 201:
                    with lock:
                        ids.append(response.json()["id"])
            except httpx.HTTPError as exc:
                status = type(exc).__name__
            with lock:
                statuses[status] += 1

        def read() -> None:  # a steady reader, as a dashboard or `pollux top` would be
            with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
                while not stop.is_set():
                    try:
                        timed(phase["reads"], client.get, "/api/jobs")
                        with lock:
                            some = ids[-1] if ids else None
                        if some is not None:
                            timed(phase["reads"], client.get, f"/api/jobs/{some}")
                    except httpx.HTTPError:
                        phase["reads"].append(60.0)
                    time.sleep(0.1)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        started = time.monotonic()
        with ThreadPoolExecutor(args.clients) as pool:
            list(pool.map(submit, range(args.jobs)))
        burst_s = time.monotonic() - started
        for client in opened:
            client.close()
        phase["reads"] = drain_reads_s
        time.sleep(args.drain_s)
        stop.set()
        reader.join(timeout=60)
        with httpx.Client(base_url=url, headers=headers, timeout=120) as client:
            rows = client.get("/api/jobs").json()
        states = Counter(r["state"] for r in rows)
        completions = Counter(done_file.read_text().split()) if done_file.exists() else Counter()
        return {"tree": name, "burst_s": burst_s, "submit": summary(submit_s),
                "burst_reads": summary(burst_reads_s), "drain_reads": summary(drain_reads_s),
                "statuses": dict(statuses), "states": dict(states),
                "finished": sum(states[s] for s in FINAL_STATES),
                "run_twice": sum(1 for n in completions.values() if n > 1),
                "completions": sum(completions.values())}
    finally:
        stop.set()
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        shutil.rmtree(scratch, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", action="append", required=True,
                        help="NAME=PATH of a source tree (its src/ directory); repeatable")
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=32, help="threads submitting at once")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--slots-per-node", type=int, default=4)
    parser.add_argument("--job-s", type=float, default=0.2, help="seconds each job runs")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between rounds")
    parser.add_argument("--policy", default="pollux")
    parser.add_argument("--drain-s", type=float, default=30.0,
                        help="seconds to keep reading after the burst")
    args = parser.parse_args()
    results = []
    for item in args.src:
        name, _, path = item.partition("=")
        print(f"--- {name}: {path}", flush=True)
        result = run_tree(name, Path(path), args)
        results.append(result)
        print(json.dumps(result), flush=True)
    print()
    print(f"{args.jobs} submits from {args.clients} clients at once; {args.nodes} x "
          f"{args.slots_per_node} CPU slots, policy {args.policy}, jobs of {args.job_s} s")
    for r in results:
        print(f"[{r['tree']}] burst took {r['burst_s']:.1f} s; submit answers {r['statuses']}")
        print(f"[{r['tree']}]   POST /api/jobs:              {r['submit']}")
        print(f"[{r['tree']}]   GET during the burst:        {r['burst_reads']}")
        print(f"[{r['tree']}]   GET during {args.drain_s:g} s of draining: {r['drain_reads']}")
        print(f"[{r['tree']}]   finished {r['finished']}, completions {r['completions']}, "
              f"run twice {r['run_twice']}; states {r['states']}")
    return 0 if all(r["run_twice"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

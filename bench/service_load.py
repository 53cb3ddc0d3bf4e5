"""Load check of the scheduler service: 200 short jobs on 4 nodes x 4 CPU slots.

Starts a real ``pollux server`` (local backend, the default pollux policy) in a scratch
data directory, submits every job at once, then polls the API while the queue drains and
prints, as it goes and at the end: API latency (p50/p95/max of ``GET /api/jobs`` and of
the submissions), the scheduling round time (``round_s`` of each round, from
``/api/cluster/history``), how long the queue took to drain, and the exactly-once check:
each job appends its id to a file when it completes, so every job must be Succeeded and
appear there exactly once (nothing lost, nothing run twice).

    nice -n 15 python bench/service_load.py                 # 200 jobs, 4 x 4 slots
    python bench/service_load.py --jobs 40 --job-s 0.2      # quicker
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
from pathlib import Path
from typing import Any

import numpy as np

from pollux.client import PolluxClient, locate_server

FINAL_STATES = ("Succeeded", "Failed", "Cancelled")


def percentiles(values_s: list[float]) -> str:
    if not values_s:
        return "-"
    ms = np.asarray(values_s) * 1e3
    return (f"p50 {np.percentile(ms, 50):7.1f} ms  p95 {np.percentile(ms, 95):7.1f} ms  "
            f"max {ms.max():7.1f} ms  (n={len(ms)})")


def start_server(data_dir: Path, args: argparse.Namespace) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "pollux.cli.main", "server", "--data-dir",
               str(data_dir), "--port", "0", "--nodes", str(args.nodes), "--slots-per-node",
               str(args.slots_per_node), "--device", "cpu", "--interval", str(args.interval),
               "--policy", args.policy, "--stop-grace", "10"]
    log = open(data_dir.parent / "server.log", "wb")  # noqa: SIM115 - handed to the child
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit((data_dir.parent / "server.log").read_text()[-2000:])
        try:
            if json.loads((data_dir / "server.json").read_text()).get("pid") == process.pid:
                return process
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    process.kill()
    sys.exit("the server did not start within 120 s")


def timed(latencies: list[float], call: Any, *args: Any) -> Any:
    start = time.perf_counter()
    result = call(*args)
    latencies.append(time.perf_counter() - start)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--slots-per-node", type=int, default=4)
    parser.add_argument("--job-s", type=float, default=0.5, help="seconds each job runs")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between rounds")
    parser.add_argument("--policy", default="pollux")
    parser.add_argument("--timeout", type=float, default=1800.0)
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="pollux-load-"))
    data_dir = scratch / "data"
    done_file = scratch / "done.txt"
    server = start_server(data_dir, args)
    client = PolluxClient(locate_server(data_dir=data_dir))
    get_latencies: list[float] = []
    submit_latencies: list[float] = []
    stop = threading.Event()
    try:
        spec = {"command": ["/bin/sh", "-c", f'sleep {args.job_s} && echo "$POLLUX_JOB_ID" '
                                             f'>> {done_file}'],
                "working_dir": str(scratch), "max_replicas": 1, "restart_delay_s": 1.0}
        started = time.monotonic()
        ids = [timed(submit_latencies, client.submit, {**spec, "name": f"j{i}"})["id"]
               for i in range(args.jobs)]
        print(f"submitted {len(ids)} jobs in {time.monotonic() - started:.1f} s; "
              f"submit latency {percentiles(submit_latencies)}", flush=True)

        def poll_api() -> None:  # a steady reader, as a dashboard or `pollux top` would be
            with PolluxClient(client.address) as reader:
                while not stop.is_set():
                    timed(get_latencies, reader.jobs)
                    time.sleep(0.1)

        reader = threading.Thread(target=poll_api, daemon=True)
        reader.start()
        last_print = 0.0
        while True:
            rows = client.jobs()
            states = Counter(r["state"] for r in rows)
            final = sum(states[s] for s in FINAL_STATES)
            now = time.monotonic() - started
            if now - last_print >= 10 or final == len(ids):
                last_print = now
                print(f"t={now:6.1f} s  {dict(sorted(states.items()))}  "
                      f"GET /api/jobs {percentiles(get_latencies[-100:])}", flush=True)
            if final == len(ids):
                break
            if now > args.timeout:
                print("timed out before the queue drained", flush=True)
                break
            time.sleep(1.0)
        drained_s = time.monotonic() - started
        stop.set()
        reader.join(timeout=10)
        history = client.cluster_history().get("samples", {})
        rounds_s = [float(v) for v in history.get("round_s", [])]
        succeeded = {r["id"] for r in rows if r["state"] == "Succeeded"}
        completions = Counter(done_file.read_text().split()) if done_file.exists() else Counter()
        lost = sorted(set(ids) - set(completions))
        twice = sorted(job for job, n in completions.items() if n > 1)
        launches = Counter(client.job(job_id)["launches"] for job_id in ids)
        print()
        print(f"jobs: {args.jobs} on {args.nodes} x {args.slots_per_node} slots, "
              f"{args.job_s} s each, policy {args.policy}, interval {args.interval} s")
        print(f"drained in {drained_s:.1f} s; succeeded {len(succeeded)}/{len(ids)}")
        print(f"API GET /api/jobs while draining: {percentiles(get_latencies)}")
        print(f"API POST /api/jobs (submit):      {percentiles(submit_latencies)}")
        print(f"scheduling round (policy):        {percentiles(rounds_s)}")
        print(f"launches per job: {dict(sorted(launches.items()))}")
        print(f"lost (never completed): {len(lost)}  run twice: {len(twice)}")
        return 0 if not lost and not twice and len(succeeded) == len(ids) else 1
    finally:
        stop.set()
        client.close()
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

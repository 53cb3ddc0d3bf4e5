"""Cost of reading jobs with hints, as every round and every ``pollux ls`` does: list N
jobs that posted hints and build their summaries (``pollux ls`` rows) and samples (the
dashboard's, /metrics'), after every row changed (attained service grows each round).

    python bench/list_with_hints.py              # 100 jobs, 20 lists, median
    python bench/list_with_hints.py --jobs 1000

Records hold parsed hints since the store parses each job's spec and hints once (not at
every changed row) and keeps one model per hints version (not one per reader).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from pollux.job_spec import JobSpec
from pollux.models.hints import JobHints
from pollux.service.http.views import job_summary
from pollux.service.loop.telemetry import job_sample
from pollux.service.storage.store import JobStore

PARAMS = {"alpha_c": 0.01, "beta_c": 0.001, "alpha_n": 0.1, "beta_n": 0.01,
          "alpha_r": 0.05, "beta_r": 0.005, "gamma": 1.5}
HINTS = {"init_batch_size": 32, "max_batch_size": 512, "local_bsz_bounds": [16, 128],
         "batch_size": 64, "local_bsz": 32, "accum_steps": 1, "epoch": 1,
         "grad_stats": {"sqr": 1.0, "var": 20.0}, "throughput_params": PARAMS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--lists", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        store = JobStore(Path(directory) / "pollux.db", synchronous="OFF")
        ids = []
        for i in range(args.jobs):
            spec = JobSpec.from_dict({"name": f"job{i}", "command": ["true"],
                                      "working_dir": "/tmp"})
            ids.append(store.add_job(spec, 0.0).id)
            store.set_hints(ids[-1], JobHints.from_dict(HINTS), 1.0)
        reopened = JobStore(store.path, synchronous="OFF")  # parses as a restarted server
        lists_s, samples_s = [], []
        for k in range(args.lists):
            reopened.add_service(dict.fromkeys(ids, 1.0), 2.0 + k)
            start = time.perf_counter()
            records = reopened.list_jobs()
            for record in records:
                job_summary(record, 10.0)
            lists_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            for record in records:
                job_sample(record, 10.0)
            samples_s.append(time.perf_counter() - start)
        store.close()
        reopened.close()
    print(f"{args.jobs} jobs: list + summaries {1e3 * statistics.median(lists_s):.2f} ms, "
          f"samples {1e3 * statistics.median(samples_s):.2f} ms (median of {args.lists})")


if __name__ == "__main__":
    main()

"""Worker: accumulate on every replica, checkpoint; or, relaunched, print the totals."""

from __future__ import annotations

import argparse
import json

import pollux.torch as pt


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--phase", choices=("add", "read"), required=True)
    args = parser.parse_args()
    job = pt.init_process_group(install_signal_handler=False)
    acc = pt.Accumulator(job=job, name="train", reductions={"best": "max", "acc": "mean"})
    if args.phase == "add":
        acc["n"] += job.rank + 1  # 1 + 2 = 3 over two replicas
        acc["best"] = 10.0 * (job.rank + 1)
        acc["acc"] = 0.5 + 0.25 * job.rank  # mean 0.625
        job.checkpoint.save()
    else:
        acc["n"] += 1  # one more from each of this launch's replicas
        with acc.synchronized():
            if job.rank == 0:
                print(json.dumps(dict(acc)), flush=True)
    job.close()


if __name__ == "__main__":
    main()

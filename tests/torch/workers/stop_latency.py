"""Worker: train fast steps until stopped; print when ready to be signalled and, on the
rescale exit, how many optimizer steps ran after this replica saw its stop request.

Lines: {"ready": true} after ``--ready-steps`` steps; at exit {"rank", "signal_step",
"exit_step", "stop_s"} (signal_step: optimizer steps done when this replica first saw
its stop request, None if it never got one; stop_s: seconds from then to the exit).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import pollux.torch as pt


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--step-sleep-s", type=float, default=0.01)
    parser.add_argument("--ready-steps", type=int, default=20)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    job = pt.init_process_group()
    net = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    model = pt.AdaptiveDataParallel(net, optimizer, job=job)
    data = torch.utils.data.TensorDataset(torch.randn(4096, 8), torch.randn(4096, 1))
    loader = pt.AdaptiveDataLoader(data, batch_size=8 * job.num_replicas, job=job)
    signal_step: int | None = None
    seen_at = 0.0
    try:
        for _ in pt.remaining_epochs_until(1000, job):
            for x, y in loader:
                optimizer.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                optimizer.step()
                time.sleep(args.step_sleep_s)
                if signal_step is None and job.stop_requested.is_set():
                    signal_step, seen_at = model.optimizer_steps, time.monotonic()
                if model.optimizer_steps == args.ready_steps:
                    print(json.dumps({"ready": True}), flush=True)
    except SystemExit:
        print(json.dumps({"rank": job.rank, "signal_step": signal_step,
                          "exit_step": model.optimizer_steps,
                          "stop_s": time.monotonic() - seen_at if signal_step else None}),
              flush=True)
        raise


if __name__ == "__main__":
    main()

"""Worker: a job whose forward raises ``torch.OutOfMemoryError`` above a local batch of
``--oom-above``, autoscaling towards a larger batch (a per-step delay makes large batches
pay; starting near the optimum, the gradient noise makes them useful at once).

Rank 0 appends one line per optimizer step to ``steps.jsonl`` in the checkpoint
directory: the launch, the epoch and the local batch it trained at.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

import pollux.torch as pt


class OutOfMemoryAbove(torch.nn.Module):
    """A linear model that runs out of (injected) memory above ``limit`` samples."""

    def __init__(self, dims: int, limit: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(dims, 1)
        self.limit = limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > self.limit:
            raise torch.OutOfMemoryError(f"injected: a local batch of {x.shape[0]} > "
                                         f"{self.limit}")
        return self.linear(x).squeeze(-1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--oom-above", type=int, default=48)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--samples", type=int, default=3000)
    parser.add_argument("--step-delay-s", type=float, default=0.01)
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = pt.AgentConfig(control_interval_s=0.1, min_noise_updates=3,
                            probe_interval_steps=1, noise_interval_steps=1,
                            min_profiled_steps=3, batch_change_confirmations=1,
                            refit_interval_s=0.2, checkpoint_interval_s=0.5,
                            hints_interval_s=0.2)
    job = pt.init_process_group(config=config)
    out = Path(os.environ["POLLUX_CHECKPOINT_DIR"])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.samples, 8))
    w = rng.standard_normal(8)
    y = x @ w + 3.0 * rng.standard_normal(args.samples)
    dataset = torch.utils.data.TensorDataset(torch.tensor(x, dtype=torch.float32),
                                             torch.tensor(y, dtype=torch.float32))
    net = OutOfMemoryAbove(8, args.oom_above)
    with torch.no_grad():  # near the optimum: noise dominates, large batches pay at once
        net.linear.weight.copy_(torch.tensor(w, dtype=torch.float32)[None])
        net.linear.bias.zero_()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    model = pt.AdaptiveDataParallel(net, optimizer, job=job)
    loader = pt.AdaptiveDataLoader(dataset, batch_size=16, shuffle=True, job=job)
    loader.autoscale_batch_size(512, local_bsz_bounds=(8, 256))
    for epoch in pt.remaining_epochs_until(args.epochs, job):
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = ((model(xb) - yb) ** 2).mean()
            loss.backward()
            optimizer.step()
            time.sleep(args.step_delay_s)
            info = loader.batch_info
            if job.rank == 0 and info is not None:
                with open(out / "steps.jsonl", "a") as steps:
                    steps.write(json.dumps({"launch": job.launch.num_restarts, "epoch": epoch,
                                            "local_bsz": info.local_bsz}) + "\n")
    job.close()


if __name__ == "__main__":
    main()

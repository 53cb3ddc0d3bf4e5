"""Worker: a plain single-process training script (no launcher, no checkpoint setting).

Prints one JSON line per epoch ({"epoch", "steps", "restored"}) and sleeps a little per
step so that a test can interrupt it mid-epoch.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import pollux.torch as pt


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--sleep-s", type=float, default=0.0)
    args = parser.parse_args()
    torch.manual_seed(0)
    job = pt.init_process_group()
    net = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    model = pt.AdaptiveDataParallel(net, optimizer, job=job)
    data = torch.utils.data.TensorDataset(torch.randn(256, 4), torch.randn(256))
    loader = pt.AdaptiveDataLoader(data, batch_size=16, job=job)
    for epoch in pt.remaining_epochs_until(args.epochs, job):
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x).squeeze(-1), y).backward()
            optimizer.step()
            time.sleep(args.sleep_s)
        print(json.dumps({"epoch": epoch, "steps": model.optimizer_steps,
                          "restored": job.checkpoint.is_restored()}), flush=True)
    job.close()


if __name__ == "__main__":
    main()

"""Worker: a short training run under torchrun; every rank prints one JSON line
({"rank", "world", "nodes", "weights"}: the sum of its trained weights)."""

from __future__ import annotations

import argparse
import json

import torch

import pollux.torch as pt


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint-dir", default="")
    args = parser.parse_args()
    torch.manual_seed(0)
    job = pt.init_process_group(checkpoint_dir=args.checkpoint_dir)
    net = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    model = pt.AdaptiveDataParallel(net, optimizer, job=job)
    data = torch.utils.data.TensorDataset(torch.randn(128, 4), torch.randn(128))
    loader = pt.AdaptiveDataLoader(data, batch_size=16, job=job)
    for _ in pt.remaining_epochs_until(2, job):
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x).squeeze(-1), y).backward()
            optimizer.step()
    weights = round(float(sum(p.detach().sum() for p in net.parameters())), 6)
    print(json.dumps({"rank": job.rank, "world": job.num_replicas, "nodes": job.num_nodes,
                      "weights": weights}), flush=True)
    job.close()


if __name__ == "__main__":
    main()

"""AdaptDL's tutorial script (``mnist_step_5.py``) in its structure, on Pollux.

The same shape as the classic PyTorch MNIST example after AdaptDL's five tutorial steps:
a small CNN, ``train()`` and ``test()`` functions, Adadelta with a StepLR schedule, an
elastic data loader that picks its batch size, an epoch loop that resumes after
restarts, and test metrics summed over replicas with an ``Accumulator``. What differs
from the AdaptDL version are renames (``adaptdl.torch`` -> ``pollux.torch``) and the
explicit ``job=`` argument (Pollux keeps no global state). The data are scikit-learn's
8x8 digits (shipped with it: no download) instead of MNIST.

    python examples/tutorial_digits.py
    torchrun --nproc-per-node 2 examples/tutorial_digits.py
    pollux submit --max-replicas 2 -- python examples/tutorial_digits.py
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.optim.lr_scheduler import StepLR

import pollux.torch as pt


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, 1)
        self.conv2 = nn.Conv2d(16, 32, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(32 * 2 * 2, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(torch.flatten(x, 1))
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


def train(args: argparse.Namespace, model: nn.Module, device: torch.device,
          train_loader: pt.AdaptiveDataLoader, optimizer: optim.Optimizer, epoch: int) -> None:
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0:
            print(f"Train epoch {epoch} [batch {batch_idx}/{len(train_loader)}, "
                  f"batch size {train_loader.current_batch_size}]\tloss {loss.item():.4f}")
            if args.dry_run:
                break


def test(model: nn.Module, device: torch.device, test_loader: pt.AdaptiveDataLoader,
         job: pt.JobContext) -> float:
    model.eval()
    stats = pt.Accumulator(job=job)
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            stats["test_loss"] += F.nll_loss(output, target, reduction="sum").item()
            pred = output.argmax(dim=1, keepdim=True)
            stats["correct"] += pred.eq(target.view_as(pred)).sum().item()
            stats["count"] += len(target)
    with stats.synchronized():
        test_loss = stats["test_loss"] / stats["count"]
        accuracy = stats["correct"] / stats["count"]
        print(f"\nTest set: average loss {test_loss:.4f}, accuracy {stats['correct']:.0f}/"
              f"{stats['count']:.0f} ({100 * accuracy:.0f}%)\n")
    return accuracy


def digits_datasets(seed: int) -> tuple[torch.utils.data.TensorDataset,
                                        torch.utils.data.TensorDataset]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    order = np.random.default_rng(seed).permutation(len(digits.target))
    images = torch.tensor(digits.images[order] / 16.0, dtype=torch.float32).unsqueeze(1)
    images = (images - 0.3) / 0.4
    labels = torch.tensor(digits.target[order], dtype=torch.int64)
    return (torch.utils.data.TensorDataset(images[360:], labels[360:]),
            torch.utils.data.TensorDataset(images[:360], labels[:360]))


def main() -> None:
    parser = argparse.ArgumentParser(description="Pollux digits tutorial")
    parser.add_argument("--batch-size", type=int, default=32, help="initial total batch")
    parser.add_argument("--test-batch-size", type=int, default=360)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.7, help="learning-rate step gamma")
    parser.add_argument("--dry-run", action="store_true", help="one batch per epoch")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log-interval", type=int, default=10)
    args = parser.parse_args()
    torch.manual_seed(args.seed)

    job = pt.init_process_group()
    train_data, test_data = digits_datasets(args.seed)
    train_loader = pt.AdaptiveDataLoader(train_data, batch_size=args.batch_size,
                                         shuffle=True, job=job)
    test_loader = pt.AdaptiveDataLoader(test_data, batch_size=args.test_batch_size,
                                        shuffle=False, job=job)
    train_loader.autoscale_batch_size(512, local_bsz_bounds=(16, 128))

    model = Net().to(job.device)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    model = pt.AdaptiveDataParallel(model, optimizer, scheduler, job=job)

    for epoch in pt.remaining_epochs_until(args.epochs, job):
        train(args, model, job.device, train_loader, optimizer, epoch)
        test(model, job.device, test_loader, job)
        scheduler.step()
    job.close()


if __name__ == "__main__":
    main()

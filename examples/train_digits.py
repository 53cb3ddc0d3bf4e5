"""Train a small MLP on scikit-learn's digits with the Pollux agent.

    python examples/train_digits.py
    torchrun --nproc-per-node 2 examples/train_digits.py
    pollux submit --name digits --max-replicas 3 -- python examples/train_digits.py

With a checkpoint directory (``--checkpoint-dir`` or the scheduler's
``POLLUX_CHECKPOINT_DIR``) the run is resumable, and rank 0 writes there:

* ``samples.jsonl``: the sample accounting, one line per (epoch, launch, rank) with the
  data-set indices that rank trained on (``indices``) and the padding it got
  (``padding``); over each epoch the ``indices`` of all lines are every training sample
  exactly once, across any number of restarts and replica counts;
* ``events.jsonl``: one line per launch start and stop/end with the epoch, optimizer
  step and progress (so continuity across restarts can be checked).

The last line printed on stdout by rank 0 is a JSON summary (time to target, accuracy).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

import pollux.torch as pt
from pollux.jobenv import RESCALE_EXIT_CODE

NUM_VALIDATION = 360


class IndexedDigits(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor, int]]):
    """Digits images (flattened, scaled to [0, 1]) with their index in the data set."""

    def __init__(self, images: np.ndarray, labels: np.ndarray) -> None:
        self.images = torch.tensor(images, dtype=torch.float32)
        self.labels = torch.tensor(labels, dtype=torch.int64)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return self.images[index], self.labels[index], index


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits (1797 8x8 images), read from the file it ships.

    Reading the file directly skips importing scikit-learn (a second per process).
    """
    spec = importlib.util.find_spec("sklearn")
    if spec is not None and spec.origin is not None:
        path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
        if path.exists():
            table = np.loadtxt(path, delimiter=",")
            return table[:, :-1], table[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits as sklearn_digits

    digits = sklearn_digits()
    return digits.data, digits.target


def split_digits(seed: int = 0) -> tuple[IndexedDigits, IndexedDigits]:
    data, target = load_digits()
    order = np.random.default_rng(seed).permutation(len(target))
    images = data[order] / 16.0
    labels = target[order]
    return (IndexedDigits(images[NUM_VALIDATION:], labels[NUM_VALIDATION:]),
            IndexedDigits(images[:NUM_VALIDATION], labels[:NUM_VALIDATION]))


def build_model(hidden: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, 10))


class SampleLog:
    """Which samples each rank trained on, merged on rank 0 at every checkpoint."""

    def __init__(self, job: pt.JobContext) -> None:
        self.job = job
        self.pending: list[dict[str, Any]] = []
        self.history: list[dict[str, Any]] = []

    def record(self, info: pt.BatchInfo, indices: torch.Tensor) -> None:
        seen = indices.tolist()
        real = len(seen) - info.num_padding
        if not self.pending or self.pending[-1]["epoch"] != info.epoch:
            self.pending.append({"epoch": info.epoch, "launch": self.job.launch.num_restarts,
                                 "num_replicas": info.num_replicas, "rank": self.job.rank,
                                 "indices": [], "padding": []})
        self.pending[-1]["indices"].extend(seen[:real])
        self.pending[-1]["padding"].extend(seen[real:])

    def state_dict(self) -> list[dict[str, Any]]:
        gathered: list[Any] = [self.pending]
        if self.job.num_replicas > 1:
            gathered = [None] * self.job.num_replicas
            dist.all_gather_object(gathered, self.pending, group=self.job.control_group)
        self.pending = []
        for part in gathered:
            self.history.extend(part)
        return self.history

    def load_state_dict(self, state: list[dict[str, Any]]) -> None:
        self.history = list(state)


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    os.replace(tmp, path)


def evaluate(model: torch.nn.Module, data: IndexedDigits, job: pt.JobContext) -> float:
    """Accuracy on the validation set, each rank scoring its share."""
    model.eval()
    share = torch.arange(job.rank, len(data), job.num_replicas)
    with torch.no_grad():
        logits = model.module(data.images[share].to(job.device))
        counts = torch.tensor([float((logits.argmax(1).cpu() == data.labels[share]).sum()),
                               float(len(share))], device=job.device)
    if job.num_replicas > 1:
        dist.all_reduce(counts)
    model.train()
    return float(counts[0] / counts[1])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=32, help="initial total batch size")
    parser.add_argument("--max-batch-size", type=int, default=512)
    parser.add_argument("--local-bsz-bounds", type=int, nargs=2, default=(8, 256))
    parser.add_argument("--autoscale", action=argparse.BooleanOptionalAction, default=True,
                        help="let Pollux pick the batch size (default on)")
    parser.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    parser.add_argument("--lr", type=float, default=None,
                        help="base learning rate (default 0.05 SGD, 0.002 Adam)")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--target-accuracy", type=float, default=None,
                        help="stop once validation accuracy reaches this")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-dir", default=None,
                        help="default: POLLUX_CHECKPOINT_DIR, else ./pollux-checkpoints/"
                             "train_digits ( turns checkpoints off)")
    parser.add_argument("--checkpoint-interval-s", type=float, default=180.0)
    parser.add_argument("--control-interval-s", type=float, default=1.0,
                        help="target time between the replicas' agreement points")
    parser.add_argument("--tensorboard-dir", default=None)
    parser.add_argument("--step-delay-s", type=float, default=0.0,
                        help="sleep this long per batch (to make runs interruptible in tests)")
    parser.add_argument("--quiet", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    config = pt.AgentConfig(checkpoint_interval_s=args.checkpoint_interval_s,
                            control_interval_s=args.control_interval_s,
                            tensorboard_dir=args.tensorboard_dir)
    job = pt.init_process_group(checkpoint_dir=args.checkpoint_dir, config=config)
    train, validation = split_digits(args.seed)
    net = build_model(args.hidden)
    if args.optimizer == "sgd":
        optimizer: torch.optim.Optimizer = torch.optim.SGD(
            net.parameters(), lr=args.lr or 0.05, momentum=0.9)
    else:
        optimizer = torch.optim.Adam(net.parameters(), lr=args.lr or 0.002)
    model = pt.AdaptiveDataParallel(net, optimizer, job=job)
    loader = pt.AdaptiveDataLoader(train, batch_size=args.batch_size, shuffle=True, job=job,
                                   seed=args.seed)
    if args.autoscale:
        loader.autoscale_batch_size(args.max_batch_size, tuple(args.local_bsz_bounds))
    samples = SampleLog(job)
    job.checkpoint.register("example/samples", samples)
    out_dir = Path(job.launch.checkpoint_dir) if job.launch.checkpoint_dir else None
    chief = job.rank == 0

    def event(kind: str, **extra: Any) -> None:
        if chief and out_dir is not None:
            append_jsonl(out_dir / "events.jsonl", {
                "event": kind, "launch": job.launch.num_restarts,
                "num_replicas": job.num_replicas, "epoch": job.epoch,
                "optimizer_steps": model.optimizer_steps, "progress": model.progress,
                "restored": job.checkpoint.is_restored(), "time": time.time(), **extra})

    event("start")
    loss_fn = torch.nn.CrossEntropyLoss()
    start = time.perf_counter()
    accuracy, reached, evaluated = 0.0, False, False
    try:
        for epoch in pt.remaining_epochs_until(args.epochs, job):
            for images, labels, indices in loader:
                assert loader.batch_info is not None
                samples.record(loader.batch_info, indices)
                optimizer.zero_grad()
                loss = loss_fn(model(images.to(job.device)), labels.to(job.device))
                loss.backward()
                optimizer.step()
                if args.step_delay_s:
                    time.sleep(args.step_delay_s)
            accuracy = evaluate(model, validation, job)
            evaluated = True
            if chief and not args.quiet:
                print(f"epoch {epoch:3d}  accuracy {accuracy:.3f}  batch "
                      f"{loader.current_batch_size}  noise scale {model.noise_scale() or 0:.0f}"
                      f"  lr x{model.lr_factor:.2f}  progress {model.progress:.0f}  "
                      f"{time.perf_counter() - start:.1f}s", flush=True)
            if args.target_accuracy is not None and accuracy >= args.target_accuracy:
                reached = True
                job.finish_epoch()
                job.checkpoint.save()
                break
    except SystemExit as stop:
        if stop.code == RESCALE_EXIT_CODE:
            event("stop")
        raise
    elapsed = time.perf_counter() - start
    if model.optimizer_steps and not evaluated:
        # Relaunched after the last epoch (e.g. rescaled while finishing): report the
        # restored model's accuracy rather than none.
        accuracy = evaluate(model, validation, job)
    if chief and out_dir is not None:
        write_jsonl(out_dir / "samples.jsonl", samples.history)
    event("end", accuracy=accuracy)
    if chief:
        print(json.dumps({"time_to_target_s": elapsed if reached else None,
                          "reached_target": reached, "accuracy": accuracy,
                          "epochs": job.epoch, "optimizer_steps": model.optimizer_steps,
                          "progress": model.progress, "batch_size": loader.current_batch_size,
                          "autoscale": args.autoscale, "num_replicas": job.num_replicas,
                          "backend": job.backend, "device": str(job.device),
                          "elapsed_s": elapsed}), flush=True)
    job.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

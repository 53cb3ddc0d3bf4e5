"""A Lightning regression model on synthetic data, adaptive with Pollux's AdaptiveStrategy.

    python examples/lightning_classifier.py
    torchrun --nproc-per-node 2 examples/lightning_classifier.py
    pollux submit --name lit --max-replicas 3 -- python examples/lightning_classifier.py
    python examples/lightning_classifier.py --plain      # Lightning's own strategy

The script is an ordinary Lightning script: only ``strategy=AdaptiveStrategy(...)`` is
Pollux's. With a checkpoint directory (``--checkpoint-dir`` or the scheduler's
``POLLUX_CHECKPOINT_DIR``) rank 0 also writes there ``samples.jsonl`` (the data-set
indices each rank trained on, per epoch and launch: every training sample once per
epoch) and ``events.jsonl`` (one line per launch start and stop/end with Lightning's
global step and epoch). The last line printed by rank 0 is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist

from pollux.integrations.lightning import AdaptiveStrategy
from pollux.jobenv import RESCALE_EXIT_CODE


class IndexedData(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor, int]]):
    """Inputs, targets and each sample's index in the data set."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        self.inputs, self.targets = inputs, targets

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return self.inputs[index], self.targets[index], index


def synthetic_data(num_train: int, num_val: int, seed: int) -> tuple[IndexedData, IndexedData]:
    """y = x.w / 2 + tanh(x.v) / 4 + noise (sd 0.5): a loss floor of 0.25."""
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(num_train + num_val, 16, generator=generator)
    w, v = torch.randn(16, generator=generator), torch.randn(16, generator=generator)
    noise = 0.5 * torch.randn(num_train + num_val, generator=generator)
    targets = (0.5 * inputs @ w + 0.25 * torch.tanh(inputs @ v) + noise).unsqueeze(1)
    return (IndexedData(inputs[:num_train], targets[:num_train]),
            IndexedData(inputs[num_train:], targets[num_train:]))


class Regressor(pl.LightningModule):
    """A small MLP; logs ``val_loss``; records which samples each batch trained on."""

    def __init__(self, train: IndexedData, val: IndexedData, batch_size: int, lr: float,
                 step_delay_s: float = 0.0) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                       torch.nn.Linear(32, 1))
        self.train_data, self.val_data = train, val
        self.batch_size, self.lr, self.step_delay_s = batch_size, lr, step_delay_s
        self.samples = SampleLog()
        self.val_losses: list[float] = []

    def setup(self, stage: str) -> None:
        strategy = self.trainer.strategy
        if isinstance(strategy, AdaptiveStrategy) and strategy.job is not None:
            self.samples.job = strategy.job
            strategy.job.checkpoint.register("example/samples", self.samples)

    def train_dataloader(self) -> torch.utils.data.DataLoader[Any]:
        return torch.utils.data.DataLoader(self.train_data, batch_size=self.batch_size,
                                           shuffle=True)

    def val_dataloader(self) -> torch.utils.data.DataLoader[Any]:
        return torch.utils.data.DataLoader(self.val_data, batch_size=256)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.net(inputs)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        inputs, targets, indices = batch
        strategy = self.trainer.strategy
        padding = 0
        if isinstance(strategy, AdaptiveStrategy) and strategy.train_loader is not None:
            info = strategy.train_loader.loader.batch_info
            padding = info.num_padding if info is not None else 0
        self.samples.record(self.current_epoch, indices.tolist(), padding)
        loss = torch.nn.functional.mse_loss(self(inputs), targets)
        self.log("train_loss", loss, prog_bar=True)
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        inputs, targets, _ = batch
        loss = torch.nn.functional.mse_loss(self(inputs), targets)
        self.log("val_loss", loss, sync_dist=True, batch_size=len(targets))


class SampleLog:
    """Which samples each rank trained on, per epoch; merged on rank 0 at checkpoints."""

    def __init__(self) -> None:
        self.job: Any = None
        self.pending: list[dict[str, Any]] = []
        self.history: list[dict[str, Any]] = []

    def record(self, epoch: int, indices: list[int], padding: int) -> None:
        if not self.pending or self.pending[-1]["epoch"] != epoch:
            launch = self.job.launch.num_restarts if self.job is not None else 0
            rank = self.job.rank if self.job is not None else 0
            self.pending.append({"epoch": epoch, "launch": launch, "rank": rank,
                                 "indices": [], "padding": []})
        real = len(indices) - padding
        self.pending[-1]["indices"].extend(indices[:real])
        self.pending[-1]["padding"].extend(indices[real:])

    def state_dict(self) -> list[dict[str, Any]]:
        gathered: list[Any] = [self.pending]
        if self.job is not None and self.job.num_replicas > 1:
            gathered = [None] * self.job.num_replicas
            dist.all_gather_object(gathered, self.pending, group=self.job.control_group)
        self.pending = []
        for part in gathered:
            self.history.extend(part)
        return self.history

    def load_state_dict(self, state: list[dict[str, Any]]) -> None:
        self.history = list(state)


def evaluate(module: Regressor) -> float:
    """Mean squared error on the whole validation set (one process)."""
    module.eval()
    with torch.no_grad():
        data = module.val_data
        loss = torch.nn.functional.mse_loss(module(data.inputs), data.targets)
    return float(loss)


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--num-train", type=int, default=2048)
    parser.add_argument("--num-val", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=16, help="initial local batch")
    parser.add_argument("--max-batch-size", type=int, default=256)
    parser.add_argument("--local-bsz-bounds", type=int, nargs=2, default=(8, 128))
    parser.add_argument("--lr", type=float, default=0.005)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plain", action="store_true",
                        help="Lightning's own strategy instead of Pollux's")
    parser.add_argument("--checkpoint-dir", default=None)
    parser.add_argument("--control-interval-s", type=float, default=1.0)
    parser.add_argument("--checkpoint-interval-s", type=float, default=180.0)
    parser.add_argument("--step-delay-s", type=float, default=0.0)
    parser.add_argument("--min-goodput-gain", type=float, default=0.05,
                        help="the predicted goodput gain a new batch size must offer")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    warnings.filterwarnings("ignore", module="lightning")  # tips about workers, loggers
    torch.set_num_threads(1)
    pl.seed_everything(args.seed, verbose=False)
    train, val = synthetic_data(args.num_train, args.num_val, args.seed)
    module = Regressor(train, val, args.batch_size, args.lr, args.step_delay_s)
    strategy: Any = "auto"
    if not args.plain:
        import pollux.torch as pt

        strategy = AdaptiveStrategy(
            max_batch_size=args.max_batch_size, local_bsz_bounds=tuple(args.local_bsz_bounds),
            checkpoint_dir=args.checkpoint_dir, seed=args.seed,
            config=pt.AgentConfig(control_interval_s=args.control_interval_s,
                                  checkpoint_interval_s=args.checkpoint_interval_s,
                                  min_goodput_gain=args.min_goodput_gain))
    trainer = pl.Trainer(max_epochs=args.epochs, accelerator="cpu", strategy=strategy,
                         logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0)
    job = strategy.job if isinstance(strategy, AdaptiveStrategy) else None
    out_dir: Path | None = None

    def event(kind: str, **extra: Any) -> None:
        if out_dir is not None and job is not None and job.rank == 0:
            append_jsonl(out_dir / "events.jsonl", {
                "event": kind, "launch": job.launch.num_restarts,
                "num_replicas": job.num_replicas, "global_step": trainer.global_step,
                "epoch": trainer.current_epoch, "time": time.time(), **extra})

    class Events(pl.Callback):
        def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            nonlocal job, out_dir
            job = strategy.job if isinstance(strategy, AdaptiveStrategy) else None
            if job is not None and job.launch.checkpoint_dir:
                out_dir = Path(job.launch.checkpoint_dir)
            event("start")

    trainer.callbacks.append(Events())
    start = time.perf_counter()
    try:
        trainer.fit(module)
    except SystemExit as stop:
        if stop.code == RESCALE_EXIT_CODE:
            event("stop")
        raise
    loss = evaluate(module)
    rank = int(os.environ.get("RANK", "0")) if job is None else job.rank
    if out_dir is not None and rank == 0:
        (out_dir / "samples.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in module.samples.history))
    event("end", val_loss=loss)
    if rank == 0:
        print(json.dumps({"val_loss": loss, "global_step": trainer.global_step,
                          "epochs": trainer.current_epoch,
                          "strategy": type(trainer.strategy).__name__,
                          "elapsed_s": time.perf_counter() - start}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Train a tiny causal language model with Hugging Face's Trainer, made adaptive by Pollux.

    python examples/transformers_clm.py                      # one process
    torchrun --nproc-per-node 2 examples/transformers_clm.py
    pollux submit --name clm --max-replicas 3 -- python examples/transformers_clm.py
    python examples/transformers_clm.py --plain              # transformers.Trainer itself

The model is a 2-layer GPT-2 built from its config (no download); the corpus is
synthetic, drawn from a seeded Markov chain over 32 tokens (no tokenizer), so the best
possible loss is the chain's entropy. The only Pollux line is the trainer's class
(``AdaptiveTrainer`` for ``Trainer``) and its two extra arguments.

With a checkpoint directory (the scheduler's ``POLLUX_CHECKPOINT_DIR``, or
``--checkpoint-dir``) rank 0 writes there ``samples.jsonl`` (per epoch, launch and rank,
the data-set indices trained) and ``events.jsonl`` (each launch's start and stop). The last
line on stdout (rank 0) is a JSON summary with the final evaluation loss.
"""

from __future__ import annotations

import argparse
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

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

VOCAB = 32
SEQ_LEN = 32


class MarkovCorpus(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Sequences of a seeded Markov chain: each token has 4 likely successors."""

    def __init__(self, num_sequences: int, seed: int, chain_seed: int = 0) -> None:
        chain = np.random.default_rng(chain_seed)
        successors = np.stack([chain.choice(VOCAB, 4, replace=False) for _ in range(VOCAB)])
        weights = np.array([0.55, 0.25, 0.15, 0.05])
        rng = np.random.default_rng(seed)
        tokens = np.empty((num_sequences, SEQ_LEN), dtype=np.int64)
        tokens[:, 0] = rng.integers(VOCAB, size=num_sequences)
        for t in range(1, SEQ_LEN):
            picks = rng.choice(4, size=num_sequences, p=weights)
            tokens[:, t] = successors[tokens[:, t - 1], picks]
        self.tokens = torch.from_numpy(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = self.tokens[index]
        return {"input_ids": ids, "labels": ids}


def build_model(seed: int) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ_LEN, n_embd=32, n_layer=2,
                        n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


class SampleLog(TrainerCallback):  # type: ignore[misc]
    """Which samples each rank trained on (from the loader's ``batch_info``), kept in
    Pollux's checkpoint so that the record spans restarts."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.pending: list[dict[str, Any]] = []
        self.history: list[dict[str, Any]] = []

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        info = self.trainer.adaptive_loader.batch_info
        seen = [int(i) for i in info.indices]
        real = len(seen) - info.num_padding
        if not self.pending or self.pending[-1]["epoch"] != info.epoch:
            self.pending.append({"epoch": info.epoch,
                                 "launch": self.trainer.job.launch.num_restarts,
                                 "num_replicas": info.num_replicas,
                                 "rank": self.trainer.job.rank, "indices": []})
        self.pending[-1]["indices"].extend(seen[:real])

    def state_dict(self) -> list[dict[str, Any]]:
        job = self.trainer.job
        gathered: list[Any] = [self.pending]
        if job.num_replicas > 1:
            gathered = [None] * job.num_replicas
            dist.all_gather_object(gathered, self.pending, group=job.control_group)
        self.pending = []
        for part in gathered:
            self.history.extend(part)
        return self.history

    def load_state_dict(self, state: list[dict[str, Any]]) -> None:
        self.history = list(state)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=float, default=3)
    parser.add_argument("--batch-size", type=int, default=8, help="per-device batch")
    parser.add_argument("--max-batch-size", type=int, default=128)
    parser.add_argument("--local-bsz-bounds", type=int, nargs=2, default=(4, 64))
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--num-train", type=int, default=512)
    parser.add_argument("--num-eval", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plain", action="store_true", help="use transformers.Trainer")
    parser.add_argument("--output-dir", default=None, help="default: a temporary folder")
    parser.add_argument("--checkpoint-dir", default=None)
    parser.add_argument("--control-interval-s", type=float, default=1.0)
    parser.add_argument("--checkpoint-interval-s", type=float, default=180.0)
    parser.add_argument("--noise-interval-steps", type=int, default=4)
    parser.add_argument("--step-delay-s", type=float, default=0.0,
                        help="sleep this long per step (to make runs interruptible)")
    parser.add_argument("--hold-first-launch-at-epoch", type=int, default=None,
                        help="(tests) the first launch waits at this epoch until it is "
                             "stopped, so that a rescale happens mid-training")
    return parser.parse_args(argv)


class Delay(TrainerCallback):  # type: ignore[misc]
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        time.sleep(self.seconds)


class HoldUntilStopped(TrainerCallback):  # type: ignore[misc]
    """At the start of ``epoch``, wait until the job is asked to stop (SIGTERM); the
    next step's agreement point then checkpoints and exits."""

    def __init__(self, job: Any, epoch: int, announce: Any) -> None:
        self.job, self.epoch, self.announce = job, epoch, announce

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.epoch is None or state.epoch < self.epoch:
            return
        self.announce()
        while not self.job.stop_requested.is_set():
            time.sleep(0.05)
        self.epoch = 1 << 30  # once


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("transformers").setLevel(logging.WARNING)
    torch.set_num_threads(1)
    import tempfile

    output_dir = options.output_dir or tempfile.mkdtemp(prefix="clm-")
    args = TrainingArguments(
        output_dir=output_dir, per_device_train_batch_size=options.batch_size,
        per_device_eval_batch_size=64, num_train_epochs=options.epochs,
        learning_rate=options.lr, lr_scheduler_type="linear", weight_decay=0.0,
        logging_strategy="no", save_strategy="no", eval_strategy="no", report_to="none",
        disable_tqdm=True, seed=options.seed, use_cpu=not torch.cuda.is_available())
    train = MarkovCorpus(options.num_train, seed=options.seed + 1)
    validation = MarkovCorpus(options.num_eval, seed=options.seed + 2)
    model = build_model(options.seed)
    callbacks = [Delay(options.step_delay_s)] if options.step_delay_s else []
    if options.plain:
        trainer: Trainer = Trainer(model=model, args=args, train_dataset=train,
                                   eval_dataset=validation, callbacks=callbacks)
        trainer.train()
        metrics = trainer.evaluate()
        if trainer.is_world_process_zero():
            print(json.dumps({"eval_loss": metrics["eval_loss"], "plain": True,
                              "global_step": trainer.state.global_step}), flush=True)
        return 0

    import pollux.torch as pt
    from pollux.integrations.transformers import AdaptiveTrainer
    from pollux.jobenv import RESCALE_EXIT_CODE

    config = pt.AgentConfig(control_interval_s=options.control_interval_s,
                            checkpoint_interval_s=options.checkpoint_interval_s,
                            noise_interval_steps=options.noise_interval_steps)
    job = pt.init_process_group(checkpoint_dir=options.checkpoint_dir, config=config)
    adaptive = AdaptiveTrainer(model=model, args=args, train_dataset=train,
                               eval_dataset=validation, callbacks=callbacks, job=job,
                               max_batch_size=options.max_batch_size,
                               local_bsz_bounds=tuple(options.local_bsz_bounds))
    samples = SampleLog(adaptive)
    adaptive.add_callback(samples)
    job.checkpoint.register("example/samples", samples)
    out_dir = Path(job.launch.checkpoint_dir) if job.launch.checkpoint_dir else None
    chief = job.rank == 0

    def event(kind: str) -> None:
        if chief and out_dir is not None:
            append_jsonl(out_dir / "events.jsonl", {
                "event": kind, "launch": job.launch.num_restarts,
                "num_replicas": job.num_replicas, "epoch": job.epoch,
                "global_step": adaptive.state.global_step, "time": time.time()})

    event("start")
    if options.hold_first_launch_at_epoch is not None and job.launch.num_restarts == 0:
        adaptive.add_callback(HoldUntilStopped(job, options.hold_first_launch_at_epoch,
                                               lambda: event("hold")))
    try:
        adaptive.train()
    except SystemExit as stop:
        if stop.code == RESCALE_EXIT_CODE:
            event("stop")
        raise
    metrics = adaptive.evaluate()
    history = samples.state_dict()
    if chief and out_dir is not None:
        (out_dir / "samples.jsonl").write_text(
            "".join(json.dumps(record) + "\n" for record in history))
    event("end")
    loader = adaptive.adaptive_loader
    if chief:
        print(json.dumps({
            "eval_loss": metrics["eval_loss"], "plain": False,
            "global_step": adaptive.state.global_step, "epoch": adaptive.state.epoch,
            "job_epoch": job.epoch, "num_replicas": job.num_replicas,
            "init_batch_size": adaptive.init_batch_size,
            "batch_size": None if loader is None else loader.current_batch_size,
            "optimizer_steps": adaptive.adaptive_model.optimizer_steps
            if adaptive.adaptive_model is not None else 0}), flush=True)
    job.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

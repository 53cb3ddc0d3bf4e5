"""Per-step overhead of the framework integrations against the framework's own trainer.

    python bench/integration_overhead.py                         # every suite, 1 and 2 replicas
    python bench/integration_overhead.py --suite transformers --rounds 3 --steps 60
    python bench/integration_overhead.py --suite lightning --rounds 5 --steps 100

``transformers``: ``pollux.integrations.transformers.AdaptiveTrainer`` against
``transformers.Trainer`` (a single process, or DDP under torchrun's environment with
gloo) on the same model, data and fixed batch (no ``max_batch_size``: both do the same
work, so the difference is what the agent costs: its DDP hook and noise measurement, the
loader's plans and agreement points, the schedule and accounting callbacks).

``lightning``: ``pollux.integrations.lightning.AdaptiveStrategy`` against Lightning's own
``DDPStrategy`` (``strategy="ddp"``, on 1 and 2 processes under torchrun's environment,
gloo) on the same MLP, data and fixed batch (no ``max_batch_size``); each run times its
steps from a callback's ``on_train_batch_end``.

Runs are interleaved (plain, adaptive, adaptive, plain, ...) so that machine load weighs
on both alike. Each run times its own steps, after a warm-up, from the Trainer's
``on_step_end`` (process start-up and model set-up excluded); a figure is the median
over rounds of each run's mean step time. The target is an overhead of at most +5%.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(argv: list[str], replicas: int, timeout_s: float = 900) -> list[str]:
    """Run ``argv`` as ``replicas`` processes with torchrun's variables; rank outputs."""
    port = free_port()
    procs = []
    for rank in range(replicas):
        env = {k: v for k, v in os.environ.items() if not k.startswith("POLLUX_")}
        env.update({"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "",
                    "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])})
        if replicas > 1:
            env.update({"RANK": str(rank), "WORLD_SIZE": str(replicas),
                        "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(replicas),
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
        procs.append(subprocess.Popen([sys.executable, *argv], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outputs = [proc.communicate(timeout=timeout_s)[0] for proc in procs]
    for proc, output in zip(procs, outputs):
        if proc.returncode != 0:
            raise RuntimeError(f"{argv} failed ({proc.returncode}):\n{output[-4000:]}")
    return outputs


def step_summary(gaps: list[float]) -> dict[str, float]:
    """Mean, median and 10th percentile of a run's step times (s). On a loaded machine
    the low percentile is the steadiest: load only ever lengthens a step."""
    ordered = sorted(gaps)
    return {"step_s": statistics.fmean(gaps), "median_s": statistics.median(gaps),
            "p10_s": ordered[len(ordered) // 10], "steps": len(gaps)}


def step_times(output: str) -> dict[str, float]:
    lines = [ln for ln in output.splitlines() if ln.startswith('{"step_s"')]
    if not lines:
        raise RuntimeError(f"no timing in:\n{output[-4000:]}")
    return dict(json.loads(lines[-1]))


# -- transformers -----------------------------------------------------------------------


def transformers_worker(options: argparse.Namespace) -> None:
    """One timed run of ``transformers.Trainer`` or ``AdaptiveTrainer``."""
    import torch
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    sys.path.insert(0, str(REPO))
    from tests.integrations.clm import MarkovCorpus

    torch.set_num_threads(1)
    marks: list[float] = []

    class Clock(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            marks.append(time.perf_counter())

    warmup = options.warmup
    out = tempfile.mkdtemp(prefix="overhead-")
    replicas = int(os.environ.get("WORLD_SIZE", "1"))
    batch = options.batch_size // replicas
    args = TrainingArguments(
        output_dir=out, per_device_train_batch_size=batch,
        max_steps=options.steps + warmup, learning_rate=1e-3, logging_strategy="no",
        save_strategy="no", eval_strategy="no", report_to="none", disable_tqdm=True,
        use_cpu=True, seed=0, ddp_find_unused_parameters=False)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(
        vocab_size=32, n_positions=64, n_embd=options.width, n_layer=options.layers,
        n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
        eos_token_id=0))
    data = MarkovCorpus(options.batch_size * (options.steps + warmup + 2), seed=1)
    if options.kind == "plain":
        trainer: Trainer = Trainer(model=model, args=args, train_dataset=data,
                                   callbacks=[Clock()])
    else:
        import pollux.torch as pt
        from pollux.integrations.transformers import AdaptiveTrainer

        job = pt.init_process_group(checkpoint_dir=os.path.join(out, "pollux"),
                                    config=pt.AgentConfig(log_level=None))
        trainer = AdaptiveTrainer(model=model, args=args, train_dataset=data,
                                  callbacks=[Clock()], job=job)
    trainer.train()
    gaps = [b - a for a, b in zip(marks[warmup:], marks[warmup + 1:])]
    if trainer.is_world_process_zero():
        print(json.dumps(step_summary(gaps)), flush=True)


def transformers_run(kind: str, replicas: int, options: argparse.Namespace) -> float:
    argv = [str(Path(__file__).resolve()), "--worker", "transformers", "--kind", kind,
            "--steps", str(options.steps), "--warmup", str(options.warmup),
            "--batch-size", str(options.batch_size), "--width", str(options.width),
            "--layers", str(options.layers)]
    return step_times(launch(argv, replicas)[0])["step_s"]


# -- lightning --------------------------------------------------------------------------


def lightning_worker(options: argparse.Namespace) -> None:
    """One timed run of Lightning's DDPStrategy or AdaptiveStrategy."""
    import warnings

    import lightning.pytorch as pl
    import torch

    warnings.filterwarnings("ignore", module="lightning")
    torch.set_num_threads(1)
    marks: list[float] = []

    class Clock(pl.Callback):
        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                               batch_idx: int) -> None:
            marks.append(time.perf_counter())

    replicas = int(os.environ.get("WORLD_SIZE", "1"))
    batch = options.batch_size // replicas
    warmup = options.warmup
    width = options.width
    num_samples = options.batch_size * (options.steps + warmup + 2)
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(num_samples, width, generator=generator)
    targets = torch.randn(num_samples, 1, generator=generator)
    data = torch.utils.data.TensorDataset(inputs, targets)

    class MLP(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            layers: list[torch.nn.Module] = []
            for _ in range(options.layers):
                layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
            self.net = torch.nn.Sequential(*layers, torch.nn.Linear(width, 1))

        def training_step(self, batch_data: Any, batch_idx: int) -> Any:
            x, y = batch_data
            return torch.nn.functional.mse_loss(self.net(x), y)

        def train_dataloader(self) -> Any:
            return torch.utils.data.DataLoader(data, batch_size=batch, shuffle=True)

        def configure_optimizers(self) -> Any:
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    torch.manual_seed(0)
    if options.kind == "plain":
        strategy: Any = "ddp"
    else:
        import pollux.torch as pt
        from pollux.integrations.lightning import AdaptiveStrategy

        strategy = AdaptiveStrategy(
            checkpoint_dir=tempfile.mkdtemp(prefix="overhead-"),
            config=pt.AgentConfig(log_level=None))
    trainer = pl.Trainer(max_steps=options.steps + warmup, accelerator="cpu",
                         devices=replicas, strategy=strategy, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[Clock()])
    trainer.fit(MLP())
    gaps = [b - a for a, b in zip(marks[warmup:], marks[warmup + 1:])]
    if trainer.is_global_zero:
        print(json.dumps(step_summary(gaps)), flush=True)


def lightning_run(kind: str, replicas: int, options: argparse.Namespace) -> float:
    argv = [str(Path(__file__).resolve()), "--worker", "lightning", "--kind", kind,
            "--steps", str(options.steps), "--warmup", str(options.warmup),
            "--batch-size", str(options.batch_size), "--width", str(options.width),
            "--layers", str(options.layers)]
    return step_times(launch(argv, replicas)[0])["step_s"]


SUITES: dict[str, tuple[str, str, Callable[[str, int, argparse.Namespace], float]]] = {
    "transformers": ("transformers.Trainer", "AdaptiveTrainer", transformers_run),
    "lightning": ("lightning DDPStrategy", "AdaptiveStrategy", lightning_run),
}
"""Suite -> (baseline's name, integration's name, run(kind, replicas, options) -> mean
step seconds), kind being ``plain`` or ``adaptive``."""

WORKERS: dict[str, Callable[[argparse.Namespace], None]] = {
    "transformers": transformers_worker,
    "lightning": lightning_worker,
}


def measure(suite: str, replicas: int, options: argparse.Namespace) -> dict[str, Any]:
    run = SUITES[suite][2]
    times: dict[str, list[float]] = {"plain": [], "adaptive": []}
    for round_index in range(options.rounds):
        order = ("plain", "adaptive") if round_index % 2 == 0 else ("adaptive", "plain")
        for kind in order:
            times[kind].append(run(kind, replicas, options))
    plain = statistics.median(times["plain"])
    adaptive = statistics.median(times["adaptive"])
    return {"suite": suite, "replicas": replicas, "plain_ms": plain * 1e3,
            "adaptive_ms": adaptive * 1e3, "overhead_pct": (adaptive / plain - 1) * 100,
            "plain_runs_ms": [t * 1e3 for t in times["plain"]],
            "adaptive_runs_ms": [t * 1e3 for t in times["adaptive"]]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=sorted(SUITES), action="append")
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32, help="total batch")
    parser.add_argument("--width", type=int, default=128, help="model width (n_embd)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--kind", choices=("plain", "adaptive"), help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    options = parser.parse_args(argv)
    if options.worker:
        WORKERS[options.worker](options)
        return 0
    results = [measure(suite, replicas, options) for suite in options.suite or sorted(SUITES)
               for replicas in options.replicas]
    if options.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"{'suite':<14}{'replicas':>9}{'baseline ms':>13}{'pollux ms':>11}{'overhead':>10}")
    for row in results:
        print(f"{row['suite']:<14}{row['replicas']:>9}{row['plain_ms']:>13.1f}"
              f"{row['adaptive_ms']:>11.1f}{row['overhead_pct']:>+9.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())

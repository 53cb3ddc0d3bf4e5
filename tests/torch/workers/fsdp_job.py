"""Worker: an MLP sharded with FSDP2 (``fully_shard``) under the agent, on gloo.

``--mode noise``: the gradient noise of the same model and data measured twice in one
process, by DDP and by FSDP2 (prints one JSON line with both estimates).

``--measure-noise`` does that first in ``--mode train``, which trains ``--epochs`` epochs; rank 0 sends itself SIGTERM after
``--stop-at-step`` optimizer steps (launch 0 only). Every rank writes the indices it
trained on to ``samples-<launch>-<rank>.jsonl`` in the checkpoint directory; rank 0 writes
``events.jsonl`` (start, save, restored, end) with a digest of the full parameters and optimizer
state, the epoch, optimizer steps and progress.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)
from torch.distributed.fsdp import fully_shard

import pollux.torch as pt

DIMS = 12


def data(samples: int, seed: int) -> torch.utils.data.TensorDataset:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((samples, DIMS))
    w = rng.standard_normal(DIMS)
    y = np.tanh(x @ w) + 0.5 * rng.standard_normal(samples)
    return torch.utils.data.TensorDataset(torch.tensor(x, dtype=torch.float32),
                                          torch.tensor(y, dtype=torch.float32))


def mlp(shard: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(DIMS, 24), torch.nn.Tanh(),
                              torch.nn.Linear(24, 1))
    if shard:
        for layer in net:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(net)
    return net


def digest(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str | None:
    """sha256 of the full model and optimizer state (collective; rank 0 gets it)."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state = get_model_state_dict(module, options=options)
    # (a fresh optimizer has no state: reading it would step it once to create some)
    optim_state = (get_optimizer_state_dict(module, optimizer, options=options)
                   if optimizer.state else {})
    if not model_state:
        return None
    sha = hashlib.sha256()
    for key in sorted(model_state):
        sha.update(key.encode() + model_state[key].numpy().tobytes())
    for key in sorted(optim_state.get("state", {})):
        for name, value in sorted(optim_state["state"][key].items()):
            if isinstance(value, torch.Tensor):
                sha.update(f"{key}/{name}".encode() + value.numpy().tobytes())
    return sha.hexdigest()


def append(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a") as out:
        out.write(json.dumps(record) + "\n")


def measure(args: argparse.Namespace, shard: bool) -> tuple[pt.JobContext, float]:
    config = pt.AgentConfig(min_goodput_gain=1e9, min_noise_updates=1, noise_interval_steps=1)
    quiet = {k: v for k, v in os.environ.items() if k != "POLLUX_HINTS_TARGET"}
    job = pt.init_process_group(config=config, install_signal_handler=False, environ=quiet,
                                checkpoint_dir="")  # nothing of the training job's
    net = mlp(shard)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.02)
    model = pt.AdaptiveDataParallel(net, optimizer, job=job)
    micro = args.accum_steps + 1
    m0 = job.num_replicas * args.local_bsz * micro
    loader = pt.AdaptiveDataLoader(data(args.samples, 1), batch_size=m0, job=job, seed=3)
    loader.autoscale_batch_size(2 * m0, (args.local_bsz, args.local_bsz),
                                gradient_accumulation=micro > 1)
    for xb, yb in loader:
        optimizer.zero_grad()
        loss = 0.5 * ((model(xb).squeeze(-1) - yb) ** 2).mean()
        loss.backward()
        optimizer.step()
        if model.optimizer_steps >= args.steps:
            break
    assert loader.batch_config is not None and loader.batch_config.accum_steps == micro - 1
    estimate = model.noise.noise_scale()
    assert estimate is not None
    return job, estimate


def train(args: argparse.Namespace) -> None:
    config = pt.AgentConfig(control_interval_s=0.05, min_goodput_gain=1e9,
                            checkpoint_interval_s=1e6, refit_interval_s=0.2)
    job = pt.init_process_group(config=config)
    out = Path(os.environ["POLLUX_CHECKPOINT_DIR"])
    launch = job.launch.num_restarts
    net = mlp(shard=True)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    model = pt.AdaptiveDataParallel(net, optimizer, job=job)
    loader = pt.AdaptiveDataLoader(data(args.samples, 2), batch_size=48, shuffle=True,
                                   job=job, seed=5)
    if args.autoscale:
        loader.autoscale_batch_size(192, (8, 96))

    def event(kind: str, sha: str | None) -> None:
        if job.rank == 0:
            append(out / "events.jsonl", {
                "event": kind, "launch": launch, "restored": job.checkpoint.is_restored(),
                "epoch": job.epoch, "optimizer_steps": model.optimizer_steps,
                "progress": model.progress, "digest": sha,
                "noise": model.noise.raw().tolist(), "replicas": job.num_replicas})

    def save_digest() -> str | None:  # every rank, inside each checkpoint save
        sha = digest(net, optimizer)
        event("save", sha)
        return sha

    restored: list[str | None] = []
    job.checkpoint.register_functions("test/digest", save_digest, restored.append)
    event("start", digest(net, optimizer))
    if job.rank == 0 and restored:
        append(out / "events.jsonl", {"event": "restored", "launch": launch,
                                      "digest": restored[0]})
    samples = out / f"samples-{launch}-{job.rank}.jsonl"
    for epoch in pt.remaining_epochs_until(args.epochs, job):
        for xb, yb in loader:
            info = loader.batch_info
            assert info is not None
            real = len(info.indices) - info.num_padding
            append(samples, {"epoch": epoch, "indices": info.indices[:real].tolist()})
            optimizer.zero_grad()
            loss = 0.5 * ((model(xb).squeeze(-1) - yb) ** 2).mean()
            loss.backward()
            optimizer.step()
            if launch == 0 and job.rank == 0 and model.optimizer_steps == args.stop_at_step:
                os.kill(os.getpid(), signal.SIGTERM)
    event("end", digest(net, optimizer))
    job.close()


def measure_both(args: argparse.Namespace) -> list[pt.JobContext]:
    """DDP's then FSDP's estimate on the same model and data; rank 0 prints them. Returns
    the jobs to close, the one that owns the process group last."""
    ddp_job, ddp = measure(args, shard=False)
    fsdp_job, fsdp = measure(args, shard=True)
    if ddp_job.rank == 0:
        print(json.dumps({"ddp": ddp, "fsdp": fsdp, "replicas": ddp_job.num_replicas,
                          "accum_steps": args.accum_steps}), flush=True)
    return [fsdp_job, ddp_job]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("noise", "train"), required=True)
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--local-bsz", type=int, default=16)
    parser.add_argument("--accum-steps", type=int, default=0)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--stop-at-step", type=int, default=-1)
    parser.add_argument("--autoscale", action="store_true")
    parser.add_argument("--measure-noise", action="store_true",
                        help="train mode: measure the noise as --mode noise does first")
    args = parser.parse_args()
    torch.set_num_threads(1)
    jobs = measure_both(args) if args.mode == "noise" or args.measure_noise else []
    if args.mode == "train":
        train(args)  # (a stop leaves from inside, exit 75: nothing else to close)
    for job in jobs:
        job.close()


if __name__ == "__main__":
    main()

"""Benchmark of the PyTorch agent (CPU, gloo): does adaptive batch size pay, what does it cost?

    python bench/agent.py                  # both parts, 2 replicas
    python bench/agent.py --part tta       # time to target accuracy only
    python bench/agent.py --part overhead  # per-step overhead against plain DDP only

1. Time to target validation accuracy on the digits example (examples/train_digits.py)
   with 2 replicas, with ``autoscale_batch_size`` and with the fixed initial batch size,
   over several seeds (process start-up excluded: the example times its training loop).
2. Per-step time of the agent (AdaptiveDataParallel + AdaptiveDataLoader, fixed batch)
   against plain DistributedDataParallel + DistributedSampler on the same model and data,
   alternating step by step (plain, agent, agent, plain, ...) so that machine load affects
   both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "train_digits.py"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(argv: list[str], replicas: int, timeout_s: float = 600) -> list[str]:
    """Run ``replicas`` processes with torchrun's variables; return their outputs."""
    port = free_port()
    procs = []
    for rank in range(replicas):
        env = {k: v for k, v in os.environ.items() if not k.startswith("POLLUX_")}
        env.update({"RANK": str(rank), "WORLD_SIZE": str(replicas), "LOCAL_RANK": str(rank),
                    "LOCAL_WORLD_SIZE": str(replicas), "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"})
        procs.append(subprocess.Popen([sys.executable, *argv], env=env, cwd=REPO, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outputs = [p.communicate(timeout=timeout_s)[0] for p in procs]
    for proc, out in zip(procs, outputs):
        if proc.returncode != 0:
            raise RuntimeError(f"replica failed ({proc.returncode}):\n{out[-3000:]}")
    return outputs


def last_json(output: str) -> dict[str, Any]:
    return dict(json.loads([ln for ln in output.splitlines() if ln.startswith("{")][-1]))


def time_to_target(args: argparse.Namespace) -> None:
    print(f"time to {args.target:.0%} validation accuracy, digits MLP, {args.replicas} "
          f"replicas, initial batch {args.batch_size} (seconds of training; start-up excluded)")
    rows: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    for seed in range(args.repeats):
        for autoscale in (False, True):
            argv = [str(EXAMPLE), "--epochs", str(args.max_epochs), "--quiet",
                    "--target-accuracy", str(args.target), "--seed", str(seed),
                    "--batch-size", str(args.batch_size),
                    "--control-interval-s", str(args.control_interval_s),
                    "--autoscale" if autoscale else "--no-autoscale",
                    "--checkpoint-dir", ""]  # every run from scratch (no resuming)
            result = last_json(launch(argv, args.replicas)[0])
            rows[autoscale].append(result)
            print(f"  seed {seed} {'autoscale' if autoscale else 'fixed    '}: "
                  f"{_fmt(result['time_to_target_s'])} s, {result['epochs']} epochs, "
                  f"{result['optimizer_steps']} steps, final batch {result['batch_size']}",
                  flush=True)
    print()
    print(f"{'':12}{'fixed batch':>14}{'autoscale':>14}")
    for name, key in (("seconds", "time_to_target_s"), ("epochs", "epochs"),
                      ("steps", "optimizer_steps")):
        fixed = _median(r[key] for r in rows[False])
        adaptive = _median(r[key] for r in rows[True])
        print(f"{name + ' (med)':12}{_fmt(fixed):>14}{_fmt(adaptive):>14}")
    reached = [sum(r["reached_target"] for r in rows[a]) for a in (False, True)]
    print(f"{'reached':12}{reached[0]:>11}/{args.repeats}{reached[1]:>11}/{args.repeats}")


def _median(values: Any) -> float | None:
    finite = [float(v) for v in values if v is not None]
    return statistics.median(finite) if finite else None


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{float(value):.2f}"


def overhead(args: argparse.Namespace) -> None:
    argv = [str(Path(__file__).resolve()), "--worker", "--steps", str(args.steps),
            "--rounds", str(args.rounds), "--round-seconds", str(args.round_seconds),
            "--backend", args.backend]
    result = last_json(launch(argv, args.replicas)[0])
    where = result.pop("_where")
    print(f"per-step time, {args.replicas} replicas ({where}), median of {args.rounds} "
          f"interleaved rounds of about {args.round_seconds:g} s (at most {args.steps} steps)")
    print("(overhead: median over rounds of agent/plain - 1; within a round plain and agent "
          "steps alternate one by one)")
    print(f"{'model':26}{'plain DDP ms':>14}{'agent ms':>12}{'overhead':>10}")
    for name, row in result.items():
        print(f"{name:26}{row['plain_ms']:>14.3f}{row['agent_ms']:>12.3f}"
              f"{row['ratio'] - 1:>10.1%}")


def build_mlp(hidden: int) -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, 10))


def paired_seconds_per_step(plain: tuple[Any, Any, Any], agent: tuple[Any, Any, Any],
                            loss_fn: Any) -> tuple[float, float]:
    """One pass over both loaders in lockstep, one plain step then one agent step (the
    order alternating every step), each timed with its batch loading; mean seconds per
    step of each after 5 warm-up steps. Pairing step by step cancels machine drift."""
    import torch
    import torch.distributed as dist

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    dist.barrier()
    totals = {"plain": 0.0, "agent": 0.0}
    parts = {"plain": plain, "agent": agent}
    iterators = {"plain": iter(plain[2]), "agent": iter(agent[2])}
    steps = 0
    while True:
        order = ("plain", "agent") if steps % 2 == 0 else ("agent", "plain")
        try:
            for which in order:
                net, optimizer, _ = parts[which]
                sync()
                start = time.perf_counter()
                x, y = next(iterators[which])
                optimizer.zero_grad()
                loss_fn(net(x), y).backward()
                optimizer.step()
                sync()
                if steps >= 5:
                    totals[which] += time.perf_counter() - start
        except StopIteration:
            break
        steps += 1
    counted = max(steps - 5, 1)
    return totals["plain"] / counted, totals["agent"] / counted


def calibrated_steps(net: Any, local_bsz: int, device: Any, args: argparse.Namespace) -> int:
    """Steps per round so that one round of plain steps lasts about ``--round-seconds``
    (the same on every rank: rank 0's estimate is broadcast), at most ``--steps``."""
    import torch
    import torch.distributed as dist

    x = torch.randn(local_bsz, 64, device=device)
    y = torch.randint(0, 10, (local_bsz,), device=device)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    start = 0.0
    for i in range(8):
        if i == 3:
            start = time.perf_counter()
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        optimizer.step()
    per_step = (time.perf_counter() - start) / 5
    steps = torch.tensor([min(args.steps, max(10, int(args.round_seconds / per_step)))],
                         device=device)
    dist.broadcast(steps, 0)
    return int(steps.item())


def overhead_worker(args: argparse.Namespace) -> None:
    import torch
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    import pollux.torch as pt

    torch.set_num_threads(1)
    backend = None if args.backend == "auto" else args.backend
    job = pt.init_process_group(backend, install_signal_handler=False,
                                checkpoint_dir="")
    jobs = [job]
    rank, world, device = job.rank, job.num_replicas, job.device
    ddp_kwargs = {"device_ids": [device.index]} if device.type == "cuda" else {}
    generator = torch.Generator().manual_seed(0)
    loss_fn = torch.nn.CrossEntropyLoss()
    results: dict[str, dict[str, float]] = {}
    for hidden, local_bsz in ((128, 32), (1024, 128), (2048, 256)):
        name = f"MLP 64-{hidden}-{hidden}-10 b={local_bsz}"
        steps = calibrated_steps(build_mlp(hidden).to(device), local_bsz, device, args)
        size = world * local_bsz * (steps + 5)
        data = TensorDataset(torch.randn(size, 64, generator=generator).to(device),
                             torch.randint(0, 10, (size,), generator=generator).to(device))
        plain_net = build_mlp(hidden).to(device)
        plain_opt = torch.optim.SGD(plain_net.parameters(), lr=0.01, momentum=0.9)
        plain = DistributedDataParallel(plain_net, **ddp_kwargs)
        sampler = DistributedSampler(data, world, rank, shuffle=True, seed=0)
        plain_loader = DataLoader(data, batch_size=local_bsz, sampler=sampler)

        if job.model is not None:  # one model per job context: a new one per model
            job = pt.init_process_group(backend, install_signal_handler=False,
                                checkpoint_dir="")
            jobs.append(job)
        agent_net = build_mlp(hidden)
        agent_opt = torch.optim.SGD(agent_net.parameters(), lr=0.01, momentum=0.9)
        agent = pt.AdaptiveDataParallel(agent_net, agent_opt, job=job)
        agent_loader = pt.AdaptiveDataLoader(data, batch_size=world * local_bsz, job=job)

        times: dict[str, list[float]] = {"plain": [], "agent": []}
        for round_number in range(args.rounds):
            sampler.set_epoch(round_number)
            plain_s, agent_s = paired_seconds_per_step((plain, plain_opt, plain_loader),
                                                       (agent, agent_opt, agent_loader),
                                                       loss_fn)
            times["plain"].append(plain_s)
            times["agent"].append(agent_s)
            job.finish_epoch()
        ratios = [a / p for a, p in zip(times["agent"], times["plain"])]
        results[name] = {"plain_ms": 1000 * statistics.median(times["plain"]),
                         "agent_ms": 1000 * statistics.median(times["agent"]),
                         "ratio": statistics.median(ratios)}
    if rank == 0:
        print(json.dumps({**results, "_where": f"{job.backend} on {device}"}), flush=True)
    for each in reversed(jobs):  # the first one owns the process group: it leaves last
        each.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("all", "tta", "overhead"), default="all")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5, help="seeds per configuration")
    parser.add_argument("--target", type=float, default=0.96)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-epochs", type=int, default=60)
    parser.add_argument("--control-interval-s", type=float, default=0.1,
                        help="agent agreement interval (short: training lasts seconds)")
    parser.add_argument("--steps", type=int, default=200,
                        help="most steps per overhead round")
    parser.add_argument("--round-seconds", type=float, default=1.0,
                        help="target length of one overhead round (sets its steps)")
    parser.add_argument("--rounds", type=int, default=9, help="interleaved overhead rounds")
    parser.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="gloo",
                        help="overhead part: auto picks nccl on a GPU (one replica per GPU)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        overhead_worker(args)
        return
    if args.part in ("all", "tta"):
        time_to_target(args)
        print()
    if args.part in ("all", "overhead"):
        overhead(args)


if __name__ == "__main__":
    main()

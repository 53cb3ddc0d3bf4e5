"""The same training under the Pollux agent and under plain DDP, side by side (CPU, gloo).

    python bench/agent_vs_ddp.py                     # 2 replicas, 3 interleaved rounds
    python bench/agent_vs_ddp.py --replicas 1 --rounds 2
    python bench/agent_vs_ddp.py --adaptdl-python /tmp/adl-venv/bin/python   # + AdaptDL

AdaptDL 0.2.11 in its own virtual environment (it needs an older numpy)::

    python -m venv --system-site-packages /tmp/adl-venv
    /tmp/adl-venv/bin/pip install adaptdl==0.2.11 "numpy<1.24" "setuptools<81" requests

Workload: examples/train_digits.py's data and MLP (scikit-learn's digits, SGD with
momentum, initial total batch 32), trained to a target validation accuracy. Each round
runs, in an order rotated from round to round so that machine load affects all alike:

* ``ddp``: plain ``DistributedDataParallel`` + ``DistributedSampler`` at batch 32;
* ``agent-fixed``: ``AdaptiveDataParallel`` + ``AdaptiveDataLoader`` at batch 32 (the
  per-step overhead of the agent against ``ddp``);
* ``agent``: the same with ``autoscale_batch_size(512)`` (the batch sizes chosen over
  time, and the time to the target accuracy);
* ``agent-stop``: ``agent`` sent SIGTERM (every replica, as a rescale does) after 60
  steps: optimizer steps and seconds from the signal to the exit with the checkpoint
  written. Plain DDP has no stop protocol (SIGTERM kills it, nothing is saved);
* with ``--adaptdl-python``, ``adaptdl`` and ``adaptdl-stop``: the same two under
  AdaptDL 0.2.11 (``adaptdl.torch``, run by that interpreter).

Printed: one line per run, then a side-by-side table of medians.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MODES = ("ddp", "agent-fixed", "agent", "agent-stop", "adaptdl", "adaptdl-stop")
ADAPTDL_MODES = ("adaptdl", "adaptdl-stop")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(mode: str, args: argparse.Namespace, seed: int) -> list[dict[str, Any]]:
    """Run one training of ``mode`` on ``args.replicas`` processes; rank outputs' JSON."""
    port = free_port()
    procs = []
    with tempfile.TemporaryDirectory() as ckpt:
        for rank in range(args.replicas):
            env = {k: v for k, v in os.environ.items() if not k.startswith("POLLUX_")}
            env.update({"ADAPTDL_MASTER_ADDR": "127.0.0.1", "ADAPTDL_MASTER_PORT": str(port),
                        "ADAPTDL_REPLICA_RANK": str(rank),
                        "ADAPTDL_NUM_REPLICAS": str(args.replicas), "ADAPTDL_NUM_NODES": "1",
                        "ADAPTDL_CHECKPOINT_PATH": ckpt, "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"})
            env.update({"RANK": str(rank), "WORLD_SIZE": str(args.replicas),
                        "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(args.replicas),
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                        "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
                        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])})
            procs.append(subprocess.Popen(
                [args.adaptdl_python if mode in ADAPTDL_MODES else sys.executable,
                 __file__, "--worker", mode, "--seed", str(seed),
                 "--target", str(args.target), "--max-epochs", str(args.max_epochs),
                 "--checkpoint-dir", ckpt],
                env=env, cwd=REPO, text=True, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT))
        if mode.endswith("-stop"):
            _signal_when_ready(procs)
        try:
            outputs = [proc.communicate(timeout=args.timeout_s)[0] for proc in procs]
        except subprocess.TimeoutExpired:
            for proc in procs:
                proc.kill()
            raise RuntimeError(f"{mode} timed out after {args.timeout_s} s") from None
    results = []
    for proc, out in zip(procs, outputs):
        lines = [ln for ln in out.splitlines() if ln.startswith('{"mode"')]
        if not lines:
            raise RuntimeError(f"{mode} failed ({proc.returncode}):\n{out[-3000:]}")
        results.append(json.loads(lines[-1]))
    return results


def _signal_when_ready(procs: list[subprocess.Popen[str]]) -> None:
    """SIGTERM to every replica once rank 0 prints its ready line."""
    assert procs[0].stdout is not None
    buffered = []
    for line in procs[0].stdout:
        buffered.append(line)
        if line.startswith('{"ready"'):
            break
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    rest = procs[0].stdout.read()
    procs[0].communicate = lambda timeout=None: ("".join(buffered) + rest, "")  # type: ignore


# -- the worker ---------------------------------------------------------------------------


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(REPO / "examples"))
    from train_digits import build_model, split_digits

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    train, validation = split_digits(args.seed)
    net = build_model(128)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    mode = args.worker
    if mode == "ddp":
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        model: Any = torch.nn.parallel.DistributedDataParallel(net)
        sampler = torch.utils.data.DistributedSampler(train, shuffle=True, seed=args.seed)
        loader: Any = torch.utils.data.DataLoader(train, batch_size=32 // world,
                                                  sampler=sampler)
        job = None
    elif mode in ADAPTDL_MODES:
        import adaptdl.torch as adl

        adl.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        model = adl.AdaptiveDataParallel(net, optimizer)
        loader = adl.AdaptiveDataLoader(train, batch_size=32, shuffle=True)
        loader.autoscale_batch_size(512, local_bsz_bounds=(8, 256))
        job = adl
        sampler = None
    else:
        import pollux.torch as pt

        job = pt.init_process_group(checkpoint_dir=args.checkpoint_dir,
                                    config=pt.AgentConfig(log_level=None))
        rank, world = job.rank, job.num_replicas
        model = pt.AdaptiveDataParallel(net, optimizer, job=job)
        loader = pt.AdaptiveDataLoader(train, batch_size=32, shuffle=True, job=job,
                                       seed=args.seed)
        if mode in ("agent", "agent-stop"):
            loader.autoscale_batch_size(512, local_bsz_bounds=(8, 256))
        sampler = None
    signalled: list[float] = []
    if mode.endswith("-stop"):
        agents = signal.getsignal(signal.SIGTERM)

        def on_term(signum: int, frame: Any) -> None:
            signalled.append(time.perf_counter())
            if callable(agents):
                agents(signum, frame)

        signal.signal(signal.SIGTERM, on_term)
    step_times: list[float] = []
    timeline: list[tuple[float, int]] = []
    steps = 0
    steps_at_signal: int | None = None
    reached: float | None = None
    accuracy = 0.0
    start = time.perf_counter()
    last = start

    def report(**extra: Any) -> None:
        print(json.dumps({"mode": mode, "rank": rank, "steps": steps,
                          "step_s": statistics.median(step_times) if step_times else None,
                          "timeline": timeline, "time_to_target_s": reached,
                          "accuracy": accuracy, **extra}), flush=True)

    try:
        epochs: Any = (range(args.max_epochs) if job is None
                       else job.remaining_epochs_until(args.max_epochs) if mode in ADAPTDL_MODES
                       else pt.remaining_epochs_until(args.max_epochs, job))
        for epoch in epochs:
            if sampler is not None:
                sampler.set_epoch(epoch)
            for images, labels, _ in loader:
                optimizer.zero_grad()
                loss_fn(model(images), labels).backward()
                optimizer.step()
                now = time.perf_counter()
                if not getattr(model, "accumulating", False):  # no accumulation asked
                    steps += 1
                    step_times.append(now - last)
                    last = now
                    batch = 32 if job is None else int(loader.current_batch_size)
                    if not timeline or timeline[-1][1] != batch:
                        timeline.append((round(now - start, 2), batch))
                if mode.endswith("-stop") and steps == 60 and rank == 0:
                    print(json.dumps({"ready": True}), flush=True)
                if signalled and steps_at_signal is None:
                    steps_at_signal = steps
            accuracy = evaluate(model, validation, rank, world)
            if reached is None and accuracy >= args.target:
                reached = time.perf_counter() - start
                if not mode.endswith("-stop"):
                    break
    except SystemExit:
        report(stop_steps=steps - (steps_at_signal or steps),
               stop_s=time.perf_counter() - signalled[0] if signalled else None)
        raise
    report()
    if job is not None and mode not in ADAPTDL_MODES:
        job.close()
    else:
        dist.destroy_process_group()


def evaluate(model: Any, data: Any, rank: int, world: int) -> float:
    import torch
    import torch.distributed as dist

    net = model.module
    net.eval()
    share = torch.arange(rank, len(data), world)
    with torch.no_grad():
        correct = float((net(data.images[share]).argmax(1) == data.labels[share]).sum())
    counts = torch.tensor([correct, float(len(share))])
    if world > 1:
        dist.all_reduce(counts)
    net.train()
    return float(counts[0] / counts[1])


# -- the driver ---------------------------------------------------------------------------


def _median(values: list[Any]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _fmt(value: float | None, unit: str = "", digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--target", type=float, default=0.96)
    parser.add_argument("--max-epochs", type=int, default=40)
    parser.add_argument("--timeout-s", type=float, default=600)
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"comma-separated subset of {','.join(MODES)}")
    parser.add_argument("--adaptdl-python", default=None,
                        help="an interpreter with adaptdl==0.2.11: also run AdaptDL")
    parser.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint-dir", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    modes = tuple(m for m in MODES if m in args.modes.split(",")
                  and (args.adaptdl_python or m not in ADAPTDL_MODES))
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    for round_number in range(args.rounds):
        shift = round_number % len(modes)
        order = modes[shift:] + modes[:shift]
        for mode in order:
            try:
                chief = launch(mode, args, seed=round_number)[0]
            except RuntimeError as failed:  # reported, and left out of the medians
                print(f"round {round_number} {mode:12s} FAILED: {str(failed)[:300]}",
                      flush=True)
                continue
            runs[mode].append(chief)
            print(f"round {round_number} {mode:12s} steps {chief['steps']:4d}  step "
                  f"{_fmt(chief['step_s'] and chief['step_s'] * 1e3, ' ms')}  to "
                  f"{args.target:.2f}: {_fmt(chief['time_to_target_s'], ' s')}  batch "
                  f"sizes {[b for _, b in chief['timeline']]}"
                  + (f"  stop: {chief.get('stop_steps')} steps "
                     f"{_fmt(chief.get('stop_s'), ' s')}" if mode.endswith("-stop") else ""),
                  flush=True)
    def med(mode: str, key: str) -> float | None:
        return _median([r.get(key) for r in runs[mode]])

    ddp_step, fixed_step = med("ddp", "step_s"), med("agent-fixed", "step_s")
    overhead = (None if ddp_step is None or fixed_step is None
                else 100 * (fixed_step / ddp_step - 1))
    print(f"\n{args.replicas} replica(s), {args.rounds} interleaved rounds, medians:")
    print(f"{'':26s}{'plain DDP':>16s}{'Pollux agent':>16s}{'AdaptDL 0.2.11':>16s}")
    print(f"{'step at batch 32 (ms)':26s}{_fmt(ddp_step and ddp_step * 1e3):>16s}"
          f"{_fmt(fixed_step and fixed_step * 1e3):>16s}{'':>16s}"
          f"   agent overhead {_fmt(overhead, '%', 1)}")
    print(f"{'time to target (s)':26s}{_fmt(med('ddp', 'time_to_target_s')):>16s}"
          f"{_fmt(med('agent', 'time_to_target_s')):>16s}"
          f"{_fmt(med('adaptdl', 'time_to_target_s')):>16s}")
    print(f"{'stop after SIGTERM (steps)':26s}{'killed, no ckpt':>16s}"
          f"{_fmt(med('agent-stop', 'stop_steps'), '', 0):>16s}"
          f"{_fmt(med('adaptdl-stop', 'stop_steps'), '', 0):>16s}")
    print(f"{'stop after SIGTERM (s)':26s}{'-':>16s}{_fmt(med('agent-stop', 'stop_s')):>16s}"
          f"{_fmt(med('adaptdl-stop', 'stop_s')):>16s}")
    for mode in ("agent", "adaptdl"):
        for r in runs[mode]:
            print(f"batch sizes over time, {mode:8s}: "
                  + ", ".join(f"{b}@{t:g}s" for t, b in r["timeline"]))


if __name__ == "__main__":
    main()

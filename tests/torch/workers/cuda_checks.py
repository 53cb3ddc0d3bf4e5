"""Worker (GPU only): host synchronizations per step, agent against plain DDP, and AMP.

Prints one JSON line: sync warnings counted with ``torch.cuda.set_sync_debug_mode`` over
the same number of steady-state steps for plain DDP and for the agent (no agreement point
falls in the window), and an fp16 autocast + GradScaler run's statistics.
"""

from __future__ import annotations

import json
import warnings
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

import pollux.torch as pt

STEPS = 200


def mlp(device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 10)).to(device)


def count_syncs(step: Any) -> int:
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(STEPS):
                step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return sum("synchroniz" in str(w.message) for w in caught)


def main() -> None:
    config = pt.AgentConfig(control_interval_s=1e6, max_control_interval_steps=10**6,
                            noise_interval_steps=1)
    job = pt.init_process_group(config=config, install_signal_handler=False)
    device = job.device
    assert device.type == "cuda" and job.backend == "nccl", (device, job.backend)
    generator = torch.Generator().manual_seed(0)
    size = 32 * 2 * (STEPS + 60)
    data = torch.utils.data.TensorDataset(
        torch.randn(size, 64, generator=generator).to(device),
        torch.randint(0, 10, (size,), generator=generator).to(device))
    loss_fn = torch.nn.CrossEntropyLoss()

    plain_net = mlp(device)
    plain_opt = torch.optim.SGD(plain_net.parameters(), lr=0.01)
    plain = DistributedDataParallel(plain_net, device_ids=[device.index])
    plain_batches = iter(torch.utils.data.DataLoader(data, batch_size=32, shuffle=True))

    def plain_step() -> None:
        x, y = next(plain_batches)
        plain_opt.zero_grad()
        loss_fn(plain(x), y).backward()
        plain_opt.step()

    agent_net = mlp(device)
    agent_opt = torch.optim.SGD(agent_net.parameters(), lr=0.01)
    agent = pt.AdaptiveDataParallel(agent_net, agent_opt, job=job)
    loader = pt.AdaptiveDataLoader(data, batch_size=64, job=job)
    loader.autoscale_batch_size(512, (32, 32), gradient_accumulation=True)  # 2 x 32
    agent_batches = iter(loader)

    def agent_step() -> None:
        for _ in range(2):
            x, y = next(agent_batches)
            agent_opt.zero_grad()
            loss_fn(agent(x), y).backward()
            agent_opt.step()

    for _ in range(50):
        plain_step()
        agent_step()
    result: dict[str, Any] = {"plain_syncs": count_syncs(plain_step),
                              "agent_syncs": count_syncs(agent_step),
                              "noise_updates": agent.noise.num_updates}

    amp_job = pt.init_process_group(config=pt.AgentConfig(noise_interval_steps=1),
                                    install_signal_handler=False)
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0**12)
    amp_net = mlp(device)
    amp_opt = torch.optim.Adam(amp_net.parameters(), lr=1e-3)
    amp = pt.AdaptiveDataParallel(amp_net, amp_opt, job=amp_job, grad_scaler=scaler)
    amp_loader = pt.AdaptiveDataLoader(data, batch_size=64, job=amp_job)
    amp_loader.autoscale_batch_size(512, (32, 32), gradient_accumulation=True)
    losses = []
    for x, y in amp_loader:
        amp_opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16):
            loss = loss_fn(amp(x), y)
        scaler.scale(loss).backward()
        scaler.step(amp_opt)
        scaler.update()
        losses.append(float(loss))
    stats = amp.noise.stats(64)
    result.update({"amp_steps": amp.optimizer_steps, "amp_progress": amp.progress,
                   "amp_noise_updates": amp.noise.num_updates,
                   "amp_stats": None if stats is None else [stats.sqr, stats.var],
                   "amp_loss_first": losses[0], "amp_loss_last": losses[-1]})
    print(json.dumps(result), flush=True)
    job.close()


if __name__ == "__main__":
    main()

"""Worker (CUDA): the memory bound predicted from the CUDA allocator's peaks.

Trains an MLP one pass at a local batch of 64, then one at 256, then one more (at whose
start the bound knows both sizes) and prints the peaks, the device's capacity and the
bound the agent's limits carry.
"""

from __future__ import annotations

import json

import torch

import pollux.torch as pt


def main() -> None:
    job = pt.init_process_group(config=pt.AgentConfig(min_goodput_gain=1e9),
                                install_signal_handler=False)
    assert job.device.type == "cuda", job.device
    net = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                              torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
                              torch.nn.Linear(4096, 1))
    optimizer = torch.optim.SGD(net.parameters(), lr=1e-3)
    model = pt.AdaptiveDataParallel(net, optimizer, job=job)
    data = torch.utils.data.TensorDataset(torch.randn(1024, 1024), torch.randn(1024))
    loader = pt.AdaptiveDataLoader(data, batch_size=64, job=job)
    loader.autoscale_batch_size(1 << 30, local_bsz_bounds=(16, 1 << 29))
    for local_bsz in (64, 256, 256):
        loader.batch_config, loader.config_replicas = pt.BatchConfig(local_bsz), 1
        for x, y in loader:
            x, y = x.to(job.device), y.to(job.device)
            optimizer.zero_grad()
            ((model(x).squeeze(-1) - y) ** 2).mean().backward()
            optimizer.step()
    bound = model.memory_bound
    assert bound is not None and bound.reader is not None
    state = bound.state_dict()
    print(json.dumps({"peaks": state["peaks"], "capacity": bound.reader.capacity_bytes(),
                      "predicted": bound.predicted(),
                      "limit": model.bounded_limits(loader.limits).local_bsz_bounds[1]}),
          flush=True)
    job.close()


if __name__ == "__main__":
    main()

"""Worker: measure the gradient noise of linear regression, whose truth is computable.

Per-sample loss ``(x.w - y)^2 / 2`` at fixed weights (learning rate 0), so the per-sample
gradients ``(x.w - y) x`` of the data set give the exact mean and covariance.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

import pollux.torch as pt


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dims", type=int, default=16)
    parser.add_argument("--samples", type=int, default=40_000)
    parser.add_argument("--local-bsz", type=int, default=32)
    parser.add_argument("--accum-steps", type=int, default=0)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--noise-interval", type=int, default=1)
    parser.add_argument("--probe-interval", type=int, default=1,
                        help="one replica without accumulation: probe every this many steps")
    parser.add_argument("--separate-norms", action="store_true",
                        help="also measure with the replicas' norms in their own all-reduce")
    args = parser.parse_args()
    torch.set_num_threads(1)
    jobs = [measure(args, piggyback)
            for piggyback in ((True, False) if args.separate_norms else (True,))]
    for job in reversed(jobs):  # the first one owns the process group: it leaves last
        job.close()


def measure(args: argparse.Namespace, piggyback: bool) -> pt.JobContext:
    config = pt.AgentConfig(min_goodput_gain=1e9, min_noise_updates=1,
                            noise_interval_steps=args.noise_interval,
                            probe_interval_steps=args.probe_interval)
    job = pt.init_process_group(config=config, install_signal_handler=False)
    rng = np.random.default_rng(args.seed)
    x = rng.standard_normal((args.samples, args.dims))
    w_true = rng.standard_normal(args.dims)
    y = x @ w_true + rng.standard_normal(args.samples)
    delta = rng.standard_normal(args.dims)
    w0 = w_true + delta / np.linalg.norm(delta)

    residual = x @ w0 - y
    grads = residual[:, None] * x
    mean = grads.mean(axis=0)
    true_sqr = float(mean @ mean)
    true_trace = float(((grads - mean) ** 2).sum(axis=1).mean())

    net = torch.nn.Linear(args.dims, 1, bias=False)
    with torch.no_grad():
        net.weight.copy_(torch.tensor(w0, dtype=torch.float32)[None])
    optimizer = torch.optim.SGD(net.parameters(), lr=0.0)
    model = pt.AdaptiveDataParallel(net, optimizer, job=job)
    if not piggyback:
        model.piggyback_max_numel = 0
    micro = args.accum_steps + 1
    m0 = job.num_replicas * args.local_bsz * micro
    dataset = torch.utils.data.TensorDataset(torch.tensor(x, dtype=torch.float32),
                                             torch.tensor(y, dtype=torch.float32))
    loader = pt.AdaptiveDataLoader(dataset, batch_size=m0, job=job, seed=args.seed)
    loader.autoscale_batch_size(2 * m0, (args.local_bsz, args.local_bsz),
                                gradient_accumulation=micro > 1)
    for xb, yb in loader:
        optimizer.zero_grad()
        xb, yb = xb.to(job.device), yb.to(job.device)
        loss = 0.5 * ((model(xb).squeeze(-1) - yb) ** 2).mean()
        loss.backward()
        optimizer.step()
        if model.optimizer_steps >= args.steps:
            break
    assert loader.batch_config is not None
    stats = model.noise.stats(m0)
    assert stats is not None
    if job.rank == 0:
        print(json.dumps({
            "true_sqr": true_sqr, "true_trace": true_trace,
            "est_sqr": stats.sqr, "est_trace": stats.var * m0,
            "true_noise_scale": true_trace / true_sqr,
            "est_noise_scale": stats.var * m0 / stats.sqr,
            "updates": model.noise.num_updates, "local_bsz": loader.batch_config.local_bsz,
            "accum_steps": loader.batch_config.accum_steps, "piggyback": piggyback,
            "backend": job.backend,
        }), flush=True)
    return job


if __name__ == "__main__":
    main()

"""The same training script written against ``pollux.torch`` and ``pollux.adaptdl``,
for the loop-shape tests (``test_loop_shapes.py``) and their SIGTERM worker
(``workers/plain_loop.py``).

A :class:`Script` makes the job, the model and the loaders of one launch; the loops
themselves are written in the tests, as a user writes them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import torch

from pollux.torch.job import AgentConfig, JobContext

APIS = ("torch", "adaptdl")

CONFIG = AgentConfig(max_control_interval_steps=1, log_level=None, min_goodput_gain=1e9)
"""An agreement point at every step (a stop request acts at the next one)."""


def dataset(num_samples: int) -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(num_samples, 4, generator=generator)
    return torch.utils.data.TensorDataset(x, torch.arange(num_samples))


class Script:
    """One launch of a job through ``api`` (``"torch"`` or ``"adaptdl"``)."""

    def __init__(self, api: str, *, checkpoint_dir: str | None = None,
                 environ: dict[str, str] | None = None,
                 install_signal_handler: bool = False) -> None:
        if api not in APIS:
            raise ValueError(f"api={api!r}: choose from {APIS}")
        self.api = api
        if api == "torch":
            import pollux.torch as pt

            kwargs: dict[str, Any] = {} if environ is None else {"environ": environ}
            if checkpoint_dir is not None:
                kwargs["checkpoint_dir"] = checkpoint_dir
            self.job: JobContext = pt.init_process_group(
                "gloo", config=CONFIG, install_signal_handler=install_signal_handler,
                **kwargs)
        else:
            import pollux.adaptdl.torch as adl

            self.job = adl.init_process_group("gloo", config=CONFIG)

    def model(self, with_model: bool = True) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        net = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
        if not with_model:
            return net, optimizer
        if self.api == "torch":
            import pollux.torch as pt

            return pt.AdaptiveDataParallel(net, optimizer, job=self.job), optimizer
        import pollux.adaptdl.torch as adl

        return adl.AdaptiveDataParallel(net, optimizer), optimizer

    def loader(self, num_samples: int, batch_size: int, shuffle: bool = False,
               sampler: Any = None) -> Any:
        data = dataset(num_samples)
        if self.api == "torch":
            import pollux.torch as pt

            extra = {} if sampler is None else {"sampler": sampler}
            return pt.AdaptiveDataLoader(data, batch_size=batch_size, shuffle=shuffle,
                                         job=self.job, **extra)
        import pollux.adaptdl.torch as adl

        return adl.AdaptiveDataLoader(data, batch_size=batch_size, shuffle=shuffle)

    def epochs(self, num_epochs: int) -> Iterator[int]:
        if self.api == "torch":
            import pollux.torch as pt

            return pt.remaining_epochs_until(num_epochs, self.job)
        import pollux.adaptdl.torch as adl

        return iter(adl.remaining_epochs_until(num_epochs))

    def close(self) -> None:
        if self.api == "torch":
            self.job.close()
        else:
            import pollux.adaptdl.torch as adl

            adl.destroy_process_group()


class UnseededPermutations:
    """A sampler whose every order is a fresh random permutation, different in every
    process: the replicas agree only because rank 0's order is sent to all."""

    def __init__(self, num_samples: int) -> None:
        self.num_samples = num_samples

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little"))
        return iter(torch.randperm(self.num_samples, generator=generator).tolist())


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               x: torch.Tensor) -> None:
    optimizer.zero_grad()
    model(x).square().mean().backward()
    optimizer.step()


def evaluate(model: torch.nn.Module, x: torch.Tensor) -> None:
    with torch.no_grad():
        model(x)

"""Accumulator: dict-like local sums, reduced over replicas when synchronized, restored
from the checkpoint within the same epoch; loader and epoch helpers; to_tensorboard."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import pollux.torch as pt
from pollux.errors import ConfigError
from tests.torch.launcher import REPO

EXAMPLE = REPO / "examples" / "tutorial_digits.py"


@pytest.fixture
def job(tmp_path: Path) -> Iterator[pt.JobContext]:
    context = pt.init_process_group("gloo", checkpoint_dir=tmp_path / "ckpt", environ={},
                                    install_signal_handler=False)
    yield context
    context.close()


def test_accumulates_like_a_dict_and_reduces_when_synchronized(job: pt.JobContext) -> None:
    acc = pt.Accumulator(job=job, reductions={"best": "max", "acc": "mean"})
    acc["loss"] += 1.5
    acc["loss"] += torch.tensor(2.0)
    acc["best"] = 0.25
    acc["acc"] = 0.75
    assert acc["never"] == 0.0 and dict(acc) == {"loss": 3.5, "best": 0.25, "acc": 0.75}
    with acc.synchronized():
        assert acc["loss"] == 3.5 and acc["best"] == 0.25 and acc["acc"] == 0.75
        with pytest.raises(ConfigError, match="synchronized"):
            acc["loss"] = 0.0
    acc.reset()
    assert len(acc) == 0
    with pytest.raises(ConfigError, match="reductions"):
        pt.Accumulator(job=job, reductions={"x": "median"})  # type: ignore[dict-item]


def test_sums_of_integers_stay_integers(tmp_path: Path) -> None:
    first = pt.init_process_group("gloo", checkpoint_dir=tmp_path, environ={},
                                  install_signal_handler=False)
    acc = pt.Accumulator(job=first, name="counts", reductions={"most": "max"})
    acc["count"] += 3
    acc["count"] += torch.tensor(4)  # an integer tensor, e.g. (pred == y).sum()
    acc["most"] = 5
    acc["loss"] += 0.5
    with acc.synchronized():
        assert acc["count"] == 7 and type(acc["count"]) is int
        assert type(acc["most"]) is int and type(acc["loss"]) is float
        assert f"{acc['count']}/{acc['most']}" == "7/5"  # prints like AdaptDL's, not 7.0
    first.checkpoint.save()
    first.close()
    again = pt.init_process_group("gloo", checkpoint_dir=tmp_path, environ={},
                                  install_signal_handler=False)
    restored = pt.Accumulator(job=again, name="counts", reductions={"most": "max"})
    assert restored["count"] == 7 and type(restored["count"]) is int
    again.close()


def test_values_survive_a_restart_within_the_epoch_only(tmp_path: Path) -> None:
    first = pt.init_process_group("gloo", checkpoint_dir=tmp_path, environ={},
                                  install_signal_handler=False)
    acc = pt.Accumulator(job=first, name="train")
    acc["loss"] += 4.0
    first.checkpoint.save()
    first.close()
    again = pt.init_process_group("gloo", checkpoint_dir=tmp_path, environ={},
                                  install_signal_handler=False)
    assert pt.Accumulator(job=again, name="train")["loss"] == 4.0
    assert pt.Accumulator(job=again, name="other")["loss"] == 0.0
    again.finish_epoch()
    again.checkpoint.save()
    again.close()
    third = pt.init_process_group("gloo", checkpoint_dir=tmp_path, environ={},
                                  install_signal_handler=False)
    assert pt.Accumulator(job=third, name="train")["loss"] == 0.0  # an earlier epoch's
    third.close()


class Writer:
    def __init__(self) -> None:
        self.scalars: dict[str, float] = {}

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.scalars[tag] = value


def test_current_loader_epoch_and_tensorboard_scalars(job: pt.JobContext) -> None:
    net = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    model = pt.AdaptiveDataParallel(net, optimizer, job=job)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    loader = pt.AdaptiveDataLoader(data, batch_size=16, job=job)
    assert pt.current_dataloader(job) is None and pt.current_epoch(job) == 0
    for x, y in loader:
        assert pt.current_dataloader(job) is loader
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    assert pt.current_dataloader(job) is None
    writer = Writer()
    loader.to_tensorboard(writer, step=1)
    assert writer.scalars["pollux/batch_size"] == 16.0 and "pollux/progress" in writer.scalars


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None,
                    reason="needs the [tensorboard] extra")
def test_to_tensorboard_writes_an_event_file(job: pt.JobContext, tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    net = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    model = pt.AdaptiveDataParallel(net, optimizer, job=job)
    loader = pt.AdaptiveDataLoader(torch.utils.data.TensorDataset(
        torch.randn(32, 4), torch.randn(32, 1)), batch_size=16, job=job)
    for x, y in loader:
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    with SummaryWriter(tmp_path / "runs") as writer:
        loader.to_tensorboard(writer, step=0)
    assert list((tmp_path / "runs").glob("events.out.tfevents.*"))


def test_the_tutorial_port_runs_on_two_replicas(tmp_path: Path) -> None:
    """AdaptDL's tutorial structure (examples/tutorial_digits.py) under torchrun-like
    variables: test metrics summed over both replicas by the Accumulator."""
    from tests.torch.launcher import free_port, torchrun_env

    port = free_port()
    procs = []
    for rank in range(2):
        env = torchrun_env(rank, 2, port, CUDA_VISIBLE_DEVICES="",
                           PYTHONPATH=str(REPO / "src"))
        procs.append(subprocess.Popen(
            [sys.executable, str(EXAMPLE), "--epochs", "1", "--log-interval", "1000"],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True))
    outputs = [proc.communicate(timeout=240)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    for out in outputs:  # every replica prints the totals over both: all 360 test digits
        assert "/360 (" in out, out
    assert (tmp_path / "pollux-checkpoints" / "tutorial_digits").is_dir()
    if dist.is_initialized():  # nothing leaked into this process
        pytest.fail("the test process joined a process group")


def test_sums_maxima_and_means_survive_a_restart_on_another_replica_count(
        tmp_path: Path) -> None:
    from tests.torch.launcher import WORKERS, Replicas

    script = str(WORKERS / "accumulator_restart.py")
    first = Replicas([script, "--phase", "add"], 2, checkpoint_dir=tmp_path / "ckpt",
                     log_dir=tmp_path / "logs")
    assert first.wait(timeout_s=120) == [0, 0], first.output()
    again = Replicas([script, "--phase", "read"], 3, checkpoint_dir=tmp_path / "ckpt",
                     log_dir=tmp_path / "logs", num_restarts=1)
    assert again.wait(timeout_s=120) == [0, 0, 0], again.output()
    totals = again.last_json()
    assert totals["n"] == 3 + 3 and totals["best"] == 20.0  # saved sum + one per replica
    assert totals["acc"] == pytest.approx(0.625)

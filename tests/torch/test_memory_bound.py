"""The memory-aware bound on the local batch: the fit of peak memory, the bound after an
out-of-memory error (kept across a restart), and a real job under ``pollux submit``."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

import pollux.torch as pt
from pollux.jobenv import RESCALE_EXIT_CODE
from pollux.models import JobHints
from pollux.torch.batch_size import BatchLimits
from pollux.torch.memory_bound import (
    BOUNDS_FILE,
    RISE_AFTER_STEPS,
    LocalBatchBound,
    fit_peak_memory,
)
from tests.service.e2e_helpers import REPO, ServerProcess, checkpoint_dir, launch_log, wait_until
from tests.torch.launcher import WORKERS

MIB = 1 << 20


class FakeMemory:
    """A device whose steps peak at ``fixed + per_sample * local batch`` bytes."""

    def __init__(self, fixed: int, per_sample: int, capacity: int) -> None:
        self.fixed, self.per_sample, self.capacity = fixed, per_sample, capacity
        self.local_bsz = 0
        self.resets = 0

    def reset_peak(self) -> None:
        self.resets += 1

    def peak_bytes(self) -> int | None:
        return self.fixed + self.per_sample * self.local_bsz

    def capacity_bytes(self) -> int | None:
        return self.capacity


def test_fit_is_exact_on_a_line_and_errs_small_on_one_point() -> None:
    fit = fit_peak_memory({16: 100 * MIB + 16 * MIB, 32: 100 * MIB + 32 * MIB})
    assert fit is not None
    assert fit.fixed_bytes == pytest.approx(100 * MIB) and fit.per_sample_bytes == pytest.approx(MIB)
    assert fit.largest_fitting(1000 * MIB, headroom=1.0) == 900
    one = fit_peak_memory({16: 116 * MIB})  # all counted per sample: a smaller bound
    assert one is not None and one.largest_fitting(1000 * MIB, headroom=1.0) < 900
    assert fit_peak_memory({}) is None


@settings(max_examples=50, deadline=None)  # (a loaded machine must not make it flaky)
@given(st.dictionaries(st.integers(1, 512), st.integers(1, 1 << 40), min_size=1, max_size=8))
def test_the_fitted_line_lies_above_every_peak_seen(peaks: dict[int, int]) -> None:
    fit = fit_peak_memory(peaks)
    assert fit is not None and fit.per_sample_bytes > 0 and fit.fixed_bytes >= 0
    for bsz, peak in peaks.items():
        assert fit.fixed_bytes + fit.per_sample_bytes * bsz >= peak * (1 - 1e-9)


def test_out_of_memory_bound_is_kept_per_type_and_survives_a_restart(tmp_path: Path) -> None:
    bound = LocalBatchBound("a100", None, directory=tmp_path)
    assert bound.upper_bound() is None
    bound.observe_step(32)
    assert bound.out_of_memory(96) == 32  # the largest that completed a step
    limits = BatchLimits(16, 1024, (8, 256), accumulation=False)
    assert bound.limits(limits).local_bsz_bounds == (8, 32)
    assert json.loads((tmp_path / BOUNDS_FILE).read_text()) == {
        "a100": {"bound": 32, "failed": 96}}
    restarted = LocalBatchBound("a100", None, directory=tmp_path)  # read from the file
    assert restarted.upper_bound() == 32
    other = LocalBatchBound("v100", None, directory=tmp_path)  # another type: its own
    assert other.upper_bound() is None
    assert other.out_of_memory(8) == 4  # nothing completed: half of the failed batch
    assert other.limits(limits).local_bsz_bounds == (8, 8)  # never below the job's floor
    saved = LocalBatchBound("a100", None)
    saved.load_state_dict(restarted.state_dict())  # the checkpoint keeps it too
    assert saved.upper_bound() == 32


def test_the_bound_rises_halfway_to_the_failed_batch_when_the_fit_shows_headroom(
        tmp_path: Path) -> None:
    """32 fits, 96 ran out of memory; steps at 32 peak at 10 MiB + 1 MiB per sample on a
    1 GiB device (the fit predicts ~900): after RISE_AFTER_STEPS steps the bound rises to
    (32 + 96) / 2 = 64; out of memory at 64 lowers it to 32 again (64 failed), then it
    rises to 48; without a reader it never rises."""
    memory = FakeMemory(10 * MIB, MIB, 1024 * MIB)
    bound = LocalBatchBound("a100", memory, directory=tmp_path)
    memory.local_bsz = 32
    bound.observe_step(32)
    assert bound.out_of_memory(96) == 32
    for _ in range(RISE_AFTER_STEPS - 1):
        bound.observe_step(32)
    assert bound.upper_bound() == 32  # not before RISE_AFTER_STEPS steps at the bound
    bound.observe_step(32)
    assert bound.upper_bound() == 64
    assert json.loads((tmp_path / BOUNDS_FILE).read_text()) == {
        "a100": {"bound": 64, "failed": 96}}
    assert bound.out_of_memory(64) == 32
    for _ in range(RISE_AFTER_STEPS):
        bound.observe_step(32)
    assert bound.upper_bound() == 48
    assert LocalBatchBound("a100", None, directory=tmp_path).upper_bound() == 48
    blind = LocalBatchBound("cpu", None)
    blind.observe_step(32)
    assert blind.out_of_memory(96) == 32
    for _ in range(2 * RISE_AFTER_STEPS):
        blind.observe_step(32)
    assert blind.upper_bound() == 32


@pytest.fixture()
def process_group() -> Iterator[None]:
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if created:
        dist.destroy_process_group()


def test_predicted_bound_from_a_fake_reader_caps_the_limits_and_the_hints(
        process_group: None, tmp_path: Path) -> None:
    """Steps at local batch 16 and 24 peak at 64 MiB + 2 MiB per sample on a 256 MiB
    device: at most floor((0.9 x 256 - 64) / 2) = 83 samples fit; the hints say so
    (reported at the start of the third pass, the first to know both sizes)."""
    hints = tmp_path / "hints.json"
    job = pt.init_process_group(
        "gloo", config=pt.AgentConfig(hints_interval_s=0.05, min_goodput_gain=1e9),
        install_signal_handler=False, checkpoint_dir=tmp_path / "ckpt",
        environ={"POLLUX_HINTS_TARGET": str(hints)})
    memory = FakeMemory(64 * MIB, 2 * MIB, 256 * MIB)
    net = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    model = pt.AdaptiveDataParallel(net, optimizer, job=job, memory_reader=memory)
    data = torch.utils.data.TensorDataset(torch.randn(80, 4), torch.randn(80))
    loader = pt.AdaptiveDataLoader(data, batch_size=16, job=job)
    loader.autoscale_batch_size(1024, local_bsz_bounds=(4, 512))
    for local_bsz in (16, 24, 24):
        loader.batch_config, loader.config_replicas = pt.BatchConfig(local_bsz), 1
        for x, y in loader:
            memory.local_bsz = len(x)
            optimizer.zero_grad()
            ((model(x).squeeze(-1) - y) ** 2).mean().backward()
            optimizer.step()
    assert memory.resets == model.optimizer_steps > 0
    assert model.bounded_limits(loader.limits).local_bsz_bounds == (4, 83)
    job.close()
    reported = JobHints.from_dict(json.loads(hints.read_text()))
    assert reported.local_bsz_bounds == (4, 83)


class OutOfMemoryAbove(torch.nn.Module):
    def __init__(self, limit: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)
        self.limit = limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > self.limit:
            raise torch.OutOfMemoryError("injected")
        return self.linear(x).squeeze(-1)


def test_out_of_memory_in_forward_leaves_for_a_restart_with_the_bound(
        process_group: None, tmp_path: Path) -> None:
    """In one process: a pass at 32 completes, the next one at 64 raises out of memory:
    the job leaves with the rescale exit code, and the restarted job's limits stop at 32."""
    ckpt = tmp_path / "ckpt"

    def start() -> tuple[pt.JobContext, pt.AdaptiveDataParallel, pt.AdaptiveDataLoader]:
        job = pt.init_process_group("gloo", install_signal_handler=False,
                                    checkpoint_dir=ckpt, environ={})
        net = OutOfMemoryAbove(48)
        model = pt.AdaptiveDataParallel(net, torch.optim.SGD(net.parameters(), lr=0.1),
                                        job=job)
        data = torch.utils.data.TensorDataset(torch.randn(256, 4), torch.randn(256))
        loader = pt.AdaptiveDataLoader(data, batch_size=32, job=job)
        loader.autoscale_batch_size(256, local_bsz_bounds=(8, 128))
        return job, model, loader

    job, model, loader = start()

    def train_one_pass() -> None:
        for x, y in loader:
            model.optimizer.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            model.optimizer.step()

    train_one_pass()
    assert model.optimizer_steps == 256 // 32
    loader.batch_config, loader.config_replicas = pt.BatchConfig(64), 1  # the agent's 64
    with pytest.raises(SystemExit) as leaving:
        train_one_pass()
    assert leaving.value.code == RESCALE_EXIT_CODE
    assert json.loads((ckpt / BOUNDS_FILE).read_text()) == {"cpu": {"bound": 32, "failed": 64}}
    job, model, loader = start()
    assert model.bounded_limits(loader.limits).local_bsz_bounds == (8, 32)
    job.close()


class OutOfMemoryInStep(torch.optim.SGD):
    """SGD whose step runs out of memory above ``limit`` samples (``local``: the batch)."""

    def __init__(self, params: Any, limit: int) -> None:
        super().__init__(params, lr=0.1)
        self.limit, self.local = limit, 0

    def step(self, closure: Any = None) -> Any:
        if self.local > self.limit:
            raise torch.OutOfMemoryError("injected in the optimizer step")
        return super().step(closure)


def test_out_of_memory_in_the_optimizer_step_leaves_for_a_restart_with_the_bound(
        process_group: None, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    job = pt.init_process_group("gloo", install_signal_handler=False,
                                checkpoint_dir=ckpt, environ={})
    net = torch.nn.Linear(4, 1)
    optimizer = OutOfMemoryInStep(net.parameters(), limit=48)
    model = pt.AdaptiveDataParallel(net, optimizer, job=job)
    data = torch.utils.data.TensorDataset(torch.randn(128, 4), torch.randn(128))
    loader = pt.AdaptiveDataLoader(data, batch_size=32, job=job)
    loader.autoscale_batch_size(256, local_bsz_bounds=(8, 128))

    def train_one_pass() -> None:
        for x, y in loader:
            optimizer.local = len(x)
            optimizer.zero_grad()
            ((model(x).squeeze(-1) - y) ** 2).mean().backward()
            optimizer.step()

    train_one_pass()
    loader.batch_config, loader.config_replicas = pt.BatchConfig(64), 1
    with pytest.raises(SystemExit) as leaving:
        train_one_pass()
    assert leaving.value.code == RESCALE_EXIT_CODE
    assert json.loads((ckpt / BOUNDS_FILE).read_text()) == {"cpu": {"bound": 32, "failed": 64}}
    assert optimizer.param_groups[0]["lr"] == 0.1  # the scaled rate was put back


@pytest.mark.timeout(240)
def test_a_job_out_of_memory_above_48_succeeds_under_pollux_submit(tmp_path: Path) -> None:
    """The worker's forward raises ``torch.OutOfMemoryError`` above a local batch of 48
    while the agent grows the batch towards 512: the job restarts once at a batch that
    fits (exit 75, no failure), trains at <= 48 from then on, succeeds, and its hints'
    largest local batch is <= 48."""
    server = ServerProcess(tmp_path / "data")
    try:
        client = server.start()
        spec = {"name": "oom", "max_replicas": 1, "working_dir": str(REPO),
                "command": [sys.executable, str(WORKERS / "oom_job.py"), "--epochs", "2",
                            "--samples", "1500"],
                "max_failures": 0}
        job_id = client.submit(spec)["id"]
        wait_until(lambda: client.job(job_id)["state"] in ("Succeeded", "Failed"), 200,
                   "the job to end")
        detail = client.job(job_id)
        assert detail["state"] == "Succeeded", server.log_text()
        assert detail["failures"] == 0
        first = launch_log(server.data_dir, job_id, 1)  # (generations count from 1)
        failed = re.search(r"out of memory at a local batch of (\d+)", first)
        assert failed is not None and int(failed.group(1)) > 48, server.log_text()
        ckpt = checkpoint_dir(server.data_dir, job_id)
        steps = [json.loads(line) for line in (ckpt / "steps.jsonl").read_text().splitlines()]
        assert max(s["launch"] for s in steps) >= 1  # restarted after the out-of-memory
        assert all(s["local_bsz"] <= 48 for s in steps)
        bound = json.loads((ckpt / BOUNDS_FILE).read_text())["cpu"]["bound"]
        assert bound <= 48
        hints = JobHints.from_dict(detail["hints"])
        assert hints.local_bsz_bounds[1] == bound and hints.max_batch_size == 512
        server.stop()
    finally:
        server.cleanup()

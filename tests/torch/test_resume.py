"""Exact resume of the digits example: SIGTERM at random steps, resized 2 -> 1 -> 3."""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from pollux.jobenv import RESCALE_EXIT_CODE
from pollux.models import JobHints
from tests.torch.launcher import EXAMPLE, Replicas

NUM_TRAIN = 1437  # digits (1797) minus the 360 validation samples
ARGS = [str(EXAMPLE), "--epochs", "3", "--no-autoscale", "--quiet",
        "--control-interval-s", "0.1"]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def per_epoch(samples: list[dict[str, Any]]) -> dict[int, Counter[int]]:
    epochs: dict[int, Counter[int]] = {}
    for record in samples:
        epochs.setdefault(record["epoch"], Counter()).update(record["indices"])
    return epochs


def wait_for_event(events: Path, launch: int, kind: str, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if events.exists() and any(e["launch"] == launch and e["event"] == kind
                                   for e in read_jsonl(events)):
            return
        time.sleep(0.05)
    raise AssertionError(f"launch {launch} never logged {kind!r}")


def test_interrupted_and_resized_run_consumes_every_sample_exactly_once(
        tmp_path: Path) -> None:
    reference_dir = tmp_path / "reference"
    reference = Replicas(ARGS, 1, checkpoint_dir=reference_dir, log_dir=tmp_path / "logs-ref")
    assert reference.wait(120) == [0], reference.output()
    expected = per_epoch(read_jsonl(reference_dir / "samples.jsonl"))
    assert sorted(expected) == [0, 1, 2]
    assert all(counts == Counter(range(NUM_TRAIN)) for counts in expected.values())

    rng = np.random.default_rng(20240601)
    ckpt = tmp_path / "ckpt"
    events = ckpt / "events.jsonl"
    hints = ckpt / "hints.json"
    # moved between GPU types as the scheduler would on a typed cluster: a, b, then a
    for launch, (replicas, gpu_type) in enumerate([(2, "a"), (1, "b"), (3, "a")]):
        job = Replicas([*ARGS, "--step-delay-s", "0.01"], replicas, checkpoint_dir=ckpt,
                       log_dir=tmp_path / "logs", num_restarts=launch,
                       hints_target=str(hints), environ={"POLLUX_GPU_TYPE": gpu_type})
        if launch < 2:
            wait_for_event(events, launch, "start")
            time.sleep(float(rng.uniform(0.1, 0.5)))
            job.signal(signal.SIGTERM)
            assert job.wait(120) == [RESCALE_EXIT_CODE] * replicas, job.output()
        else:
            assert job.wait(120) == [0] * replicas, job.output()

    samples = read_jsonl(ckpt / "samples.jsonl")
    assert per_epoch(samples) == expected
    assert {r["num_replicas"] for r in samples} == {1, 2, 3}
    for record in samples:
        assert len(record["padding"]) < record["num_replicas"]

    log = read_jsonl(events)
    kinds = [(e["launch"], e["event"]) for e in log]
    assert kinds == [(0, "start"), (0, "stop"), (1, "start"), (1, "stop"), (2, "start"),
                     (2, "end")]
    for stop, start in ((log[1], log[2]), (log[3], log[4])):
        assert start["restored"]
        for key in ("epoch", "optimizer_steps", "progress"):
            assert start[key] == stop[key], (key, stop, start)
    assert log[1]["optimizer_steps"] > 0 and log[3]["optimizer_steps"] > log[1]["optimizer_steps"]
    assert log[-1]["epoch"] == 3

    reported = JobHints.from_dict(json.loads(hints.read_text()))
    assert reported.max_profiled_replicas == 3
    assert reported.throughput_params is not None and reported.grad_stats is not None
    # one profile per type, never pooled: b saw 1 replica only, a 2 then 3
    assert reported.gpu_type == "a" and sorted(reported.type_profiles) == ["a", "b"]
    assert reported.type_profiles["a"].max_profiled_replicas == 3
    assert reported.type_profiles["a"].throughput_params == reported.throughput_params
    assert reported.type_profiles["b"].max_profiled_replicas == 1


def test_sigkill_resumes_from_the_last_periodic_checkpoint(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    args = [*ARGS, "--checkpoint-interval-s", "0.2"]
    crashed = Replicas([*args, "--step-delay-s", "0.01"], 1, checkpoint_dir=ckpt,
                       log_dir=tmp_path / "logs")
    wait_for_event(ckpt / "events.jsonl", 0, "start")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(
            f.name >= "checkpoint-00000002.pt" for f in ckpt.glob("checkpoint-*.pt")):
        time.sleep(0.02)
    time.sleep(0.1)
    crashed.signal(signal.SIGKILL)
    assert crashed.wait(30) == [-signal.SIGKILL]
    resumed = Replicas(args, 1, checkpoint_dir=ckpt, log_dir=tmp_path / "logs",
                       num_restarts=1)
    assert resumed.wait(120) == [0], resumed.output()
    starts = [e for e in read_jsonl(ckpt / "events.jsonl") if e["event"] == "start"]
    assert starts[1]["restored"] and starts[1]["optimizer_steps"] > 0
    epochs = per_epoch(read_jsonl(ckpt / "samples.jsonl"))
    assert sorted(epochs) == [0, 1, 2]
    assert all(counts == Counter(range(NUM_TRAIN)) for counts in epochs.values())

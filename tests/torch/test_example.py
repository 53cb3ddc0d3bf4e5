"""The digits example runs alone and under torchrun's environment, autoscaling exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from tests.torch.launcher import EXAMPLE, REPO, free_port, torchrun_env

NUM_TRAIN = 1437


def summary(output: str) -> dict[str, object]:
    lines = [ln for ln in output.splitlines() if ln.startswith("{")]
    assert lines, output
    return dict(json.loads(lines[-1]))


def test_runs_as_a_single_process(tmp_path: Path) -> None:
    """Run by hand (in a fresh directory: it checkpoints in ./pollux-checkpoints)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLLUX_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, str(EXAMPLE), "--epochs", "2", "--quiet"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    result = summary(out.stdout)
    assert result["epochs"] == 2 and result["num_replicas"] == 1
    assert float(result["accuracy"]) > 0.8  # type: ignore[arg-type]
    assert (tmp_path / "pollux-checkpoints" / "train_digits").is_dir()


def test_two_torchrun_replicas_autoscale_and_still_consume_each_sample_once(
        tmp_path: Path) -> None:
    port = free_port()
    procs = []
    for rank in range(2):
        env = torchrun_env(rank, 2, port, POLLUX_CHECKPOINT_DIR=str(tmp_path),
                           POLLUX_HINTS_TARGET=str(tmp_path / "hints.json"))
        procs.append(subprocess.Popen(
            [sys.executable, str(EXAMPLE), "--epochs", "5", "--quiet",
             "--control-interval-s", "0.05", "--batch-size", "32"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO))
    outputs = [proc.communicate(timeout=120)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], "\n".join(outputs)
    result = summary(outputs[0])
    assert result["num_replicas"] == 2 and result["epochs"] == 5
    hints = json.loads((tmp_path / "hints.json").read_text())
    assert hints["throughput_params"] is not None and hints["max_profiled_replicas"] == 2
    # no type from a scheduler, no CUDA: the profile is the CPU's
    assert hints["gpu_type"] == "cpu" and list(hints["type_profiles"]) == ["cpu"]
    assert hints["type_profiles"]["cpu"]["max_profiled_replicas"] == 2
    records = [json.loads(ln) for ln in (tmp_path / "samples.jsonl").read_text().splitlines()]
    epochs: dict[int, Counter[int]] = {}
    for record in records:
        epochs.setdefault(record["epoch"], Counter()).update(record["indices"])
    assert sorted(epochs) == list(range(5))
    assert all(c == Counter(range(NUM_TRAIN)) for c in epochs.values())

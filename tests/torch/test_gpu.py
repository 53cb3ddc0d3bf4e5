"""GPU checks (skipped without CUDA): NCCL, CUDA-event profiling, no host syncs, AMP.

Run on a GPU machine with ``bench/agent_gpu_check.sh``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.torch.launcher import EXAMPLE, REPO, WORKERS

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def run(argv: list[str], tmp_path: Path, extra_env: dict[str, str] | None = None
        ) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("POLLUX_") and k not in ("RANK", "WORLD_SIZE")}
    env["POLLUX_CHECKPOINT_DIR"] = ""  # no default ./pollux-checkpoints (--checkpoint-dir wins)
    env.update(extra_env or {})
    out = subprocess.run([sys.executable, *argv], capture_output=True, text=True,
                         timeout=300, cwd=REPO, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    assert lines, out.stdout + out.stderr
    return dict(json.loads(lines[-1]))


def test_example_trains_on_the_gpu_with_nccl(tmp_path: Path) -> None:
    result = run([str(EXAMPLE), "--epochs", "4", "--quiet", "--checkpoint-dir",
                  str(tmp_path)], tmp_path)
    assert result["backend"] == "nccl" and str(result["device"]).startswith("cuda")
    assert result["accuracy"] > 0.85
    resumed = run([str(EXAMPLE), "--epochs", "5", "--quiet", "--checkpoint-dir",
                   str(tmp_path)], tmp_path)
    assert resumed["epochs"] == 5
    assert resumed["optimizer_steps"] > result["optimizer_steps"]


def test_noise_scale_on_the_gpu_within_15_percent(tmp_path: Path) -> None:
    result = run([str(WORKERS / "noise_regression.py"), "--accum-steps", "1", "--steps",
                  "200"], tmp_path)
    assert result["backend"] == "nccl"
    truth = result["true_noise_scale"]
    assert abs(result["est_noise_scale"] - truth) / truth < 0.15


def test_no_extra_host_syncs_and_amp_statistics(tmp_path: Path) -> None:
    result = run([str(WORKERS / "cuda_checks.py")], tmp_path)
    assert result["agent_syncs"] <= result["plain_syncs"], result
    assert result["noise_updates"] >= 200
    assert result["amp_steps"] > 0 and result["amp_noise_updates"] > 0
    assert result["amp_stats"] is not None and all(map(math.isfinite, result["amp_stats"]))
    assert result["amp_loss_last"] < result["amp_loss_first"]


def test_the_agent_keys_its_profile_by_the_cuda_device_name(tmp_path: Path) -> None:
    """Without a type from the scheduler, the hints name the GPU as CUDA does."""
    hints_path = tmp_path / "hints.json"
    run([str(EXAMPLE), "--epochs", "2", "--quiet", "--checkpoint-dir", str(tmp_path / "c")],
        tmp_path, {"POLLUX_HINTS_TARGET": str(hints_path)})
    hints = json.loads(hints_path.read_text())
    name = torch.cuda.get_device_name(0)
    assert hints["gpu_type"] == name and list(hints["type_profiles"]) == [name]
    assert hints["type_profiles"][name]["throughput_params"] == hints["throughput_params"]


def test_the_memory_bound_is_predicted_from_the_cuda_peaks(tmp_path: Path) -> None:
    """Peaks at local batches 64 and 256 from the CUDA allocator: the larger batch peaks
    higher, and the bound (the limits' largest local batch) is the fit's prediction,
    above 256 and below what the capacity over the per-sample growth allows."""
    result = run([str(WORKERS / "cuda_memory.py")], tmp_path)
    peaks = {int(b): int(p) for b, p in result["peaks"].items()}
    assert sorted(peaks) == [64, 256] and peaks[256] > peaks[64] > 0, result
    per_sample = (peaks[256] - peaks[64]) / 192
    predicted = int(result["predicted"])
    assert result["limit"] == predicted, result
    assert 256 < predicted <= result["capacity"] / per_sample, result

"""The policy of "Writing your own policy" (docs/research/custom-policy.md): about thirty
lines, loaded by ``module:Class``, run in the simulator beside a built-in policy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.docs.markdown_blocks import blocks, script, write_files

PAGE = Path(__file__).resolve().parents[2] / "docs" / "research" / "custom-policy.md"


def test_policy_example_is_about_thirty_lines():
    (policy,) = [b for b in blocks(PAGE) if b.title == "greedy_policy.py"]
    assert 20 <= len(policy.text.splitlines()) <= 35


def test_policy_example_runs_in_the_simulator(tmp_path: Path):
    page = blocks(PAGE)
    write_files(page, tmp_path)
    env = {**os.environ,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(["bash", "-c", script(page)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    runs = json.loads((tmp_path / "runs.json").read_text())["runs"]
    by_policy = {run["policy"]: run for run in runs}
    assert set(by_policy) == {"tiresias", "greedy_policy:GreedySpeedup"}
    mine = by_policy["greedy_policy:GreedySpeedup"]
    assert mine["num_completed"] == mine["num_jobs"] == 8  # every job got GPUs and finished
    assert 0 < mine["gpu_utilization"] <= 1
    assert done.stdout.strip().endswith("{}")  # use_policy.py: no jobs, no allocations

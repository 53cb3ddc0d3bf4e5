"""A stop request (SIGTERM, as the scheduler sends on a rescale) checkpoints and exits
within two optimizer steps, even when agreement points are a second apart and only one
replica was signalled (issue #25 item 5: 5-7 steps before)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from pollux.jobenv import RESCALE_EXIT_CODE
from tests.torch.launcher import WORKERS, Replicas


def wait_until_ready(job: Replicas, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if job.logs[0].exists() and '"ready"' in job.logs[0].read_text(errors="replace"):
            return
        if any(proc.poll() is not None for proc in job.procs):
            break
        time.sleep(0.05)
    job.kill()
    raise AssertionError(f"never ready; logs:\n{job.output()}")


@pytest.mark.parametrize("num_replicas", [1, 2])
def test_sigterm_checkpoints_and_exits_within_two_steps(tmp_path: Path,
                                                        num_replicas: int) -> None:
    job = Replicas([str(WORKERS / "stop_latency.py")], num_replicas,
                   checkpoint_dir=tmp_path / "ckpt", log_dir=tmp_path / "logs")
    wait_until_ready(job)
    signalled = job.procs[-1]  # the last rank only: the others learn it from the job
    signalled.send_signal(signal.SIGTERM)
    assert job.wait(timeout_s=60) == [RESCALE_EXIT_CODE] * num_replicas, job.output()
    results = [job.last_json(rank) for rank in range(num_replicas)]
    exits = {int(r["exit_step"]) for r in results}
    assert len(exits) == 1, results  # every replica stopped at the same step
    signal_step = results[-1]["signal_step"]
    assert signal_step is not None, results
    assert exits.pop() - int(signal_step) <= 2, results
    assert any((tmp_path / "ckpt").iterdir())  # the stop checkpoint

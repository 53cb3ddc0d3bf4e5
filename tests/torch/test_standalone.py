"""A training script run by hand (no scheduler, no torchrun, no checkpoint setting):
default checkpoint directory, Ctrl-C checkpoints like SIGTERM, visible agent messages."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import pollux.torch as pt
from pollux.jobenv import RESCALE_EXIT_CODE
from tests.torch.launcher import REPO, WORKERS

SCRIPT = WORKERS / "standalone.py"


def standalone_env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("POLLUX_") and key not in (
               "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": "",
                "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])})
    return env


def test_ctrl_c_checkpoints_in_the_default_directory_and_a_rerun_resumes(
        tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--epochs", "2", "--sleep-s", "0.05"],
                            cwd=tmp_path, env=standalone_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    notice = proc.stderr.readline()  # the first thing the agent says, on stderr
    assert "checkpoints in pollux-checkpoints/standalone" in notice, notice
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == RESCALE_EXIT_CODE, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "interrupted: checkpointing" in err and "run again to resume" in err, err
    directory = tmp_path / "pollux-checkpoints" / "standalone"
    assert list(directory.glob("checkpoint-*.pt")), list(tmp_path.rglob("*"))

    rerun = subprocess.run([sys.executable, str(SCRIPT), "--epochs", "2"], cwd=tmp_path,
                           env=standalone_env(), capture_output=True, text=True, timeout=60)
    assert rerun.returncode == 0, rerun.stderr
    epochs = [json.loads(line) for line in rerun.stdout.splitlines()]
    assert [e["epoch"] for e in epochs] == [0, 1] and epochs[0]["restored"], epochs
    assert "resuming from the checkpoint in pollux-checkpoints/standalone" in rerun.stderr
    assert "batch size 16 (1 replica x 16 samples)" in rerun.stderr, rerun.stderr


def test_checkpointing_turned_off_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="pollux"):
        job = pt.init_process_group("gloo", environ={"POLLUX_CHECKPOINT_DIR": ""},
                                    install_signal_handler=False)
        try:
            assert not job.checkpoint.enabled
        finally:
            job.close()
    assert "checkpointing is off" in caplog.text


def test_default_directory_is_named_after_the_script() -> None:
    assert pt.standalone_checkpoint_dir("/x/train.py") == os.path.join(
        "pollux-checkpoints", "train")
    assert pt.standalone_checkpoint_dir("-c") == os.path.join("pollux-checkpoints", "python")

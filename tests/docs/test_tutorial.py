"""The tutorial "your first adaptive job" (docs/train/tutorial.md), run start to finish on
a CPU as a reader would: its files saved, its commands run in order in one shell."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.markdown_blocks import blocks, script, write_files

pytest.importorskip("torch")
pytest.importorskip("fastapi")

PAGE = Path(__file__).resolve().parents[2] / "docs" / "train" / "tutorial.md"


def test_tutorial_blocks_are_files_and_commands():
    page = blocks(PAGE)
    assert [b.title for b in page if b.title] == ["train_plain.py", "train.py"]
    commands = script(page)
    for step in ("python train_plain.py", "python train.py", "pollux server",
                 "pollux submit", "pollux logs tutorial-1 --follow"):
        assert step in commands, step
    assert "torchrun" not in commands  # shown, marked not run


def test_tutorial_runs_start_to_finish(tmp_path: Path):
    page = blocks(PAGE)
    write_files(page, tmp_path)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "120",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("POLLUX_TOKEN", None)
    env.pop("POLLUX_SERVER", None)
    try:
        done = subprocess.run(["bash", "-c", script(page)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=540)
    finally:
        pid_file = tmp_path / "server.pid"
        if pid_file.exists():  # the page's last step stops it; a failed step may not get there
            try:
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
            except ProcessLookupError:
                pass
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert output.count("epoch 2: accuracy") == 3, output[-4000:]  # each run trained 3 epochs
    assert "checkpoints in pollux-checkpoints/train" in output  # run by hand
    assert "submitted tutorial-1" in output
    assert "Succeeded" in output, output[-4000:]
    assert (tmp_path / "pollux-data" / "jobs" / "tutorial-1" / "checkpoint").is_dir()
    assert not (tmp_path / "pollux-checkpoints").exists()  # the page removed its own

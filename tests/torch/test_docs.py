"""The agent's documentation: every public name shows an example, the runnable ones run,
and README's "Writing a training script" template runs as written."""

from __future__ import annotations

import doctest
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pollux.torch as pt
from tests.torch.launcher import REPO

MODULES = ("accumulator", "batch_decider", "batch_size", "data_loader", "data_parallel",
           "distributed", "launch", "elastic_sampler", "epochs", "gradient_noise", "job",
           "scaling_rules", "checkpoint")


@pytest.mark.parametrize("name", pt.__all__)
def test_every_public_name_has_an_example(name: str) -> None:
    doc = getattr(pt, name).__doc__ or ""
    assert ">>>" in doc or "::" in doc, f"pollux.torch.{name} has no example in its docstring"


@pytest.mark.parametrize("module", MODULES)
def test_docstring_examples_run(module: str) -> None:
    mod = importlib.import_module(f"pollux.torch.{module}")
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def readme_template() -> str:
    text = (REPO / "README.md").read_text()
    section = text.split("### Writing a training script", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, "the section has no python block"
    return match.group(1)


def test_readme_training_script_template_runs_as_written(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(readme_template())
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLLUX_")}
    env.update({"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
                "PYTHONPATH": str(REPO / "src")})
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "checkpoints in pollux-checkpoints/train" in run.stderr
    assert "epoch 2" in run.stdout and "accuracy" in run.stdout, run.stdout

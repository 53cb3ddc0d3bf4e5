"""AdaptDL's tutorial script (mnist_step_5.py on scikit-learn's digits) runs on Pollux
with only its import lines changed: alone and under torchrun with an explicit
``--master-addr/--master-port``, reaching plain PyTorch's test accuracy."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.torch.launcher import REPO, free_port

EXAMPLES = REPO / "examples" / "adaptdl"
TUTORIAL = EXAMPLES / "mnist_step_5.py"
ORIGINAL = EXAMPLES / "mnist_original.py"
ACCURACY = re.compile(r"Test set: Average loss: [0-9.]+, Accuracy: ([0-9.]+)/360")
POLLUX_IMPORTS = {"from pollux import adaptdl": "import adaptdl",
                  "import pollux.adaptdl.torch": "import adaptdl.torch"}


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("POLLUX_", "ADAPTDL_", "TORCHELASTIC_")) and k not in (
               "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
               "MASTER_PORT")}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": "",
                "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])})
    return env


def accuracies(output: str) -> list[float]:
    return [float(m) / 360 for m in ACCURACY.findall(output)]


def run(argv: list[str], cwd: Path) -> str:
    out = subprocess.run(argv, cwd=cwd, env=clean_env(), capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout + out.stderr


def test_only_the_import_lines_differ_from_an_adaptdl_script() -> None:
    source = TUTORIAL.read_text()
    code = source.split('"""', 2)[2]  # after the module docstring
    lines = [line.split("#")[0].rstrip() for line in code.splitlines()]
    assert [ln for ln in lines if ln in POLLUX_IMPORTS] == list(POLLUX_IMPORTS)
    as_adaptdl = [POLLUX_IMPORTS.get(ln, ln) for ln in lines]
    assert not [ln for ln in as_adaptdl if "pollux" in ln]  # nothing else names Pollux
    ast.parse("\n".join(as_adaptdl))
    calls = {"adaptdl.torch.init_process_group", "adaptdl.torch.AdaptiveDataLoader",
             "adaptdl.torch.AdaptiveDataParallel", "adaptdl.torch.remaining_epochs_until",
             "adaptdl.torch.Accumulator", ".autoscale_batch_size(1028"}
    assert all(call in code for call in calls)


def test_the_tutorial_alone_matches_plain_pytorch(tmp_path: Path) -> None:
    pollux = accuracies(run([sys.executable, str(TUTORIAL), "--epochs", "1"], tmp_path))
    plain = accuracies(run([sys.executable, str(ORIGINAL), "--epochs", "1"], tmp_path))
    assert len(pollux) == len(plain) == 1
    assert pollux[0] > 0.75 and abs(pollux[0] - plain[0]) < 0.08, (pollux, plain)
    assert (tmp_path / "pollux-checkpoints" / "mnist_step_5").is_dir()


def test_the_tutorial_under_torchrun_with_an_explicit_master_address_and_port(
        tmp_path: Path) -> None:
    port = free_port()
    output = run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                  "--master-addr", "127.0.0.1", "--master-port", str(port),
                  str(TUTORIAL), "--epochs", "1"], tmp_path)
    found = accuracies(output)
    assert len(found) == 2 and found[0] == found[1], output[-3000:]  # one number, 2 ranks
    assert found[0] > 0.75, output[-3000:]
    assert "(2 replicas x 32 samples)" in output

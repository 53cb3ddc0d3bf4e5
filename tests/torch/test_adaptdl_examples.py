"""AdaptDL's CIFAR, DCGAN and Transformer examples (small synthetic data) and its
TensorBoard tutorial run on Pollux with only their imports changed: alone, resumed
after a restart, and under ``pollux submit`` on two replicas."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.service.e2e_helpers import ServerProcess, states, wait_until
from tests.torch.launcher import REPO
from tests.torch.test_adaptdl_tutorial import clean_env

EXAMPLES = REPO / "examples" / "adaptdl"
CIFAR = [str(EXAMPLES / "cifar" / "main.py"), "--model", "LeNet", "--bs", "32",
         "--lr", "0.02", "--autoscale-bsz"]
TRANSFORMER = [str(EXAMPLES / "transformer" / "transformer.py"), "--epochs", "2",
               "--autoscale-bsz", "--tokens", "6000"]
TENSORBOARD = [str(EXAMPLES / "mnist_tensorboard.py"), "--epochs", "1"]
DCGAN = [str(EXAMPLES / "dcgan" / "dcgan.py"), "--num-samples", "128", "--ngf", "4",
         "--ndf", "4", "--batch-size", "32", "--seed", "1"]


def run(argv: list[str], cwd: Path) -> str:
    env = clean_env()
    env["ADAPTDL_TENSORBOARD_LOGDIR"] = str(cwd / "tensorboard")
    out = subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def test_cifar_trains_and_writes_adaptdls_tensorboard_scalars(tmp_path: Path) -> None:
    output = run([*CIFAR, "--epochs", "2"], tmp_path)
    valid = [ln for ln in output.splitlines() if ln.startswith("Valid:")]
    assert len(valid) == 2, output
    accuracy = float(valid[0].split("'accuracy': ")[1].rstrip("}"))
    assert accuracy > 0.5, valid  # 10 classes: chance is 0.1
    events = list((tmp_path / "tensorboard" / "local").glob("events.out.tfevents.*"))
    assert events and b"AdaptDL/Data/Total_Batch_Size" in events[0].read_bytes()
    assert b"AdaptDL/Model/Gain" in events[0].read_bytes()


def test_transformer_learns_the_corpus_through_the_bptt_iterator(tmp_path: Path) -> None:
    output = run(TRANSFORMER, tmp_path)
    valid = [float(ln.split("valid loss")[1].split("|")[0]) for ln in output.splitlines()
             if "| end of epoch" in ln]
    test = [float(ln.split("test loss")[1].split("|")[0]) for ln in output.splitlines()
            if "End of training" in ln]
    assert len(valid) == 2 and len(test) == 1, output
    # a uniform guess over the 40 tokens scores log 40 = 3.7; the chain's floor is 1.1
    assert valid[1] <= valid[0] + 0.05 and test[0] < 2.5, output
    events = list((tmp_path / "tensorboard" / "local").glob("events.out.tfevents.*"))
    assert events and b"Loss/Valid" in b"".join(e.read_bytes() for e in events)


def test_the_tensorboard_tutorial_logs_under_the_jobs_name(tmp_path: Path) -> None:
    output = run(TENSORBOARD, tmp_path)
    assert "Test set: Average loss" in output, output
    events = list((tmp_path / "tensorboard" / "local").glob("events.out.tfevents.*"))
    assert events and b"Test/Accuracy" in b"".join(e.read_bytes() for e in events)


def test_dcgan_trains_two_named_models_and_resumes_both(tmp_path: Path) -> None:
    first = run([*DCGAN, "--epochs", "1"], tmp_path)
    assert "Epoch 0: Loss_D" in first, first
    second = run([*DCGAN, "--epochs", "2"], tmp_path)  # a restart: epoch 0 is done
    assert "Epoch 0:" not in second and "Epoch 1: Loss_D" in second, second
    from pollux.torch.checkpoint import latest_valid_checkpoint

    found = latest_valid_checkpoint(tmp_path / "pollux-checkpoints" / "dcgan")
    assert found is not None
    names = set(found[1]["states"])
    assert {"pollux/models/netD/model", "pollux/models/netG/model",
            "pollux/models/netG/optimizer"} <= names, names


@pytest.fixture
def server(tmp_path: Path):  # type: ignore[no-untyped-def]
    process = ServerProcess(tmp_path / "data")
    yield process
    process.cleanup()


def test_both_examples_under_pollux_submit_on_two_replicas(server: ServerProcess,
                                                           tmp_path: Path) -> None:
    client = server.start()
    ids = {}
    for name, argv in (("cifar", [*CIFAR, "--epochs", "1"]),
                       ("dcgan", [*DCGAN, "--epochs", "1"])):
        out = subprocess.run(
            [sys.executable, "-m", "pollux.cli.main", "submit", "--data-dir",
             str(server.data_dir), "--name", name, "--min-replicas", "2", "--max-replicas",
             "2", "--env", f"ADAPTDL_TENSORBOARD_LOGDIR={tmp_path / 'tb'}", "--json",
             "--workdir", str(REPO), "--", sys.executable, *argv],
            env=clean_env(), capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        ids[name] = json.loads(out.stdout)["id"]
    wait_until(lambda: all(states(client)[i] in ("Succeeded", "Failed") for i in ids.values()),
               240, "both jobs to finish", interval_s=1.0)
    logs = {name: (server.data_dir / "jobs" / i / "logs" / "replica-0.log").read_text()
            for name, i in ids.items()}
    assert [states(client)[i] for i in ids.values()] == ["Succeeded", "Succeeded"], logs
    assert "Valid:" in logs["cifar"] and "2 replicas x" in logs["cifar"], logs["cifar"]
    assert "Epoch 0: Loss_D" in logs["dcgan"] and "2 replicas x" in logs["dcgan"], logs["dcgan"]

"""End to end: examples/transformers_clm.py (AdaptiveTrainer, a tiny GPT-2 from its
config, a synthetic corpus) under ``pollux submit --max-replicas 3`` on the local
backend: the batch size adapts (a job event), the job is resized 3 -> 2 when a second
job arrives (its first launch waits at epoch 3 until it is stopped), every training sample is trained once per epoch over both launches, and
the final evaluation loss is within 5% of ``transformers.Trainer``'s on the same data."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from tests.service.e2e_helpers import (  # noqa: E402
    FINAL_STATES,
    ServerProcess,
    checkpoint_dir,
    states,
    wait_until,
)
from tests.torch.launcher import REPO  # noqa: E402
from tests.torch.test_adaptdl_tutorial import clean_env  # noqa: E402

pytestmark = [pytest.mark.timeout(420)]

EXAMPLE = REPO / "examples" / "transformers_clm.py"
NUM_TRAIN = 384
EPOCHS = 8
COMMON = ["--epochs", str(EPOCHS), "--num-train", str(NUM_TRAIN)]
"""The same data and samples for both runs."""


def summary(text: str) -> dict[str, Any]:
    lines = [ln for ln in text.splitlines() if ln.startswith('{"eval_loss"')]
    assert lines, text[-4000:]
    return dict(json.loads(lines[-1]))


def submit(server: ServerProcess, name: str, replicas: tuple[int, int],
           command: list[str]) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "pollux.cli.main", "submit", "--data-dir",
         str(server.data_dir), "--name", name, "--min-replicas", str(replicas[0]),
         "--max-replicas", str(replicas[1]), "--json", "--workdir", str(REPO), "--",
         *command], env=clean_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return str(json.loads(out.stdout)["id"])


def batch_events(server: ServerProcess, job_id: str) -> list[str]:
    messages = [e["message"] for e in server.clients[-1].job(job_id)["events"]]
    return [m for m in messages if m.startswith("batch size ")]


@pytest.fixture
def server(tmp_path: Path):  # type: ignore[no-untyped-def]
    process = ServerProcess(tmp_path / "data")
    yield process
    process.cleanup()


def test_adaptive_trainer_under_pollux_submit_resized_3_to_2(server: ServerProcess,
                                                             tmp_path: Path) -> None:
    # the plain Trainer, at the adaptive job's initial batch (2 per replica x 3)
    plain = subprocess.Popen([sys.executable, str(EXAMPLE), *COMMON, "--plain",
                              "--batch-size", "6", "--output-dir", str(tmp_path / "plain")],
                             env=clean_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    try:
        client = server.start()
        job = submit(server, "clm", (1, 3), [
            sys.executable, str(EXAMPLE), *COMMON, "--batch-size", "2",
            "--max-batch-size", "48", "--local-bsz-bounds", "1", "32",
            "--control-interval-s", "0.2", "--noise-interval-steps", "1",
            "--checkpoint-interval-s", "2", "--hold-first-launch-at-epoch", "3"])
        events = checkpoint_dir(server.data_dir, job) / "events.jsonl"
        wait_until(lambda: events.exists() and '"hold"' in events.read_text()
                   or states(client)[job] in FINAL_STATES, 300,
                   "the job's first launch to reach epoch 3", interval_s=0.5)
        # a second job takes two of the four slots: the equal shares resize clm 3 -> 2
        hold = submit(server, "hold", (2, 2), [sys.executable, "-c",
                                               "import time; time.sleep(300)"])
        wait_until(lambda: states(client)[job] in FINAL_STATES, 300,
                   "the job to end", interval_s=1.0)
        plain_out = plain.communicate(timeout=240)[0]
    finally:
        if plain.poll() is None:
            plain.kill()
            plain.wait()
    log = (server.data_dir / "jobs" / job / "logs" / "replica-0.log").read_text()
    detail = client.job(job)
    client.cancel(hold)
    assert detail["state"] == "Succeeded", log[-6000:]
    assert detail["rescales"] >= 1, detail["events"]
    assert batch_events(server, job), detail["events"]

    records = [json.loads(line) for line in
               (checkpoint_dir(server.data_dir, job) / "samples.jsonl").read_text().splitlines()]
    for epoch in range(EPOCHS):
        seen = Counter(i for r in records if r["epoch"] == epoch for i in r["indices"])
        assert seen == Counter(range(NUM_TRAIN)), f"epoch {epoch}"
    assert {r["num_replicas"] for r in records} >= {2, 3}

    adaptive = summary(log)
    assert adaptive["init_batch_size"] == 6 and adaptive["job_epoch"] == EPOCHS
    baseline = summary(plain_out)
    assert abs(adaptive["eval_loss"] - baseline["eval_loss"]) <= 0.05 * baseline["eval_loss"], \
        (adaptive, baseline)

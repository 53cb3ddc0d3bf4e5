"""Checkpoints: atomic, verified, pruned after the new one is durable, crash-safe."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pollux.errors import ConfigError, InvalidCheckpointError
from pollux.jobenv import CORRUPT_CHECKPOINT_EXIT_CODE
from pollux.torch.checkpoint import (
    CheckpointManager,
    CorruptCheckpointsError,
    latest_valid_checkpoint,
    list_checkpoints,
    read_checkpoint_file,
    write_checkpoint_file,
)
from tests.torch.launcher import WORKERS


class Box:
    def __init__(self, value: Any = None) -> None:
        self.value = value

    def state_dict(self) -> Any:
        return {"value": self.value}

    def load_state_dict(self, state: Any) -> None:
        self.value = state["value"]


def saved_values(directory: Path, count: int, keep: int = 2) -> CheckpointManager:
    manager = CheckpointManager(directory, keep=keep)
    box = Box()
    manager.register("box", box)
    for i in range(1, count + 1):
        box.value = i
        manager.save()
    return manager


def restored(directory: Path) -> Any:
    box = Box()
    CheckpointManager(directory).register("box", box)
    return box.value


def test_round_trip_and_restore_on_register(tmp_path: Path) -> None:
    saved_values(tmp_path, 3)
    manager = CheckpointManager(tmp_path)
    box = Box()
    assert manager.register("box", box) is True
    assert box.value == 3 and manager.restored_sequence == 3
    assert manager.register("other", Box()) is False


def test_old_checkpoints_are_pruned(tmp_path: Path) -> None:
    saved_values(tmp_path, 5, keep=2)
    assert [f.sequence for f in list_checkpoints(tmp_path)] == [4, 5]


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(tmp_path: Path,
                                                                damage: str) -> None:
    saved_values(tmp_path, 2)
    newest = list_checkpoints(tmp_path)[-1].path
    data = bytearray(newest.read_bytes())
    if damage == "truncate":
        newest.write_bytes(bytes(data[:len(data) // 2]))
    elif damage == "flip":
        data[-10] ^= 0xFF
        newest.write_bytes(bytes(data))
    else:
        newest.write_bytes(b"not a checkpoint")
    with pytest.raises(InvalidCheckpointError):
        read_checkpoint_file(newest)
    assert restored(tmp_path) == 1
    # The next save gets a fresh sequence number, newer than the damaged file.
    manager = CheckpointManager(tmp_path)
    box = Box()
    manager.register("box", box)
    box.value = 10
    # a file without the checkpoint header is not ours: it does not steer the sequence
    assert manager.save() == (2 if damage == "garbage" else 3)
    assert restored(tmp_path) == 10


def test_stale_temporary_files_are_ignored_and_removed(tmp_path: Path) -> None:
    saved_values(tmp_path, 1)
    (tmp_path / ".checkpoint-00000002.pt.999.tmp").write_bytes(b"half written")
    assert restored(tmp_path) == 1
    assert not list(tmp_path.glob("*.tmp"))


def test_write_is_atomic_rename(tmp_path: Path) -> None:
    target = tmp_path / "checkpoint-00000001.pt"
    write_checkpoint_file(target, b"x" * 1000, chunk_bytes=64)
    assert read_checkpoint_file(target) == b"x" * 1000
    assert os.listdir(tmp_path) == [target.name]


def test_background_save_then_wait(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    box = Box([1, 2, 3])
    manager.register("box", box)
    manager.save(background=True)
    box.value = "changed after the save"  # the saved state was taken at save()
    manager.wait()
    assert restored(tmp_path) == [1, 2, 3]


def test_disabled_without_a_directory() -> None:
    manager = CheckpointManager(None)
    assert not manager.enabled
    assert manager.register("box", Box()) is False
    assert manager.save() is None


def test_registration_errors(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    manager.register("box", Box())
    with pytest.raises(ConfigError, match="unique"):
        manager.register("box", Box())
    with pytest.raises(ConfigError, match="state_dict"):
        manager.register("thing", object())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="keep"):
        CheckpointManager(tmp_path, keep=0)


def test_sigkill_while_writing_leaves_the_previous_checkpoint_and_resumes_from_it(
        tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    worker = [sys.executable, str(WORKERS / "checkpoint_writer.py"),
              "--checkpoint-dir", str(ckpt), "--megabytes", "24"]
    proc = subprocess.Popen(worker, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    torn = False
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            complete = list_checkpoints(ckpt) if ckpt.exists() else []
            partial = list(ckpt.glob(".checkpoint-*.tmp")) if ckpt.exists() else []
            if complete and partial:
                os.kill(proc.pid, signal.SIGKILL)
                torn = True
                break
            time.sleep(0.001)
    finally:
        if proc.poll() is None:
            proc.kill()
        output = proc.communicate(timeout=10)[0].decode()
    assert torn, f"never caught a checkpoint being written:\n{output}"
    leftovers = list(ckpt.glob(".checkpoint-*.tmp"))
    found = latest_valid_checkpoint(ckpt)
    assert found is not None, output
    last_saved = max(json.loads(ln)["saved"] for ln in output.splitlines() if "saved" in ln)
    expected = found[1]["states"]["big"]["count"]
    # The interrupted write was the one after the last reported save (or that save's
    # rename had happened but not its report): nothing older than it is ever restored.
    assert expected in (last_saved, last_saved + 1)
    check = subprocess.run([*worker, "--check"], capture_output=True, text=True, timeout=60)
    report = json.loads([ln for ln in check.stdout.splitlines() if "restored" in ln][0])
    assert report == {"restored": expected, "intact": True}, check.stdout + check.stderr
    # The restart removed the torn temporary file (when the kill left one behind).
    assert not list(ckpt.glob(".checkpoint-*.tmp")), leftovers


def test_a_planted_high_sequence_does_not_hide_new_checkpoints(tmp_path: Path) -> None:
    """Defect 8: after ``checkpoint-99999999.pt`` new checkpoints got 9-digit names that
    the 8-digit pattern never listed: never loaded, never pruned."""
    saved_values(tmp_path, 1)
    write_checkpoint_file(tmp_path / "checkpoint-99999999.pt", b"junk payload")
    (tmp_path / "checkpoint-123456789012.pt").write_bytes(b"foreign, no header")
    (tmp_path / "checkpoint-00000007.pt.bak").write_bytes(b"not ours either")
    manager = CheckpointManager(tmp_path, keep=2)
    box = Box()
    assert manager.register("box", box) and box.value == 1
    for value in (20, 21, 22):
        box.value = value
        manager.save()
    assert [f.sequence for f in list_checkpoints(tmp_path)] == [100000001, 100000002]
    assert restored(tmp_path) == 22
    assert (tmp_path / "checkpoint-123456789012.pt").exists()  # foreign: left alone


def test_a_planted_pickle_cannot_run_code(tmp_path: Path) -> None:
    """Defect 10: ``torch.load(weights_only=False)`` ran whatever a planted file held."""
    import io
    import pickle

    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self) -> Any:
            return (os.system, (f"touch {marker}",))

    buffer = io.BytesIO()
    pickle.dump({"meta": {}, "states": {"box": Exploit()}}, buffer, protocol=2)
    saved_values(tmp_path, 1)
    write_checkpoint_file(tmp_path / "checkpoint-00000002.pt", buffer.getvalue())
    assert restored(tmp_path) == 1  # the planted file is refused, the older one used
    assert not marker.exists()


def test_the_agents_own_state_loads_under_the_allow_list(tmp_path: Path) -> None:
    import random

    import numpy as np
    import torch

    manager = CheckpointManager(tmp_path)
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
             "random": random.getstate(), "arr": np.arange(3.0), "f": np.float32(1.5)}
    manager.register_functions("rng", lambda: state, lambda s: None)
    manager.save()
    loaded = latest_valid_checkpoint(tmp_path)
    assert loaded is not None
    assert loaded[1]["states"]["rng"]["numpy"][0] == "MT19937"


def _corrupt_all(directory: Path) -> None:
    for found in list_checkpoints(directory):
        data = bytearray(found.path.read_bytes())
        data[-1] ^= 0xFF
        found.path.write_bytes(bytes(data))


def test_all_corrupt_checkpoints_fail_by_default(tmp_path: Path) -> None:
    """Defect 9: all checkpoints corrupt meant a silent fresh start."""
    saved_values(tmp_path, 2)
    _corrupt_all(tmp_path)
    with pytest.raises(CorruptCheckpointsError) as info:
        CheckpointManager(tmp_path)
    assert info.value.code == CORRUPT_CHECKPOINT_EXIT_CODE
    assert "all 2 checkpoints" in str(info.value) and "on_corrupt_checkpoint" in str(info.value)


def test_all_corrupt_checkpoints_start_fresh_when_asked(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    saved_values(tmp_path, 2)
    _corrupt_all(tmp_path)
    monkeypatch.setenv("POLLUX_ON_CORRUPT_CHECKPOINT", "fresh")
    manager = CheckpointManager(tmp_path)
    assert manager.register("box", Box()) is False and manager.restored_sequence is None
    assert sorted(p.name for p in tmp_path.glob("*.corrupt")) == [
        "checkpoint-00000001.pt.corrupt", "checkpoint-00000002.pt.corrupt"]
    with pytest.raises(ConfigError, match="on_corrupt_checkpoint"):
        CheckpointManager(tmp_path, on_corrupt="ignore")

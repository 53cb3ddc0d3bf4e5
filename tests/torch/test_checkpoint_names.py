"""Hostile: a file named ``checkpoint-<241 nines>.pt`` that starts like a checkpoint
does not steer the sequence (before, every later save tried a name too long to create)."""

from __future__ import annotations

from pathlib import Path

from pollux.torch.checkpoint import MAGIC, CheckpointManager, list_checkpoints
from tests.torch.test_checkpoint import Box, restored, saved_values


def test_a_checkpoint_name_with_an_absurd_number_is_ignored(tmp_path: Path) -> None:
    saved_values(tmp_path, 2)
    planted = tmp_path / f"checkpoint-{'9' * 241}.pt"
    planted.write_bytes(MAGIC + b"\0" * 64)
    assert [f.sequence for f in list_checkpoints(tmp_path)] == [1, 2]
    manager = CheckpointManager(tmp_path)
    box = Box()
    manager.register("box", box)
    box.value = 7
    assert manager.save() == 3
    assert restored(tmp_path) == 7
    assert planted.exists()  # not ours: left alone, never pruned

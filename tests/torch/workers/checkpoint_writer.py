"""Worker: saves ever-newer large checkpoints until killed, or reports what it restored."""

from __future__ import annotations

import argparse
import hashlib
import json
from typing import Any

import torch

import pollux.torch as pt


def blob_for(count: int, num_floats: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(count)
    return torch.rand(num_floats, generator=generator)


class BigState:
    def __init__(self, num_floats: int) -> None:
        self.num_floats = num_floats
        self.count = 0
        self.blob = blob_for(0, num_floats)

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count, "blob": self.blob,
                "digest": hashlib.sha256(self.blob.numpy().tobytes()).hexdigest()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count = int(state["count"])
        self.blob = state["blob"]
        intact = hashlib.sha256(self.blob.numpy().tobytes()).hexdigest() == state["digest"]
        expected = torch.equal(self.blob, blob_for(self.count, self.num_floats))
        print(json.dumps({"restored": self.count, "intact": intact and expected}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint-dir", required=True)
    parser.add_argument("--megabytes", type=int, default=32)
    parser.add_argument("--check", action="store_true", help="only report the restored state")
    args = parser.parse_args()
    job = pt.init_process_group(checkpoint_dir=args.checkpoint_dir,
                                install_signal_handler=False)
    state = BigState(args.megabytes * (1 << 20) // 4)
    if not job.checkpoint.register("big", state):
        print(json.dumps({"restored": None}), flush=True)
    if args.check:
        return
    for _ in range(1000):
        state.count += 1
        state.blob = blob_for(state.count, state.num_floats)
        job.checkpoint.save()
        print(json.dumps({"saved": state.count}), flush=True)


if __name__ == "__main__":
    main()

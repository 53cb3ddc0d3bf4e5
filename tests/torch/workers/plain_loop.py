"""Worker: a plain ``for epoch in range(n)`` loop over an AdaptiveDataLoader, through
``pollux.torch`` or ``pollux.adaptdl``; writes one JSON line per batch to
``<checkpoint dir>/samples-launch<L>-rank<R>.jsonl`` ({"epoch", "indices"}, the epoch
being the script's own loop variable) and prints {"ready": true} once it is
``--ready-step`` batches into epoch 1, to be signalled there. With
``--unseeded-sampler`` (``pollux.torch`` only) its order comes from a custom sampler that
draws a different permutation in every process."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository: tests.*

import torch  # noqa: E402
from tests.torch.loop_scripts import Script, UnseededPermutations, train_step  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--api", choices=("torch", "adaptdl"), required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=96)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--ready-step", type=int, default=3)
    parser.add_argument("--step-sleep-s", type=float, default=0.05)
    parser.add_argument("--unseeded-sampler", action="store_true",
                        help="a custom sampler drawing a fresh random order per process")
    args = parser.parse_args()
    torch.set_num_threads(1)
    script = Script(args.api, install_signal_handler=True)
    job = script.job
    model, optimizer = script.model()
    sampler = UnseededPermutations(args.samples) if args.unseeded_sampler else None
    loader = script.loader(args.samples, args.batch_size, shuffle=sampler is None,
                           sampler=sampler)
    out = Path(os.environ["POLLUX_CHECKPOINT_DIR"]) / (
        f"samples-launch{job.launch.num_restarts}-rank{job.rank}.jsonl")
    with open(out, "a") as samples:
        for epoch in range(args.epochs):
            for number, (x, index) in enumerate(loader):
                samples.write(json.dumps({"epoch": epoch, "indices": index.tolist()}) + "\n")
                samples.flush()
                train_step(model, optimizer, x)
                time.sleep(args.step_sleep_s)
                if epoch == 1 and number == args.ready_step:
                    print(json.dumps({"ready": True}), flush=True)
    print(json.dumps({"done": True, "epoch": job.epoch}), flush=True)
    script.close()


if __name__ == "__main__":
    main()

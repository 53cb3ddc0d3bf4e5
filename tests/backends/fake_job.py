"""A tiny job that honours the agent's contract, for backend and service tests.

It counts steps, saving the count atomically in POLLUX_CHECKPOINT_DIR after each step
(rank 0), resumes from it, exits 75 after checkpointing on SIGTERM, and 0 when done.
``--crash-at-step K`` exits 3 the first time step K is reached (a marker file remembers);
``--spawn-child`` starts a grandchild that sleeps, to check process-group cleanup.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

RESCALE_EXIT_CODE = 75


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step-s", type=float, default=0.05)
    parser.add_argument("--crash-at-step", type=int, default=-1)
    parser.add_argument("--spawn-child", action="store_true")
    parser.add_argument("--ignore-sigterm", action="store_true")
    args, _ = parser.parse_known_args()  # ignores the example's flags (pollux demo)
    rank = int(os.environ.get("POLLUX_RANK", "0"))
    ckpt = Path(os.environ.get("POLLUX_CHECKPOINT_DIR", "."))
    ckpt.mkdir(parents=True, exist_ok=True)
    state_path = ckpt / "state.json"
    step = json.loads(state_path.read_text())["step"] if state_path.exists() else 0
    launch = int(os.environ.get("POLLUX_NUM_RESTARTS", "0"))
    record = {k: v for k, v in os.environ.items()
              if k.startswith(("POLLUX_", "ADAPTDL_")) or k in ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")}
    record["pid"] = os.getpid()
    record["resumed_step"] = step
    env_path = ckpt / f"env-{launch}-{rank}.json"  # whole or absent: tests poll for it
    env_path.with_suffix(".tmp").write_text(json.dumps(record))
    os.replace(env_path.with_suffix(".tmp"), env_path)
    stop = {"requested": False}

    def on_sigterm(signum: int, frame: object) -> None:
        stop["requested"] = True

    signal.signal(signal.SIGTERM, signal.SIG_IGN if args.ignore_sigterm else on_sigterm)
    if args.spawn_child:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        (ckpt / f"child-{rank}.pid").write_text(str(child.pid))
    print(f"rank {rank} starting at step {step}", flush=True)
    while step < args.steps:
        if stop["requested"]:
            print(f"rank {rank} checkpointed at step {step}; exiting 75", flush=True)
            return RESCALE_EXIT_CODE
        time.sleep(args.step_s)
        step += 1
        marker = ckpt / "crashed"
        if step == args.crash_at_step and rank == 0 and not marker.exists():
            marker.write_text("1")
            print("crashing", flush=True)
            return 3
        if rank == 0:
            tmp = state_path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"step": step}))
            os.replace(tmp, state_path)
    print(f"rank {rank} done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

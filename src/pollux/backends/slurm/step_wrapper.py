"""A replica's wrapper inside a Slurm step: runs the command, records its exit status
(as :mod:`pollux.backends.exit_status` does for the local backend, with the same file
format and writer), and exits the same way.

Unlike the local wrapper it does not pass signals on: Slurm delivers ``scancel
--signal`` to every process of a step (each process-tracking plugin does), so the
command already gets each signal once; passing it on would deliver it twice. A signal
that arrives before the command has started is delivered to it once it has.

The replica's own variables (its launch contract, with its hints token) come from
``ENV_FILE``, a JSON object only the server's user can read, so that they never appear
on a command line.

Run by path (``python -I step_wrapper.py STATUS_FILE ENV_FILE -- COMMAND...``): standard
library only, plus the exit-status writer loaded from beside this package.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

SCRIPT = str(Path(__file__).resolve())
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def wrapped_step(status_path: str, env_path: str, command: list[str]) -> list[str]:
    """``command`` run under this wrapper with the variables of ``env_path`` added,
    recording its status in ``status_path``."""
    return [sys.executable, "-I", SCRIPT, status_path, env_path, "--", *command]


def main(argv: list[str]) -> None:
    if len(argv) < 4 or argv[2] != "--":
        sys.exit("usage: step_wrapper.py STATUS_FILE ENV_FILE -- COMMAND [ARGS...]")
    sys.path.insert(0, str(Path(SCRIPT).parents[1]))  # pollux/backends: exit_status.py
    from exit_status import write_exit_status

    status_path, command = Path(argv[0]), argv[3:]
    try:
        with open(argv[1]) as handle:
            own = json.load(handle)
    except (OSError, ValueError) as exc:  # e.g. the log dir is not on a shared filesystem
        sys.exit(f"pollux: cannot read the replica's environment {argv[1]}: {exc}")
    env = {**os.environ, **{str(k): str(v) for k, v in own.items()}}
    started: list[subprocess.Popen[bytes]] = []
    early: list[int] = []

    def note(signum: int, frame: object) -> None:
        if not started:
            early.append(signum)  # the command missed it: deliver it once started

    for sig in SIGNALS:
        signal.signal(sig, note)
    try:
        started.append(subprocess.Popen(command, env=env))
    except OSError as exc:
        print(f"pollux: cannot start {command[0]!r}: {exc}", file=sys.stderr, flush=True)
        write_exit_status(status_path, 127)
        sys.exit(127)
    for signum in early:
        started[0].send_signal(signum)
    code = started[0].wait()
    write_exit_status(status_path, code)
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        signal.raise_signal(-code)
    sys.exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])

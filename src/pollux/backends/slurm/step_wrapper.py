"""A replica's wrapper inside a Slurm step: runs the command, records its exit status
(as :mod:`pollux.backends.exit_status` does for the local backend, with the same file
format and writer), and exits the same way.

The command's output goes through a pipe into the replica's bounded log
(:mod:`pollux.backends.replica_log`: within its budget, never into the disk's reserve),
not straight from ``srun --output`` into the file, and the processes it leaves behind
are ended with it (:mod:`pollux.backends.supervisor`).

Unlike the local wrapper it does not pass signals on: Slurm delivers ``scancel
--signal`` to every process of a step (each process-tracking plugin does), so the
command already gets each signal once; passing it on would deliver it twice. A signal
that arrives before the command has started is delivered to it once it has.

The replica's own variables (its launch contract, with its hints token) come from
``ENV_FILE``, a JSON object only the server's user can read, so that they never appear
on a command line.

Run by path (``python -I step_wrapper.py STATUS_FILE ENV_FILE [--log LOG --log-budget
BYTES] -- COMMAND...``): standard library only, plus the exit-status writer, the log and
the supervisor loaded from beside this package.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

SCRIPT = str(Path(__file__).resolve())
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def wrapped_step(status_path: str, env_path: str, command: list[str], log: str | None = None,
                 log_budget_bytes: int = 0) -> list[str]:
    """``command`` run under this wrapper with the variables of ``env_path`` added,
    recording its status in ``status_path``; with ``log``, its output appended there
    within ``log_budget_bytes`` (:mod:`pollux.backends.replica_log`)."""
    options = [] if log is None else ["--log", log, "--log-budget", str(int(log_budget_bytes))]
    return [sys.executable, "-I", SCRIPT, status_path, env_path, *options, "--", *command]


USAGE = ("usage: step_wrapper.py STATUS_FILE ENV_FILE [--log LOG --log-budget BYTES] -- "
         "COMMAND [ARGS...]")


def main(argv: list[str]) -> None:
    if len(argv) < 4 or "--" not in argv[2:]:
        sys.exit(USAGE)
    split = argv.index("--", 2)
    words, command = argv[2:split], argv[split + 1:]
    options = dict(zip(words[::2], words[1::2]))
    if (not command or len(words) % 2 or set(options) - {"--log", "--log-budget"}
            or not options.get("--log-budget", "0").isdigit()):
        sys.exit(USAGE)
    sys.path.append(str(Path(SCRIPT).parents[1]))  # pollux/backends: exit_status.py
    from exit_status import open_log, siblings, write_exit_status

    status_path = Path(argv[0])
    try:
        with open(argv[1]) as handle:
            own = json.load(handle)
    except (OSError, ValueError) as exc:  # e.g. the log dir is not on a shared filesystem
        sys.exit(f"pollux: cannot read the replica's environment {argv[1]}: {exc}")
    env = {**os.environ, **{str(k): str(v) for k, v in own.items()}}
    log = open_log(options.get("--log"), int(options.get("--log-budget", "0")))
    _, supervisor = siblings()
    child = supervisor.Supervised(command, env=env, log=log)
    early: list[int] = []

    def note(signum: int, frame: object) -> None:
        if not child.started:
            early.append(signum)  # the command missed it: deliver it once started

    for sig in SIGNALS:
        signal.signal(sig, note)
    try:
        child.start()
    except OSError as exc:
        message = f"pollux: cannot start {command[0]!r}: {exc}"
        if log is not None:
            log.say(message)
            log.close()
        print(message, file=sys.stderr, flush=True)
        write_exit_status(status_path, 127)
        sys.exit(127)
    for signum in early:
        child.send_signal(signum)
    code = child.wait()
    write_exit_status(status_path, code)
    if log is not None:
        log.close()
    if code < 0:
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        signal.raise_signal(-code)
    sys.exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])

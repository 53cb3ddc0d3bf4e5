"""A replica's exit status, recorded durably by the process that launched it.

The local backend starts each replica as ``python exit_status.py STATUS_FILE -- command``:
this small wrapper (standard library only, run by path so it imports nothing else) runs
the command as its child, passes on the signals the scheduler sends (SIGTERM to
checkpoint and stop, SIGINT, SIGHUP, SIGUSR1/2), and when the child ends writes its exit
status to ``STATUS_FILE`` (temp file, fsync, rename) before exiting the same way.

So a replica that finishes while the server is down (crashed, killed, rebooting) leaves
its status behind: a restarted server reads it (:func:`read_exit_status`) and records a
finished job as finished instead of running it again. A status file is named after the
launch and rank (:func:`exit_status_path`), beside the replica's log.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1,
                     signal.SIGUSR2)
SCRIPT = str(Path(__file__).resolve())
"""Path of this module, run as the wrapper script."""


def exit_status_path(log_dir: str | os.PathLike[str], generation: int, rank: int) -> Path:
    """Where the wrapper of replica ``rank`` of launch ``generation`` records its status."""
    return Path(log_dir) / f"replica-{rank}.launch-{generation}.exit"


def wrapped_command(status_path: str | os.PathLike[str], command: list[str]) -> list[str]:
    """``command`` run under the wrapper, recording its status in ``status_path``."""
    return [sys.executable, "-I", SCRIPT, os.fspath(status_path), "--", *command]


def read_exit_status(path: str | os.PathLike[str]) -> int | None:
    """The recorded exit status (negative -N: killed by signal N), or None when the file
    is missing or unreadable (the replica has not ended, or its wrapper was killed)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    code = data.get("exit_code") if isinstance(data, dict) else None
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def write_exit_status(path: Path, exit_code: int) -> None:
    """Record ``exit_code`` atomically and durably."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as handle:
        json.dump({"exit_code": exit_code}, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def run(status_path: Path, command: list[str]) -> int:
    """Run ``command``, forwarding signals; record and return its exit status."""
    children: list[subprocess.Popen[bytes]] = []
    early: list[int] = []

    def forward(signum: int, frame: object) -> None:
        if not children:
            early.append(signum)  # arrived before the child existed: deliver it after
            return
        try:
            children[0].send_signal(signum)
        except ProcessLookupError:
            pass

    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, forward)
    try:
        children.append(subprocess.Popen(command))
    except OSError as exc:
        print(f"pollux: cannot start {command[0]!r}: {exc}", file=sys.stderr, flush=True)
        write_exit_status(status_path, 127)
        return 127
    for signum in early:
        forward(signum, None)
    code = children[0].wait()
    write_exit_status(status_path, code)
    return code


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[1] != "--":
        sys.exit("usage: exit_status.py STATUS_FILE -- COMMAND [ARGS...]")
    code = run(Path(argv[0]), argv[2:])
    if code < 0:  # end the way the child did, so the parent sees the same status
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])

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

When the status cannot be written (a full disk), the wrapper never turns the command's
status into a failure: it keeps the status in a fallback file in memory-backed storage
(:func:`fallback_status_path`, private to the user; it marks the status "unknown" for
the local backend) and stays alive, writing again with growing pauses until the write
succeeds, then exits as the command did. A SIGTERM, SIGINT or SIGHUP meanwhile ends the
wait (the fallback file keeps the status for a restarted server).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1,
                     signal.SIGUSR2)
SCRIPT = str(Path(__file__).resolve())
"""Path of this module, run as the wrapper script."""
STOP_WAITING_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""Signals that end the wait for a writable status file (the command has ended)."""
FIRST_RETRY_S = 0.2
MAX_RETRY_S = 2.0


def exit_status_path(log_dir: str | os.PathLike[str], generation: int, rank: int) -> Path:
    """Where the wrapper of replica ``rank`` of launch ``generation`` records its status."""
    return Path(log_dir) / f"replica-{rank}.launch-{generation}.exit"


def wrapped_command(status_path: str | os.PathLike[str], command: list[str]) -> list[str]:
    """``command`` run under the wrapper, recording its status in ``status_path``."""
    return [sys.executable, "-I", SCRIPT, os.fspath(status_path), "--", *command]


def fallback_dir() -> Path:
    """This user's private directory for statuses that could not be written in place:
    in /dev/shm (memory: it has room when the disk has none) or else the temp dir."""
    base = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else Path(tempfile.gettempdir())
    return base / f"pollux-exit-status-{os.getuid()}"


def fallback_status_path(path: str | os.PathLike[str]) -> Path:
    """Where the wrapper keeps the status meant for ``path`` while it cannot write it."""
    digest = hashlib.sha256(os.fsencode(os.path.abspath(path))).hexdigest()[:32]
    return fallback_dir() / f"{digest}.json"


def _private_dir(directory: Path) -> bool:
    """Whether ``directory`` is a real directory of this user that others cannot write."""
    try:
        info = os.lstat(directory)
    except OSError:
        return False
    return (stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()
            and not info.st_mode & 0o022)


def _read_status(path: Path, expected_for: str | None = None) -> int | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or (expected_for is not None
                                      and data.get("status_file") != expected_for):
        return None
    code = data.get("exit_code")
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def read_exit_status(path: str | os.PathLike[str]) -> int | None:
    """The recorded exit status (negative -N: killed by signal N), or None when neither
    the file nor its fallback holds one (the replica has not ended, or its wrapper was
    killed)."""
    code = _read_status(Path(path))
    if code is not None:
        return code
    fallback = fallback_status_path(path)
    if not _private_dir(fallback.parent):
        return None
    return _read_status(fallback, os.path.abspath(path))


def status_pending(path: str | os.PathLike[str]) -> bool:
    """Whether a wrapper holds an exit status it could not write to ``path`` yet (the
    replica's command has ended; how is known once the write succeeds)."""
    fallback = fallback_status_path(path)
    return _private_dir(fallback.parent) and fallback.is_file()


def write_exit_status(path: Path, exit_code: int) -> None:
    """Record ``exit_code`` atomically and durably."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as handle:
            json.dump({"exit_code": exit_code}, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _write_fallback(path: Path, exit_code: int) -> Path | None:
    fallback = fallback_status_path(path)
    try:
        fallback.parent.mkdir(mode=0o700, exist_ok=True)
        if not _private_dir(fallback.parent):
            return None
        descriptor = os.open(fallback, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW,
                             0o600)
        with os.fdopen(descriptor, "w") as handle:
            json.dump({"exit_code": exit_code, "status_file": os.path.abspath(path)}, handle)
    except OSError:
        return None
    return fallback


def record_exit_status(path: Path, exit_code: int, stop_waiting: list[int]) -> bool:
    """Write ``exit_code`` to ``path``; while that fails, keep it in the fallback file
    and write again with growing pauses until it succeeds (True) or a signal lands in
    ``stop_waiting`` (False: the fallback file keeps the status)."""
    try:
        write_exit_status(path, exit_code)
        return True
    except OSError as exc:
        fallback = _write_fallback(path, exit_code)
        _say(f"pollux: cannot record exit status {exit_code} in {path} ({exc}); "
             + (f"kept in {fallback}; " if fallback else "") + "retrying until it can be "
             "written")
    pause_s = FIRST_RETRY_S
    while not stop_waiting:
        waited_s = 0.0
        while waited_s < pause_s and not stop_waiting:
            time.sleep(0.05)
            waited_s += 0.05
        if stop_waiting:
            break
        pause_s = min(MAX_RETRY_S, pause_s * 1.5)
        try:
            write_exit_status(path, exit_code)
        except OSError:
            continue
        fallback_status_path(path).unlink(missing_ok=True)
        _say(f"pollux: exit status {exit_code} recorded in {path}")
        return True
    return False


def _say(message: str) -> None:
    try:
        print(message, file=sys.stderr, flush=True)
    except OSError:  # the log is on the full disk too
        pass


def run(status_path: Path, command: list[str]) -> int:
    """Run ``command``, forwarding signals; record and return its exit status."""
    children: list[subprocess.Popen[bytes]] = []
    early: list[int] = []
    ended: list[int] = []
    stop_waiting: list[int] = []

    def forward(signum: int, frame: object) -> None:
        if ended:  # the command is over: only the wait to record its status is left
            if signum in STOP_WAITING_SIGNALS:
                stop_waiting.append(signum)
            return
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
        _say(f"pollux: cannot start {command[0]!r}: {exc}")
        ended.append(127)
        record_exit_status(status_path, 127, stop_waiting)
        return 127
    for signum in early:
        forward(signum, None)
    code = children[0].wait()
    ended.append(code)
    record_exit_status(status_path, code, stop_waiting)
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

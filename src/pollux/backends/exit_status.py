"""A replica's exit status, recorded durably by the process that launched it.

The local backend starts each replica as ``python exit_status.py STATUS_FILE [--log LOG
--log-budget BYTES] [--fallback-dir DIR] -- command``: this small wrapper (standard
library only, run by path so it imports nothing but its siblings
:mod:`~pollux.backends.replica_log` and :mod:`~pollux.backends.supervisor`) runs the
command as its child (its output into the bounded log ``LOG``, its whole process tree
ended with it), passes on the signals the scheduler sends (SIGTERM to checkpoint and
stop, SIGINT, SIGHUP, SIGUSR1/2), and when the child ends writes its exit status to
``STATUS_FILE`` (temp file, fsync, rename) before exiting the same way.

So a replica that finishes while the server is down (crashed, killed, rebooting) leaves
its status behind: a restarted server reads it (:func:`read_exit_status`) and records a
finished job as finished instead of running it again. A status file is named after the
launch and rank (:func:`exit_status_path`), beside the replica's log.

When the status cannot be written (a full disk), the wrapper never turns the command's
status into a failure: it keeps the status in a fallback file in memory-backed storage
(:func:`fallback_status_path`, in the user's private runtime directory
:func:`fallback_dir`: ``$XDG_RUNTIME_DIR`` when it is a private directory of the user,
else ``/dev/shm/pollux-exit-status-<uid>``, refused by the server when another user
owns it; it marks the status "unknown" for the local backend) and stays alive, writing again with growing pauses until the write
succeeds, then exits as the command did. A SIGTERM, SIGINT or SIGHUP meanwhile ends the
wait (the fallback file keeps the status for a restarted server).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import signal
import stat
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

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


def wrapped_command(status_path: str | os.PathLike[str], command: list[str], *,
                    log: str | os.PathLike[str] | None = None, log_budget_bytes: int = 0,
                    fallback: str | os.PathLike[str] | None = None) -> list[str]:
    """``command`` run under the wrapper, recording its status in ``status_path``; with
    ``log``, its output appended there within ``log_budget_bytes``
    (:mod:`pollux.backends.replica_log`); ``fallback``: the directory of its full-disk
    fallback (default: :func:`fallback_dir` of the wrapper's environment)."""
    options: list[str] = []
    if log is not None:
        options += ["--log", os.fspath(log), "--log-budget", str(int(log_budget_bytes))]
    if fallback is not None:
        options += ["--fallback-dir", os.fspath(fallback)]
    return [sys.executable, "-I", SCRIPT, os.fspath(status_path), *options, "--", *command]


FALLBACK_ENV = "POLLUX_EXIT_STATUS_FALLBACK_DIR"
"""Set by the wrapper from ``--fallback-dir`` for itself (never passed to the command)."""
RUNTIME_DIR_ENV = "XDG_RUNTIME_DIR"


def fallback_dir() -> Path:
    """This user's private directory for statuses that could not be written in place, in
    memory (it has room when the disk has none): ``$XDG_RUNTIME_DIR/pollux-exit-status``
    when that runtime directory is a private directory of this user (0700, as
    systemd-logind makes it: no other user can create names in it), else
    ``/dev/shm/pollux-exit-status-<uid>`` (or in the temp dir), whose owner and mode
    :func:`check_fallback_dir` checks."""
    chosen = os.environ.get(FALLBACK_ENV)
    if chosen:
        return Path(chosen)
    runtime = os.environ.get(RUNTIME_DIR_ENV, "")
    if os.path.isabs(runtime) and _private_dir(Path(runtime), strict=True):
        return Path(runtime) / "pollux-exit-status"
    base = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else Path(tempfile.gettempdir())
    return base / f"pollux-exit-status-{os.getuid()}"


def check_fallback_dir(directory: Path | None = None) -> str | None:
    """Create the fallback directory (0700) when missing; what is wrong with it (another
    user owns it, others may write it, it is no directory), or None when it is fit."""
    directory = fallback_dir() if directory is None else directory
    try:
        directory.mkdir(mode=0o700, exist_ok=True)
        info = os.lstat(directory)
    except OSError as exc:
        return f"cannot create it ({exc.strerror})"
    if not stat.S_ISDIR(info.st_mode):
        return "it is not a directory (a link or a file someone put there)"
    if info.st_uid != os.getuid():
        return f"another user (uid {info.st_uid}) owns it"
    if info.st_mode & 0o077:
        return f"it is open to other users (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def fallback_status_path(path: str | os.PathLike[str]) -> Path:
    """Where the wrapper keeps the status meant for ``path`` while it cannot write it."""
    digest = hashlib.sha256(os.fsencode(os.path.abspath(path))).hexdigest()[:32]
    return fallback_dir() / f"{digest}.json"


def _private_dir(directory: Path, strict: bool = False) -> bool:
    """Whether ``directory`` is a real directory of this user that others cannot write
    (``strict``: nor read or enter)."""
    try:
        info = os.lstat(directory)
    except OSError:
        return False
    return (stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()
            and not info.st_mode & (0o077 if strict else 0o022))


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


def record_exit_status(path: Path, exit_code: int, stop_waiting: list[int],
                       say: Any = None) -> bool:
    """Write ``exit_code`` to ``path``; while that fails, keep it in the fallback file
    and write again with growing pauses until it succeeds (True) or a signal lands in
    ``stop_waiting`` (False: the fallback file keeps the status). ``say``: where the
    wrapper's messages go (default: its stderr)."""
    say = _say if say is None else say
    try:
        write_exit_status(path, exit_code)
        return True
    except OSError as exc:
        fallback = _write_fallback(path, exit_code)
        say(f"pollux: cannot record exit status {exit_code} in {path} ({exc}); "
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
        say(f"pollux: exit status {exit_code} recorded in {path}")
        return True
    return False


def _say(message: str) -> None:
    try:
        print(message, file=sys.stderr, flush=True)
    except OSError:  # the log is on the full disk too
        pass


def siblings() -> tuple[ModuleType, ModuleType]:
    """:mod:`~pollux.backends.replica_log` and :mod:`~pollux.backends.supervisor`,
    imported from beside this file when it runs by path (``python -I``: no package)."""
    if __package__:
        package = __package__
        return (importlib.import_module(f"{package}.replica_log"),
                importlib.import_module(f"{package}.supervisor"))
    here = str(Path(SCRIPT).parent)
    if here not in sys.path:
        sys.path.append(here)  # after the standard library: nothing of it is shadowed
    return importlib.import_module("replica_log"), importlib.import_module("supervisor")


def open_log(path: str | None, budget_bytes: int) -> Any:
    """The replica's BoundedLog at ``path`` (None: no log, or it cannot be opened: the
    command's output then goes where the wrapper's does)."""
    if path is None:
        return None
    replica_log, _ = siblings()
    try:
        return replica_log.BoundedLog(path, budget_bytes)
    except (OSError, ValueError) as exc:
        _say(f"pollux: cannot open the log {path} ({exc}); output goes to the wrapper's")
        return None


def _detach_output() -> None:
    """Point this process's stdout and stderr at /dev/null."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for descriptor in (1, 2):
            os.dup2(null, descriptor)
    finally:
        os.close(null)


def run(status_path: Path, command: list[str], log_path: str | None = None,
        log_budget_bytes: int = 0) -> int:
    """Run ``command``, forwarding signals, its output into the bounded log
    ``log_path``; end its whole process tree with it; record and return its exit
    status."""
    _, supervisor = siblings()
    log = open_log(log_path, log_budget_bytes)
    say = _say if log is None else log.say
    if log is not None:  # its own output too goes to the log (the file it was given as
        _detach_output()  # stdout would stay allocated, held open, once rotated away)
    env = {k: v for k, v in os.environ.items() if k != FALLBACK_ENV}
    child = supervisor.Supervised(command, env=env, log=log)
    early: list[int] = []
    ended: list[int] = []
    stop_waiting: list[int] = []

    def forward(signum: int, frame: object) -> None:
        if ended:  # the command is over: only the wait to record its status is left
            if signum in STOP_WAITING_SIGNALS:
                stop_waiting.append(signum)
            return
        if not child.started:
            early.append(signum)  # arrived before the child existed: deliver it after
            return
        child.send_signal(signum)

    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, forward)
    try:
        child.start()
    except OSError as exc:
        say(f"pollux: cannot start {command[0]!r}: {exc}")
        ended.append(127)
        record_exit_status(status_path, 127, stop_waiting, say)
        if log is not None:
            log.close()
        return 127
    for signum in early:
        forward(signum, None)
    code = child.wait()
    ended.append(code)
    record_exit_status(status_path, code, stop_waiting, say)
    if log is not None:
        log.close()
    return int(code)


USAGE = ("usage: exit_status.py STATUS_FILE [--log LOG --log-budget BYTES] "
         "[--fallback-dir DIR] -- COMMAND [ARGS...]")


def parse_args(argv: list[str]) -> tuple[Path, dict[str, str], list[str]]:
    """STATUS_FILE, the options (``--name value``) and the command of ``argv``."""
    if not argv or "--" not in argv[1:]:
        sys.exit(USAGE)
    split = argv.index("--", 1)
    words, command = argv[1:split], argv[split + 1:]
    if not command or len(words) % 2 or any(
            w not in ("--log", "--log-budget", "--fallback-dir") for w in words[::2]):
        sys.exit(USAGE)
    return Path(argv[0]), dict(zip(words[::2], words[1::2])), command


def main(argv: list[str]) -> None:
    status_path, options, command = parse_args(argv)
    if "--fallback-dir" in options:
        os.environ[FALLBACK_ENV] = options["--fallback-dir"]  # for this process only
    try:
        budget = int(options.get("--log-budget", "0"))
    except ValueError:
        sys.exit(USAGE)
    code = run(status_path, command, options.get("--log"), budget)
    if code < 0:  # end the way the child did, so the parent sees the same status
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])

"""Checkpoint and restart: named state objects, saved atomically, restored on start.

A checkpoint is one file ``checkpoint-<sequence>.pt`` in the job's checkpoint directory
holding the ``state_dict()`` of every registered object under its name (model,
optimizer, data-loader cursor, RNG states, profile, gradient statistics, user state...).

Crash safety:

* the file is written to a temporary name, flushed and ``fsync``-ed, renamed into place
  (atomic on POSIX), and the directory is ``fsync``-ed; older checkpoints are deleted only
  after that, so there is always at least one complete checkpoint on disk;
* the file starts with a magic string, the payload length and its SHA-256: a torn,
  truncated or corrupted file is detected and skipped in favour of an older one.

Every rank calls :meth:`CheckpointManager.save` at the same step (state objects may run
collectives in ``state_dict``, e.g. to gather per-rank RNG states); rank 0 writes.
On start, rank 0 picks the newest valid checkpoint and all ranks restore from it as
objects register (:meth:`CheckpointManager.register`).
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import pickle
import re
import struct
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist

from pollux.errors import ConfigError, InvalidCheckpointError
from pollux.jobenv import CORRUPT_CHECKPOINT_EXIT_CODE, CORRUPT_SUFFIX, ON_CORRUPT_CHECKPOINT

logger = logging.getLogger(__name__)

MAGIC = b"POLLUX-CHECKPOINT-1\n"
_HEADER = struct.Struct("<Q32s")  # payload length, sha256 of the payload
_NAME = re.compile(r"checkpoint-(\d{8,18})\.pt")
"""Names written by :func:`checkpoint_path` (8 digits, more past 99,999,999; more than 18
is no sequence of ours: ignored, as its next name could not be created); matched
with ``fullmatch``. A file so named without :data:`MAGIC` is not ours and is ignored."""
ON_CORRUPT_CHOICES = ("fail", "fresh")
"""What a job does when every checkpoint is corrupt: stop with the reason, or start over."""
DEFAULT_WRITE_CHUNK_BYTES = 4 << 20


class Checkpointable(Protocol):
    """Anything with ``state_dict()`` and ``load_state_dict(state)``."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> None: ...


class CorruptCheckpointsError(SystemExit):
    """Every checkpoint of the job is corrupt and the job chose to fail rather than start
    over: the process exits with :data:`~pollux.jobenv.CORRUPT_CHECKPOINT_EXIT_CODE`, which
    the scheduler reports as the job's failure reason (the details are in the log)."""

    def __init__(self, message: str) -> None:
        super().__init__(CORRUPT_CHECKPOINT_EXIT_CODE)
        self.message = message

    def __str__(self) -> str:
        return self.message


def on_corrupt_from_env(environ: Mapping[str, str] | None = None) -> str:
    """The launcher's choice for all-corrupt checkpoints (``fail`` when not launched by
    Pollux)."""
    env = os.environ if environ is None else environ
    return env.get(ON_CORRUPT_CHECKPOINT, "fail")


@dataclass(frozen=True)
class CheckpointFile:
    """One complete-looking checkpoint file on disk."""

    path: Path
    sequence: int


@dataclass(frozen=True)
class _FunctionState:
    save: Callable[[], Any]
    load: Callable[[Any], None]

    def state_dict(self) -> Any:
        return self.save()

    def load_state_dict(self, state: Any) -> None:
        self.load(state)


def checkpoint_path(directory: Path, sequence: int) -> Path:
    return directory / f"checkpoint-{sequence:08d}.pt"


def list_checkpoints(directory: str | os.PathLike[str]) -> list[CheckpointFile]:
    """Checkpoint files (by name) in ``directory``, oldest first."""
    path = Path(directory)
    if not path.is_dir():
        return []
    found = []
    for entry in path.iterdir():
        match = _NAME.fullmatch(entry.name)
        if match and _starts_with_magic(entry):
            found.append(CheckpointFile(entry, int(match.group(1))))
    return sorted(found, key=lambda f: f.sequence)


def _starts_with_magic(path: Path) -> bool:
    """Whether ``path`` is a regular file that begins like a Pollux checkpoint (foreign
    files under a checkpoint's name never steer the sequence, loading or pruning)."""
    try:
        with open(path, "rb") as handle:
            return path.is_file() and handle.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint_file(path: Path, payload: bytes,
                          chunk_bytes: int = DEFAULT_WRITE_CHUNK_BYTES) -> None:
    """Atomically write ``payload`` (with its header) to ``path``: temp, fsync, rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    digest = hashlib.sha256(payload).digest()
    with open(tmp, "wb") as f:
        f.write(MAGIC)
        f.write(_HEADER.pack(len(payload), digest))
        view = memoryview(payload)
        for start in range(0, len(view), chunk_bytes):
            f.write(view[start:start + chunk_bytes])
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_directory(path.parent)


def read_checkpoint_file(path: Path) -> bytes:
    """The verified payload of a checkpoint file; raises InvalidCheckpointError."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InvalidCheckpointError(f"{path}: unreadable ({exc})") from exc
    head = len(MAGIC) + _HEADER.size
    if len(data) < head or not data.startswith(MAGIC):
        raise InvalidCheckpointError(f"{path}: not a Pollux checkpoint (bad header)")
    length, digest = _HEADER.unpack_from(data, len(MAGIC))
    payload = data[head:]
    if len(payload) != length:
        raise InvalidCheckpointError(f"{path}: torn ({len(payload)} of {length} bytes)")
    if hashlib.sha256(payload).digest() != digest:
        raise InvalidCheckpointError(f"{path}: checksum mismatch")
    return payload


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Decode a verified checkpoint file into ``{"meta": ..., "states": {name: state}}``."""
    payload = read_checkpoint_file(path)
    # weights_only: a planted file must not run code when unpickled; the agent's own
    # state needs only tensors, containers and numpy arrays (RNG states) besides.
    try:
        with torch.serialization.safe_globals(agent_safe_globals()):
            content = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise InvalidCheckpointError(
            f"{path}: holds objects outside the allow-list of checkpoint contents ("
            f"{str(exc).splitlines()[-1] if str(exc) else exc!r}); register plain state "
            "(tensors, numbers, lists, dicts) or allow your type with "
            "torch.serialization.add_safe_globals([YourType])") from exc
    except Exception as exc:  # a verified file that still does not decode: corrupt
        raise InvalidCheckpointError(f"{path}: cannot decode ({type(exc).__name__}: "
                                     f"{exc})") from exc
    if not isinstance(content, dict) or "states" not in content:
        raise InvalidCheckpointError(f"{path}: unexpected content")
    return content


def agent_safe_globals() -> list[Any]:
    """What the agent's own checkpoint state needs beyond tensors and Python containers:
    numpy arrays and scalars (``np.random.get_state()``) and their dtypes."""
    multiarray = getattr(np, "_core", None) or np.core
    dtypes = [type(np.dtype(code)) for code in "?bBhHiIlLqQefdgFDGUSV"]
    return [multiarray.multiarray._reconstruct, multiarray.multiarray.scalar, np.ndarray,
            np.dtype, *dtypes]


def latest_valid_checkpoint(
    directory: str | os.PathLike[str],
) -> tuple[CheckpointFile, dict[str, Any]] | None:
    """The newest checkpoint that verifies and decodes, with its content; None if none."""
    for candidate in reversed(list_checkpoints(directory)):
        try:
            return candidate, load_checkpoint(candidate.path)
        except (InvalidCheckpointError, EOFError, RuntimeError, ValueError) as exc:
            logger.warning("skipping checkpoint %s: %s", candidate.path, exc)
    return None


class CheckpointManager:
    """Registry of named state objects, saved together and restored on registration.

    ``directory=None`` disables checkpointing (every call is a no-op). Give every rank
    the same directory (shared storage across nodes).

    >>> job.checkpoint.register_functions("my/step", lambda: step, restore_step)  # doctest: +SKIP
    >>> job.checkpoint.save()  # every rank, at the same step  # doctest: +SKIP
    """

    def __init__(self, directory: str | os.PathLike[str] | None, *, rank: int = 0,
                 group: Any = None, keep: int = 2,
                 write_chunk_bytes: int = DEFAULT_WRITE_CHUNK_BYTES,
                 on_corrupt: str | None = None) -> None:
        """``on_corrupt``: when checkpoints exist but none is valid, ``fail`` (raise
        :class:`CorruptCheckpointsError`, the default) or ``fresh`` (set the corrupt files
        aside as ``*.corrupt`` and start over); None: the launcher's choice
        (``POLLUX_ON_CORRUPT_CHECKPOINT``)."""
        if keep < 1:
            raise ConfigError("checkpoints_kept", keep, "keep at least 1 checkpoint")
        self.on_corrupt = on_corrupt_from_env() if on_corrupt is None else on_corrupt
        if self.on_corrupt not in ON_CORRUPT_CHOICES:
            raise ConfigError("on_corrupt_checkpoint", self.on_corrupt,
                              f"choose {' or '.join(ON_CORRUPT_CHOICES)}")
        self.directory = None if directory is None else Path(directory)
        self.rank = rank
        self.group = group
        self.keep = keep
        self.write_chunk_bytes = write_chunk_bytes
        self._objects: dict[str, Checkpointable] = {}
        self._restored: dict[str, Any] = {}
        self._writer: threading.Thread | None = None
        self._write_error: BaseException | None = None
        self.restored_sequence: int | None = None
        """Sequence number of the checkpoint this run started from (None: fresh start)."""
        self.last_sequence: int = 0
        self.last_save_time = time.monotonic()
        if self.directory is not None:
            self._find_and_load()

    @property
    def enabled(self) -> bool:
        return self.directory is not None

    def _distributed(self) -> bool:
        return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1

    def _find_and_load(self) -> None:
        assert self.directory is not None
        choice: list[Any] = [None, 0, None]
        if self.rank == 0:
            self.directory.mkdir(parents=True, exist_ok=True)
            for stale in self.directory.glob(".checkpoint-*.tmp"):
                stale.unlink(missing_ok=True)
            existing = list_checkpoints(self.directory)
            found = latest_valid_checkpoint(self.directory)
            choice = [None if found is None else found[0].sequence,
                      max((f.sequence for f in existing), default=0), None]
            if found is not None:
                self._restored = found[1]["states"]
            elif existing:
                choice[2] = self._all_corrupt(existing)
        if self._distributed():
            dist.broadcast_object_list(choice, src=0, group=self.group)
        sequence, highest, failure = choice
        if failure is not None:
            raise CorruptCheckpointsError(failure)
        self.last_sequence = int(highest)
        if sequence is not None and self.rank != 0:
            self._restored = load_checkpoint(checkpoint_path(self.directory, sequence))["states"]
        self.restored_sequence = sequence
        if sequence is not None:
            logger.info("restoring from checkpoint %d in %s", sequence, self.directory)

    def _all_corrupt(self, existing: list[CheckpointFile]) -> str | None:
        """Every checkpoint in ``existing`` failed to load: the failure message (``fail``),
        or None after setting them aside to start fresh (``fresh``)."""
        names = ", ".join(f.path.name for f in existing)
        if self.on_corrupt == "fresh":
            for corrupt in existing:
                corrupt.path.rename(corrupt.path.with_name(corrupt.path.name + CORRUPT_SUFFIX))
            logger.error("all %d checkpoints in %s are corrupt (%s): starting fresh as "
                         "on_corrupt_checkpoint=fresh asks; they were renamed *%s",
                         len(existing), self.directory, names, CORRUPT_SUFFIX)
            return None
        message = (f"all {len(existing)} checkpoints in {self.directory} are corrupt "
                   f"({names}; the log above says why); not starting over from scratch: "
                   "repair or remove them, or set on_corrupt_checkpoint: fresh")
        logger.error("%s", message)
        return message

    def register(self, name: str, obj: Checkpointable) -> bool:
        """Add a named state object; restore it now if the checkpoint has it.

        Returns True when the object was restored. Register in the same order on every
        rank.
        """
        if name in self._objects:
            raise ConfigError("checkpoint name", name, "each state needs a unique name")
        if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
            raise ConfigError(f"checkpoint state {name!r}", type(obj).__name__,
                              "give an object with state_dict() and load_state_dict()")
        self._objects[name] = obj
        if name in self._restored:
            obj.load_state_dict(self._restored.pop(name))
            return True
        return False

    def register_functions(self, name: str, save: Callable[[], Any],
                           load: Callable[[Any], None]) -> bool:
        """Register a state given as a pair of functions."""
        return self.register(name, _FunctionState(save, load))

    def is_restored(self) -> bool:
        return self.restored_sequence is not None

    def save(self, *, background: bool = False) -> int | None:
        """Save every registered object; call on all ranks at the same step.

        Rank 0 writes. With ``background``, the file is written (and older ones pruned)
        by a thread while training goes on; otherwise this returns once it is durable.
        Returns the checkpoint's sequence number (None when disabled).
        """
        if self.directory is None:
            return None
        states = {name: obj.state_dict() for name, obj in self._objects.items()}
        self.last_sequence += 1
        sequence = self.last_sequence
        self.last_save_time = time.monotonic()
        if self.rank == 0:
            self.wait()
            buffer = io.BytesIO()
            meta = {"sequence": sequence, "time": time.time(),
                    "num_replicas": dist.get_world_size() if dist.is_initialized() else 1}
            torch.save({"meta": meta, "states": states}, buffer)
            payload = buffer.getvalue()
            path = checkpoint_path(self.directory, sequence)
            if background:
                self._writer = threading.Thread(target=self._write, args=(path, payload),
                                                name="pollux-checkpoint", daemon=True)
                self._writer.start()
            else:
                self._write(path, payload)
                self._raise_write_error()
        if not background and self._distributed():
            dist.barrier(group=self.group)
        return sequence

    def _write(self, path: Path, payload: bytes) -> None:
        try:
            write_checkpoint_file(path, payload, self.write_chunk_bytes)
            self._prune()
            logger.info("checkpoint written: %s (%d bytes)", path, len(payload))
        except BaseException as exc:  # reported by wait()/save(); never silently lost
            self._write_error = exc

    def _prune(self) -> None:
        assert self.directory is not None
        files = list_checkpoints(self.directory)
        for old in files[:-self.keep]:
            old.path.unlink(missing_ok=True)

    def _raise_write_error(self) -> None:
        if self._write_error is not None:
            error, self._write_error = self._write_error, None
            raise error

    def wait(self) -> None:
        """Block until a background write has finished (and raise its error, if any)."""
        if self._writer is not None:
            self._writer.join()
            self._writer = None
        self._raise_write_error()

"""The one exception hierarchy of Pollux.

PolluxError
  +-- ConfigError (ValueError)        bad input: names the field, the value and the fix
  |     +-- JobSpecError               a job specification is invalid
  +-- WorkloadError (ValueError)      a workload or trace file is malformed (file, line, field)
  +-- UnknownPluginError (KeyError)   a policy/backend/autoscaler name that is not registered
  +-- MixedGpuTypesError              an allocation spanning nodes of different GPU types
  +-- StoreError                      a job-store operation that cannot apply
  |     +-- UnknownJobError (KeyError) no job by that id or name
  |     +-- UnknownUserError (KeyError) no registered user by that name
  |     +-- StoreUnavailableError      the store cannot be written now (full disk, locked)
  |     +-- StoreDamagedError          the store's file does not read back (use --recover)
  +-- StartupError                    the server cannot start: names the path and the fix
  +-- BackendError                    a backend could not do what it was asked (a launch)
  |     +-- SlurmCommandError          Slurm answered and refused a command
  |     +-- SlurmUnavailable           Slurm could not be reached (after retries)
  +-- ForbiddenError                  an identity acting beyond its rights (names the rule)
  +-- ServiceError                    the server refused a request (status, field, message)
  +-- ServerUnreachableError          no server could be found or reached
  +-- UntrustedPeerError (OSError)    the process behind the server's socket is not ours
  +-- NotInitializedError (RuntimeError) an AdaptDL-shaped call before init_process_group
  +-- InvalidCheckpointError          a torn, truncated or corrupted checkpoint file
FitWarning (UserWarning)              a throughput fit that did not converge cleanly

Every ``ConfigError`` is also a ``ValueError`` so callers that only know the standard
library can still catch it.
"""

from __future__ import annotations

from collections.abc import Iterable


class PolluxError(Exception):
    """Base class of every error raised by Pollux on purpose."""


class ConfigError(PolluxError, ValueError):
    """Bad input: the message names the offending field, its value and the fix."""

    def __init__(self, field: str, value: object, fix: str) -> None:
        self.field = field
        self.value = value
        self.fix = fix
        super().__init__(f"invalid {field}={value!r}: {fix}")


class WorkloadError(PolluxError, ValueError):
    """A workload or trace file is malformed; the message names file, line and field."""

    def __init__(self, path: str, line: int | None, field: str, message: str) -> None:
        self.path = path
        self.line = line
        self.field = field
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: field '{field}': {message}")


class JobSpecError(ConfigError):
    """A job specification is invalid."""


class UnknownPluginError(PolluxError, KeyError):
    """A plugin name (policy, backend, ...) that is not registered."""

    def __init__(self, kind: str, name: str, choices: Iterable[str]) -> None:
        self.kind = kind
        self.name = name
        self.choices = sorted(choices)
        self.message = f"unknown {kind} {name!r}; choose from: {', '.join(self.choices)}"
        super().__init__(self.message)

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return self.message


class MixedGpuTypesError(PolluxError):
    """An allocation whose replicas sit on nodes of different GPU types."""


class StoreError(PolluxError):
    """A store operation that cannot apply (unknown job, illegal or stale transition)."""


class UnknownJobError(StoreError, KeyError):
    """No job with that id or name."""

    def __init__(self, ref: str, detail: str = "no such job") -> None:
        self.ref = ref
        self.message = f"{detail}: {ref!r}"
        super().__init__(self.message)

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return self.message


class UnknownUserError(StoreError, KeyError):
    """No registered user by that name."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.message = f"no user named {name!r} (see 'pollux user ls')"
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message


class StoreUnavailableError(StoreError):
    """The job store could not be written (or read) now: its disk is full, or a lock
    outlasted the retries. The operation was rolled back: nothing stored changed."""

    def __init__(self, path: object, detail: str, full: bool = False) -> None:
        self.path = path
        self.full = full
        self.detail = detail
        where = f"the data directory {getattr(path, 'parent', path)}"
        super().__init__(
            f"{where} is full ({detail}); nothing was stored: free space there and retry"
            if full else f"the job store {path} is unavailable now ({detail}); nothing was "
                         "changed: retry")


class StoreDamagedError(StoreError):
    """The job store (or one job's record in it) cannot be read: its file is damaged.
    Retrying does not help; the message names the store and the fix."""

    def __init__(self, path: object, detail: str, job_id: str | None = None) -> None:
        self.path = path
        self.detail = detail
        self.job_id = job_id
        if job_id is not None:
            message = (f"the record of job {job_id} in the job store {path} is damaged "
                       f"({detail}); the other jobs are served. Restore the store from a "
                       "backup with `pollux server --recover`")
        else:
            message = (f"the job store {path} is damaged ({detail}); retrying will not "
                       "help: stop the server and run `pollux server --recover` (it sets "
                       "the damaged file aside and restores the newest backup)")
        super().__init__(message)


class StartupError(PolluxError):
    """The server cannot start: one line naming the path, what is wrong and the fix."""

    def __init__(self, path: object, problem: str, fix: str) -> None:
        self.path = path
        self.problem = problem
        self.fix = fix
        super().__init__(f"cannot start: {path}: {problem}; {fix}")


class BackendError(PolluxError):
    """A backend could not do what it was asked (e.g. a launch failed)."""


class SlurmCommandError(BackendError):
    """Slurm answered, and refused the command."""


class SlurmUnavailable(BackendError):  # noqa: N818 - a state, named as Slurm users say it
    """Slurm could not be reached (after retries): nothing is known now."""


class ForbiddenError(PolluxError):
    """An identity asked for what its rights do not cover; the message names the rule
    (the API answers 403 with it), ``field`` what the refusal is about."""

    def __init__(self, message: str, field: str | None = None) -> None:
        self.message = message
        self.field = field
        super().__init__(message)


class ServiceError(PolluxError):
    """The server refused a request (status, the field it names, its message)."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        self.status = status
        self.field = field
        super().__init__(f"server said {status}: {message}")


class ServerUnreachableError(PolluxError):
    """No server could be found or reached."""


class UntrustedPeerError(PolluxError, OSError):
    """The process behind the server's Unix socket is not this user's (nor root's)."""


class NotInitializedError(PolluxError, RuntimeError):
    """An AdaptDL-shaped call that needs the job came before ``init_process_group``."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what} needs the job: call adaptdl.torch.init_process_group("
                         "backend) first (after `import pollux.adaptdl.torch`)")


class InvalidCheckpointError(PolluxError):
    """A checkpoint file that is torn, truncated or corrupted (internal: it is skipped)."""


class FitWarning(UserWarning):
    """A throughput fit that failed or produced non-finite values (best finite kept)."""

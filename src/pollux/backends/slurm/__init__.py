"""The Slurm backend (``pollux server --backend slurm``): see
:mod:`pollux.backends.slurm.backend`."""

from pollux.backends.slurm.backend import SlurmBackend

__all__ = ["SlurmBackend"]

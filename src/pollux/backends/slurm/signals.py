"""Asking a launch's replicas to stop, through Slurm.

Cluster mode: ``scancel --signal TERM`` reaches every step of the launch's job (each
replica checkpoints and exits 75); a forced stop kills steps and batch shell
(``--full --signal KILL``) and cancels the job; a job that has not started is simply
withdrawn. Allocation mode: each replica's step by name (``squeue --steps``), or its
``srun`` while the step does not exist yet. When Slurm cannot be told now, the signal
is remembered on the launch (``pending_signal``) and sent again at the next poll.
"""

from __future__ import annotations

import logging
import signal

from pollux.backends.slurm.commands import SlurmCommands
from pollux.backends.slurm.launches import SlurmLaunch
from pollux.backends.slurm.states import Phase
from pollux.errors import BackendError

logger = logging.getLogger(__name__)


def signal_cluster(commands: SlurmCommands, launch: SlurmLaunch, signal_name: str) -> bool:
    """Signal a cluster-mode launch (``TERM`` or ``KILL``); False when Slurm could not be
    told (the signal stays pending)."""
    try:
        if launch.last_phase in (None, Phase.WAITING) and signal_name == "TERM":
            commands.cancel(launch.slurm_job_id)  # nothing runs yet: withdraw it
        elif signal_name == "TERM":
            commands.signal(launch.slurm_job_id, "TERM")
        else:
            commands.signal(launch.slurm_job_id, "KILL", full=True)
            commands.cancel(launch.slurm_job_id)
    except BackendError as exc:
        logger.warning("cannot signal Slurm job %s (%s); trying again", launch.slurm_job_id,
                       exc)
        launch.pending_signal = signal_name
        return False
    launch.pending_signal = None
    return True


def signal_steps(commands: SlurmCommands, launch: SlurmLaunch, signal_name: str) -> None:
    """Signal the live replicas of an allocation-mode launch."""
    live = [r for r in launch.replicas if r.exit_code is None
            and (r.process is None or r.process.poll() is None)]
    try:
        steps = commands.steps(launch.slurm_job_id) if live else {}
    except BackendError as exc:
        logger.warning("cannot list the steps of allocation %s (%s); trying again",
                       launch.slurm_job_id, exc)
        launch.pending_signal = signal_name
        return
    launch.pending_signal = None
    for replica in live:
        step = steps.get(replica.step)
        try:
            if step is not None:
                commands.signal(step, signal_name)
            elif replica.process is not None:  # no step yet: withdraw the request
                replica.process.send_signal(signal.SIGTERM)
            if signal_name == "KILL" and replica.process is not None:
                replica.process.kill()
        except BackendError as exc:
            logger.warning("cannot signal step %s (%s); trying again", step, exc)
            launch.pending_signal = signal_name
        except ProcessLookupError:
            pass

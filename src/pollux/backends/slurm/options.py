"""The Slurm backend's options, each with the help text of its ``pollux server`` flag
(:mod:`pollux.options`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pollux.options import option


@dataclass(frozen=True)
class SlurmOptions:
    """Where the Slurm backend launches (``--backend slurm``)."""

    mode: str | None = option(
        None, flag="--slurm-mode", choices=("cluster", "allocation"),
        help="cluster: one sbatch job per launch; allocation: job steps of the allocation "
             "the server runs in (default: allocation when SLURM_JOB_ID is set, else "
             "cluster)")
    partition: str | None = option(
        None, flag="--slurm-partition", metavar="P",
        help="cluster mode: the partition to schedule and submit to (default: every node "
             "Slurm lists, submitted to the default partition)")
    account: str | None = option(
        None, flag="--slurm-account", metavar="A",
        help="cluster mode: the account jobs are charged to")
    nodes: str | None = option(
        None, flag="--slurm-nodes", metavar="HOSTLIST",
        help="the nodes Pollux may use, a Slurm host list such as gpu[01-04] (default: "
             "the partition's, or the allocation's)")

    def backend_kwargs(self) -> dict[str, Any]:
        """The keyword options of :class:`~pollux.backends.slurm.SlurmBackend` (the log
        budget, shared with the local backend, comes from the backend section)."""
        return {"partition": self.partition, "account": self.account, "nodes": self.nodes,
                "mode": self.mode}

"""What an adaptive job maximizes when it picks its batch size, as an autoscaler sees it.

A goodput-aware system (Pollux) lets each job pick the batch size of highest *goodput*:
throughput times statistical efficiency. A throughput-based system (the baseline of
:class:`~pollux.policies.autoscaling.autoscaler.ThroughputAutoscaler`, after Or et al.,
MLSys'20) ignores statistical efficiency there too: the job trains at the batch size of
highest *throughput* (samples per second), which grows with its GPUs up to the largest
batch it allows, however little each extra sample then contributes. Every autoscaler
declares which of the two its jobs use (``Autoscaler.batch_objective``); drivers that
simulate jobs (:mod:`pollux.sim`) honour it. The job's true progress is unchanged: only
its choice of batch (and the speedup it reports) differs.
"""

from __future__ import annotations

from enum import Enum


class BatchObjective(Enum):
    """What an adaptive job's batch size maximizes."""

    GOODPUT = "goodput"
    """Throughput times statistical efficiency (Pollux)."""
    THROUGHPUT = "throughput"
    """Samples per second, statistical efficiency ignored (throughput-based systems)."""

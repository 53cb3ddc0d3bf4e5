"""In words for a job's events: why it was resized or changed its batch size, how a
replica ended.

Computed from what the job itself reported (its :class:`~pollux.models.JobHints`): the
predicted goodput (useful samples/s) of the old and the new configuration and, where it
explains the choice, the step time split into compute and gradient synchronization.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Mapping, Sequence

from pollux.errors import ConfigError
from pollux.jobenv import CORRUPT_CHECKPOINT_EXIT_CODE
from pollux.models import JobHints
from pollux.models.throughput import compute_time, sync_time
from pollux.service.loop.recovery import LOST_EXIT_CODE
from pollux.service.storage.records import JobRecord


def replicas_text(count: int) -> str:
    return f"{count} replica{'' if count == 1 else 's'}"


def describe_exit(code: int | None) -> str:
    """How a replica ended, in words for events (``code`` None: it vanished)."""
    if code is None:
        return "vanished"
    if code == LOST_EXIT_CODE:
        return "was lost with its server"
    if code == CORRUPT_CHECKPOINT_EXIT_CODE:
        return ("found only corrupt checkpoints and did not start over (its log says why; "
                "on_corrupt_checkpoint: fresh starts over)")
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _rate(samples_per_s: float) -> str:
    """``'31,010'``, ``'759.9'``, ``'0.512'``: whole samples/s above 1000."""
    if samples_per_s >= 1000:
        return f"{samples_per_s:,.0f}"
    return f"{samples_per_s:.4g}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.3g} ms"


def _best(hints: JobHints, num_nodes: int, num_replicas: int) -> tuple[float, int, int]:
    """(goodput, atomic batch, accumulation steps) of the best batch on an allocation."""
    goodput = hints.goodput_function()
    assert goodput is not None
    good, bsz, accum = goodput.optimize(num_nodes, num_replicas, hints.max_batch_size,
                                        hints.local_bsz_bounds, hints.accumulation)
    return float(good), int(bsz), int(accum)


def rescale_reason(hints: JobHints | None, old: Sequence[str], new: Sequence[str],
                   num_other_jobs: int, gpu_types: Mapping[str, str] | None = None) -> str:
    """Why the policy moved a job from allocation ``old`` to ``new`` (node per replica);
    ``gpu_types``: node -> GPU type on a typed cluster."""
    if not new:
        return "preempted for other jobs" if num_other_jobs else "preempted"
    old_type = new_type = None
    if gpu_types and old:
        old_type, new_type = gpu_types.get(old[0]), gpu_types.get(new[0])
    if old_type is not None and new_type is not None and old_type != new_type:
        return type_change_reason(hints, old, new, old_type, new_type)
    if hints is None or hints.goodput_function() is None:
        return "no throughput profile yet: the policy assumes a linear speedup"
    try:
        old_good, old_bsz, _ = _best(hints, max(len(set(old)), 1), max(len(old), 1))
        new_good, new_bsz, _ = _best(hints, len(set(new)), len(new))
    except ConfigError:
        return "the job's hints do not allow a prediction"
    if not (math.isfinite(old_good) and math.isfinite(new_good)):
        return "the job's hints do not allow a prediction"
    params = hints.throughput_params
    assert params is not None
    better, worse = (new, old) if new_good >= old_good else (old, new)
    good_better, good_worse = max(new_good, old_good), min(new_good, old_good)
    text = (f"{replicas_text(len(better))} {'has' if len(better) == 1 else 'have'} the "
            f"higher goodput: {_rate(good_better)} vs {_rate(good_worse)} samples/s")
    if len(new) < len(old) and new_good >= old_good:
        # shrinking helps the job itself: synchronization outweighs the extra compute
        sync = float(sync_time(params, len(set(old)), len(old)))
        compute = float(compute_time(params, old_bsz))
        text += f" (on {len(old)}: sync {_ms(sync)} vs compute {_ms(compute)} per step)"
    elif len(new) < len(old) and num_other_jobs:
        text = (f"shared with {num_other_jobs} other job{'s' if num_other_jobs > 1 else ''}"
                f" (its predicted goodput {_rate(old_good)} -> {_rate(new_good)} samples/s)")
    elif len(new) > len(old):
        text = (f"predicted goodput {_rate(old_good)} -> {_rate(new_good)} samples/s "
                f"on {replicas_text(len(new))}")
    elif sorted(new) != sorted(old):
        text = f"moved to {', '.join(sorted(set(new)))} (placement)"
    return text


def type_change_reason(hints: JobHints | None, old: Sequence[str], new: Sequence[str],
                       old_type: str, new_type: str) -> str:
    """Why a job moved from GPU type ``old_type`` to ``new_type``, with the goodputs its
    per-type models predict when it has a model of both."""
    text = f"moved from GPU type {old_type} to {new_type}"
    try:
        model = None if hints is None else hints.typed_goodput()
        if model is None or not model.has_model(new_type):
            return text + f" (no profile on {new_type} yet)"
        if model.has_model(old_type):
            old_good = float(model.goodput(old_type, len(set(old)), len(old)))
            new_good = float(model.goodput(new_type, len(set(new)), len(new)))
            if math.isfinite(old_good) and math.isfinite(new_good):
                text += (f" (predicted goodput {_rate(old_good)} -> {_rate(new_good)} "
                         f"samples/s on {replicas_text(len(new))})")
    except ConfigError:
        pass  # hints that allow no prediction: the move alone
    return text


def batch_change_reason(hints: JobHints, num_nodes: int, num_replicas: int,
                        old_batch_size: int) -> str:
    """Why the job's agent moved from ``old_batch_size`` to ``hints.batch_size``."""
    goodput = hints.goodput_function()
    if goodput is None or hints.local_bsz is None or hints.grad_stats is None:
        return "the agent's initial configuration"
    accum = hints.accum_steps or 0
    try:
        new_good = float(goodput.evaluate(num_nodes, num_replicas, hints.local_bsz, accum))
        lo, hi = hints.local_bsz_bounds
        per_replica = old_batch_size / num_replicas
        old_micro = max(1, math.ceil(per_replica / hi)) if hints.accumulation else 1
        old_local = min(max(round(per_replica / old_micro), lo), hi)
        old_good = float(goodput.evaluate(num_nodes, num_replicas, old_local, old_micro - 1))
    except ConfigError:
        return "goodput-optimal for the job's new profile"
    noise = hints.grad_stats.noise_scale(hints.init_batch_size)
    noise_text = f"noise scale {noise:.3g} samples" if math.isfinite(noise) else "noise scale -"
    return (f"goodput {_rate(new_good)} vs {_rate(old_good)} samples/s at batch {old_batch_size} on "
            f"{replicas_text(num_replicas)} (gradient {noise_text}, efficiency "
            f"{float(goodput.efficiency(hints.batch_size or 0)):.2f})")


def batch_change_event(before: JobRecord, hints: JobHints) -> str | None:
    """The event for new ``hints`` of a job whose record was ``before``, when its batch
    size changed on the same allocation; None otherwise."""
    old = before.hints
    if (old is None or old.batch_size is None or hints.batch_size is None
            or old.batch_size == hints.batch_size or not before.allocation):
        return None
    num_replicas, num_nodes = len(before.allocation), len(set(before.allocation))
    why = batch_change_reason(hints, num_nodes, num_replicas, old.batch_size)
    return f"batch size {old.batch_size} -> {hints.batch_size}: {why}"

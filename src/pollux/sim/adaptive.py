"""What a Pollux (adaptive) job knows about itself in the simulator.

Like the real agent, a simulated adaptive job records every configuration it has run
(nodes, replicas, atomic batch) with its true step and sync times, refits the step-time
model whenever a new configuration appears, keeps its latest gradient statistics, and
reports its hints (:class:`~pollux.models.hints.JobHints`) to the scheduler, which turns
them into the policy's speedup function (:mod:`pollux.policies.snapshot`); the job
(:class:`~pollux.sim.job.SimJob`) picks its batch size from the same model.

What the batch size maximizes is the profile's ``objective``: goodput (Pollux, the
default) or throughput, statistical efficiency ignored (the jobs of a throughput-based
autoscaler). Efficiency is ignored with the same model by gradient statistics of
infinite noise scale (``sqr = 0``, ``var > 0``), for which every batch is fully efficient
(gain equals the batch scale), so goodput becomes throughput over the initial batch size.
Only the choice (and the reported speedup) changes: the job's true progress always
follows its true gradient statistics.
"""

from __future__ import annotations

from pollux.models import GradientStats, JobHints, ThroughputParams, fit_throughput_params
from pollux.policies.autoscaling.objective import BatchObjective
from pollux.sim.applications import ApplicationSpec

ConfigKey = tuple[int, int, int]
"""(num_nodes, num_replicas, atomic batch size)."""
FitRows = tuple[tuple[float, float, float, float, float], ...]
"""Observations as (num_nodes, num_replicas, atomic batch, compute s, step s) rows."""
EFFICIENCY_IGNORED = GradientStats(sqr=0.0, var=1.0)
"""Gradient statistics for which every batch size is fully efficient (gain = scale)."""


class FitCache:
    """Memoized throughput fits: jobs of one application that ran the same configurations
    measured the same true times, so their fits are identical (the fit is deterministic).

    Every refit starts from the fit's own data-driven starting values (cold), as the
    reference simulator's jobs do. A warm start from the job's previous parameters (faster
    simulations) would inherit what the priors set before the data could say
    otherwise: without multi-node data ``beta_n`` is a multiple of ``beta_r``, and one
    multi-node replica count cannot separate ``alpha_n`` from ``beta_n``, so the first
    multi-node fit would stay pessimistic and the job held small while GPUs sit idle."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, FitRows], ThroughputParams] = {}
        self.num_fits = 0

    def fit(self, application: str, rows: FitRows) -> ThroughputParams:
        key = (application, tuple(sorted(rows)))
        found = self._cache.get(key)
        if found is None:
            found = fit_throughput_params(key[1])
            self._cache[key] = found
            self.num_fits += 1
        return found


class JobProfile:
    """Configurations run so far, the fitted step-time model and the latest gradient stats."""

    def __init__(self, spec: ApplicationSpec, fits: FitCache | None = None,
                 objective: BatchObjective = BatchObjective.GOODPUT,
                 known_params: ThroughputParams | None = None) -> None:
        self.spec = spec
        self.objective = objective
        """What the chosen batch size maximizes (and the reported speedup measures)."""
        self.known_params = known_params
        """The true step-time model, used from the first measurement on instead of a fit
        (oracle-knowledge experiments); None: fit the measurements (the agent's way)."""
        self._fits = FitCache() if fits is None else fits
        self.observations: dict[ConfigKey, tuple[float, float]] = {}
        """Config -> (step seconds, sync seconds) as first measured."""
        self.params: ThroughputParams | None = None
        self.grad_stats: GradientStats | None = None
        self.num_fits = 0

    @property
    def max_profiled_replicas(self) -> int:
        return max((key[1] for key in self.observations), default=0)

    def observe(self, num_nodes: int, num_replicas: int, atomic_bsz: int, step_time_s: float,
                sync_time_s: float, grad_sqr: float, grad_var: float) -> None:
        """Record one measurement; refit when the configuration is new."""
        if self.grad_stats is None or (self.grad_stats.sqr, self.grad_stats.var) != (
                grad_sqr, grad_var):
            self.grad_stats = GradientStats(sqr=max(grad_sqr, 0.0), var=max(grad_var, 0.0))
        key = (int(num_nodes), int(num_replicas), int(atomic_bsz))
        if key in self.observations:
            return
        self.observations[key] = (float(step_time_s), float(sync_time_s))
        if self.known_params is not None:
            self.params = self.known_params
            return
        rows = tuple((float(n), float(k), float(b), max(step - sync, 1e-9), step)
                     for (n, k, b), (step, sync) in self.observations.items())
        self.params = self._fits.fit(self.spec.name, rows)
        self.num_fits += 1

    def hints(self) -> JobHints:
        """What the job reports to the scheduler, as the agent does: its batch-size limits,
        its fitted model, its gradient statistics and how far it has explored. Under the
        THROUGHPUT objective the statistics reported are those for which every batch is
        fully efficient (what the job's batch choice assumes)."""
        spec = self.spec
        stats = (self.grad_stats if self.objective is BatchObjective.GOODPUT
                 or self.params is None else EFFICIENCY_IGNORED)
        return JobHints(init_batch_size=spec.init_batch_size,
                        max_batch_size=spec.max_batch_size,
                        local_bsz_bounds=(spec.min_local_bsz, spec.max_local_bsz),
                        accumulation=True, throughput_params=self.params, grad_stats=stats,
                        max_profiled_replicas=self.max_profiled_replicas)

"""Per-key token buckets: how often one job may post its hints.

A job's agent posts its hints every ``hints_interval_s`` (30 s) and at once when its
profile changes; each post is a durable store write (an fsync) and may add an event. A job
that posts in a loop would fill the event log and hold the store's writer; past its
budget it is answered 429 with ``Retry-After`` (the agent keeps its latest hints and
sends them at its next tick) and its posts cost the store nothing.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from pollux.errors import ConfigError


@dataclass(frozen=True)
class RateLimit:
    """A sustained rate and a burst a key may spend at once."""

    per_s: float = 1.0
    burst: int = 30

    def __post_init__(self) -> None:
        if not (math.isfinite(self.per_s) and self.per_s > 0):
            raise ConfigError("per_s", self.per_s, "use a rate > 0 per second")
        if isinstance(self.burst, bool) or not isinstance(self.burst, int) or self.burst < 1:
            raise ConfigError("burst", self.burst, "use a whole number >= 1")


class RateLimiter:
    """A token bucket per key; buckets that have refilled are forgotten when many pile
    up, so memory stays bounded by the keys active within ``burst / per_s`` seconds."""

    def __init__(self, limit: RateLimit, clock: Callable[[], float] = time.monotonic,
                 max_keys: int = 10_000) -> None:
        self.limit = limit
        self.clock = clock
        self.max_keys = max_keys
        self._buckets: dict[Hashable, tuple[float, float]] = {}
        """Key -> (tokens at the time, the time)."""

    def take(self, key: Hashable) -> float:
        """Spend one token of ``key``: 0.0 when allowed, else the seconds until one is
        available (nothing spent)."""
        now = self.clock()
        limit = self.limit
        tokens, then = self._buckets.get(key, (float(limit.burst), now))
        tokens = min(float(limit.burst), tokens + max(now - then, 0.0) * limit.per_s)
        if tokens < 1.0:
            self._buckets[key] = (tokens, now)
            return (1.0 - tokens) / limit.per_s
        if key not in self._buckets and len(self._buckets) >= self.max_keys:
            self._forget_full(now)
        self._buckets[key] = (tokens - 1.0, now)
        return 0.0

    def _forget_full(self, now: float) -> None:
        limit = self.limit
        refill_s = limit.burst / limit.per_s
        for key, (_, then) in list(self._buckets.items()):
            if now - then >= refill_s:
                del self._buckets[key]
        while len(self._buckets) >= self.max_keys:  # all busy: the oldest goes
            del self._buckets[min(self._buckets, key=lambda k: self._buckets[k][1])]

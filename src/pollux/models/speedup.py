"""Speedup: goodput at an allocation relative to goodput at a base allocation, memoized."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

from pollux.errors import ConfigError
from pollux.models.goodput import (
    NUM_BATCH_CANDIDATES,
    GoodputFunction,
    best_goodputs,
    check_batch_bounds,
)
from pollux.models.throughput import FloatArray

MAX_MEMO_NODES = 512
MAX_MEMO_REPLICAS = 2048
"""One function memoizes pairs with fewer nodes and replicas than these (a table of at
most 8 MiB); a pair beyond (a hostile job's hints may claim a billion replicas) is
computed each time, so no query can size an allocation by its own numbers."""


class SpeedupFunction:
    """``speedup(nodes, replicas) = best goodput there / best goodput at the base``.

    Results are memoized in a dense (nodes x replicas) table, so repeated queries over
    many pairs cost one numpy gather; the table stops at ``MAX_MEMO_NODES`` x
    ``MAX_MEMO_REPLICAS`` (pairs outside it are computed each time). ``replicas == 0`` has speedup 0.
    """

    def __init__(
        self,
        goodput_fn: GoodputFunction,
        max_batch_size: float | None = None,
        local_bsz_bounds: tuple[float, float] | None = None,
        accumulation: bool = False,
        base_num_nodes: int = 1,
        base_num_replicas: int = 1,
    ) -> None:
        m0 = goodput_fn.init_batch_size
        self.goodput_fn = goodput_fn
        self.max_batch_size = m0 if max_batch_size is None else float(max_batch_size)
        self.local_bsz_bounds = (m0, m0) if local_bsz_bounds is None else local_bsz_bounds
        check_batch_bounds(m0, self.max_batch_size, self.local_bsz_bounds)
        self.accumulation = accumulation
        if not 1 <= base_num_nodes <= base_num_replicas:
            raise ConfigError("base_num_nodes", base_num_nodes,
                              f"need 1 <= base_num_nodes <= base_num_replicas ({base_num_replicas})")
        base, _, _ = self._optimize(np.array([base_num_nodes]), np.array([base_num_replicas]))
        if not base[0] > 0:
            raise ConfigError("base_num_replicas", base_num_replicas,
                              "no feasible batch size at the base allocation; pick another base")
        self.base_goodput = float(base[0])
        self._table = np.full((1, 1), np.nan)
        self._table[0, 0] = 0.0

    def _optimize(self, nodes: np.ndarray, replicas: np.ndarray) -> tuple[np.ndarray, ...]:
        return self.goodput_fn.optimize(nodes, replicas, self.max_batch_size,
                                        self.local_bsz_bounds, self.accumulation)

    def _grow(self, rows: int, cols: int) -> None:
        """Make the memo at least (rows x cols), within its bounds."""
        rows = max(min(rows, MAX_MEMO_NODES), self._table.shape[0])
        cols = max(min(cols, MAX_MEMO_REPLICAS), self._table.shape[1])
        if (rows, cols) != self._table.shape:
            grown = np.full((rows, cols), np.nan)
            grown[: self._table.shape[0], : self._table.shape[1]] = self._table
            self._table = grown

    def __call__(self, num_nodes: ArrayLike, num_replicas: ArrayLike) -> FloatArray:
        nodes, replicas = np.broadcast_arrays(np.asarray(num_nodes), np.asarray(num_replicas))
        if nodes.size == 0:
            return np.zeros(nodes.shape)
        if not (np.all(nodes == np.floor(nodes)) and np.all(replicas == np.floor(replicas))):
            raise ConfigError("num_nodes/num_replicas", (nodes, replicas), "use whole numbers")
        n = nodes.astype(np.int64)
        k = replicas.astype(np.int64)
        if (bad := (n < 0) | (n > k) | ((k > 0) & (n == 0))).any():
            raise ConfigError("num_nodes", int(n[bad].flat[0]),
                              "need 1 <= num_nodes <= num_replicas (or both 0)")
        self._grow(int(n.max()) + 1, int(k.max()) + 1)
        inside = (n < self._table.shape[0]) & (k < self._table.shape[1])
        if not inside.all():  # beyond the memo's bound: computed, not remembered
            values = np.zeros(n.shape)
            running = ~inside & (k > 0)
            pairs, where = np.unique(np.stack([n[running], k[running]], axis=1), axis=0,
                                     return_inverse=True)
            goodput, _, _ = self._optimize(pairs[:, 0], pairs[:, 1])
            values[running] = (goodput / self.base_goodput)[where.ravel()]
            values[inside] = self(n[inside], k[inside])
            return values
        values = self._table[n, k]
        missing = np.isnan(values)
        if missing.any():
            pairs = np.unique(np.stack([n[missing], k[missing]], axis=1), axis=0)
            goodput, _, _ = self._optimize(pairs[:, 0], pairs[:, 1])
            self._table[pairs[:, 0], pairs[:, 1]] = goodput / self.base_goodput
            values = self._table[n, k]
        return values.astype(np.float64)


def speedup_matrix(fns: Sequence[SpeedupFunction], num_nodes: ArrayLike,
                   num_replicas: ArrayLike, block_elements: int = 200_000) -> FloatArray:
    """``fns[j](num_nodes[q], num_replicas[q])`` as a (functions x placements) matrix: memo
    hits gathered, misses computed for many functions per numpy pass
    (:func:`~pollux.models.goodput.best_goodputs`, the same numbers) and memoized."""
    n = np.asarray(num_nodes, dtype=np.int64).ravel()
    k = np.asarray(num_replicas, dtype=np.int64).ravel()
    out = np.zeros((len(fns), n.size))
    if n.size == 0 or not fns:
        return out
    if (bad := (n < 1) | (n > k)).any():
        raise ConfigError("num_nodes", int(n[bad][0]), "need 1 <= num_nodes <= num_replicas")
    missing = []
    rows, cols = int(n.max()) + 1, int(k.max()) + 1
    for j, fn in enumerate(fns):
        fn._grow(rows, cols)
        if rows > fn._table.shape[0] or cols > fn._table.shape[1]:
            out[j] = fn(n, k)  # beyond its memo's bound: one call, nothing remembered
            continue
        out[j] = fn._table[n, k]
        if np.isnan(out[j]).any():
            missing.append(j)
    per_block = max(1, block_elements // (n.size * 2 * (NUM_BATCH_CANDIDATES + 2)))
    for start in range(0, len(missing), per_block):
        block = [fns[j] for j in missing[start:start + per_block]]
        goodput = best_goodputs([fn.goodput_fn for fn in block],
                                [fn.max_batch_size for fn in block],
                                [fn.local_bsz_bounds for fn in block],
                                [fn.accumulation for fn in block], n, k)
        for row, fn in zip(goodput, block, strict=True):
            fn._table[n, k] = row / fn.base_goodput
        for offset, fn in enumerate(block):
            out[missing[start + offset]] = fn._table[n, k]
    return out

"""``adaptdl.torch.ElasticSampler``: a PyTorch sampler that splits a data set over the
replicas and can start an epoch part-way (after a restart).

For a plain ``torch.utils.data.DataLoader`` in an AdaptDL script; an
``AdaptiveDataLoader`` needs none (the agent's own sampler,
:mod:`pollux.torch.elastic_sampler`, places every sample once per epoch across
rescales). As AdaptDL's: the order of an epoch is fixed by ``set_epoch(epoch, index)``
(a seeded permutation with ``shuffle``, else the data set's order), the samples from
``index`` on are dealt to the replicas in turn (replica ``r`` gets positions ``index +
r``, ``index + r + K``, ...), and a replica short of the others' count repeats one
sample so that every replica has the same length. The permutation is Pollux's
(:func:`~pollux.torch.elastic_sampler.epoch_order`), not the one AdaptDL draws.

>>> sampler = ElasticSampler(range(10), shuffle=False)  # doctest: +SKIP
>>> sampler.set_epoch(0, index=4); list(sampler)  # one replica  # doctest: +SKIP
[4, 5, 6, 7, 8, 9]
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sized

import torch.utils.data

from pollux.adaptdl import env
from pollux.torch.elastic_sampler import epoch_order


class ElasticSampler(torch.utils.data.Sampler[int]):
    """AdaptDL's ``ElasticSampler(dataset, shuffle=True)`` (see the module); the
    replica's rank and the replica count are read when it is made."""

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0) -> None:
        if len(dataset) < 1:
            raise ValueError(f"invalid dataset of {len(dataset)} samples: give at least 1")
        self.dataset = dataset
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.num_replicas = env.num_replicas()
        self.rank = env.replica_rank()
        self.epoch = 0
        self.index = 0

    def set_epoch(self, epoch: int, index: int = 0) -> None:
        """Sample from ``epoch``'s order, starting ``index`` samples (over all replicas)
        into it (e.g. where a restart left off)."""
        if epoch < 0 or index < 0:
            raise ValueError(f"invalid set_epoch(epoch={epoch!r}, index={index!r}): both "
                             "must be >= 0")
        self.epoch = int(epoch)
        self.index = int(index)

    def _base(self) -> int:
        return self.index % len(self.dataset)

    def __iter__(self) -> Iterator[int]:
        """This replica's data-set indices, in order, from the set index on."""
        size = len(self.dataset)
        passes = self.index // size  # an index past the end starts a fresh order
        order = epoch_order(size, self.epoch * 1_000_003 + passes, self.seed, self.shuffle)
        mine = order[self._base() + self.rank::self.num_replicas].tolist()
        if len(mine) < len(self):
            mine.append(int(order[self.rank % size]))
        return iter(int(i) for i in mine)

    def __len__(self) -> int:
        """Samples this replica gets from the set index to the end of the epoch."""
        return math.ceil((len(self.dataset) - self._base()) / self.num_replicas)

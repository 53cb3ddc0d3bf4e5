"""``adaptdl.torch.iterator.AdaptiveBPTTIterator``: language-model batches cut from one
long token stream (back-propagation through time), with an adaptive batch size.

AdaptDL's iterator extends torchtext's legacy ``BPTTIterator``, which torchtext no
longer ships; this one takes the token stream itself: a 1-D tensor (or sequence) of
token ids, the ``data`` a numericalized corpus gives. Each pass reshapes the stream into
``local_bsz`` columns (padded with ``pad_id``) and hands out windows of ``bptt_len``
rows; the replicas take the windows in turn, and every replica runs the same number of
steps. Each batch has ``text`` and ``target`` (``target`` is ``text`` shifted by one
token), both ``(seq_len, local_bsz)``, or ``(local_bsz, seq_len)`` with
``batch_first=True``. A restart resumes at the row where the pass stopped, rescaled
when the local batch size changed, as AdaptDL does. The loop runs the agent's
agreement points through ``AdaptiveDataLoaderMixin`` (:mod:`~pollux.adaptdl.torch.custom`).

>>> it = AdaptiveBPTTIterator(tokens, batch_size=32, bptt_len=30)  # doctest: +SKIP
>>> for batch in it:  # doctest: +SKIP
...     loss = criterion(model(batch.text).view(-1, ntokens), batch.target.view(-1))
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch

from pollux.adaptdl.default_job import DEFAULT_JOB
from pollux.adaptdl.torch.custom import AdaptiveDataLoaderHelper
from pollux.adaptdl.torch.data import AdaptiveDataLoaderMixin


@dataclass(frozen=True)
class BPTTBatch:
    """One batch: ``text`` and its next tokens ``target``, and the local batch size."""

    text: torch.Tensor
    target: torch.Tensor
    batch_size: int


def windows(end: int, start: int, bptt_len: int, rank: int, num_replicas: int) -> list[int]:
    """The first rows of this replica's windows: every ``bptt_len`` rows from ``start``,
    dealt to the replicas in turn, as many on each replica as on the last one (whose
    windows must hold at least one token and its target).

    >>> windows(20, 0, 5, 0, 2), windows(20, 0, 5, 1, 2)
    ([0, 10], [5, 15])
    """
    step = bptt_len * num_replicas
    last_start = start + bptt_len * (num_replicas - 1)
    count = max(math.ceil((end - 1 - last_start) / step), 0)
    first = start + bptt_len * rank
    return [first + k * step for k in range(count)]


class AdaptiveBPTTIterator(AdaptiveDataLoaderMixin):
    """AdaptDL's ``AdaptiveBPTTIterator(dataset, batch_size, bptt_len, ...)`` over a
    token stream (see the module). ``batch_size`` is the initial total batch size;
    ``max_batch_size`` with ``local_bsz_bounds`` lets the agent adapt it (as
    ``autoscale_batch_size``)."""

    def __init__(self, dataset: torch.Tensor | Sequence[int], batch_size: int,
                 bptt_len: int, *, max_batch_size: int | None = None,
                 local_bsz_bounds: tuple[int, int] | None = None,
                 device: Any = None, batch_first: bool = False, pad_id: int = 0) -> None:
        tokens = torch.as_tensor(dataset, dtype=torch.long)
        if tokens.dim() != 1 or tokens.numel() < 2:
            raise ValueError(f"invalid dataset of shape {tuple(tokens.shape)}: give a 1-D "
                             "stream of at least 2 token ids")
        if not isinstance(bptt_len, int) or bptt_len < 1:
            raise ValueError(f"invalid bptt_len={bptt_len!r}: give an int >= 1")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"invalid batch_size={batch_size!r}: give an int >= 1")
        super().__init__(batch_size)
        self.dataset = tokens
        self.bptt_len = bptt_len
        self.device = device
        self.batch_first = bool(batch_first)
        self.pad_id = int(pad_id)
        if max_batch_size and local_bsz_bounds:
            self.autoscale_batch_size(max_batch_size, local_bsz_bounds)

    def _columns(self, local_bsz: int) -> torch.Tensor:
        """The stream as ``local_bsz`` columns: ``(rows, local_bsz)``."""
        rows = math.ceil(self.dataset.numel() / local_bsz)
        padded = torch.full((rows * local_bsz,), self.pad_id, dtype=torch.long)
        padded[:self.dataset.numel()] = self.dataset
        data = padded.view(local_bsz, rows).t().contiguous()
        return data if self.device is None else data.to(self.device)

    def __iter__(self) -> Iterator[BPTTBatch]:
        helper = cast(AdaptiveDataLoaderHelper, self._elastic)
        with helper.context():
            if helper.skipdone():
                return
            local_bsz = helper._sync_local_bsz()
            data = self._columns(local_bsz)
            end = data.size(0)
            if helper.end_index:  # resumed with another column count: the same fraction
                helper.current_index = math.ceil(helper.current_index * end /
                                                 helper.end_index)
            helper.end_index = end
            job = DEFAULT_JOB.require("iterating an AdaptiveBPTTIterator")
            step = self.bptt_len * job.num_replicas
            for row in windows(end, helper.current_index, self.bptt_len, job.rank,
                               job.num_replicas):
                with helper.profile(self.training and row > 0):
                    seq_len = min(self.bptt_len, end - row - 1)
                    text, target = data[row:row + seq_len], data[row + 1:row + 1 + seq_len]
                    if self.batch_first:
                        text, target = text.t().contiguous(), target.t().contiguous()
                    yield BPTTBatch(text=text, target=target, batch_size=local_bsz)
                    helper.current_index += step

    def __len__(self) -> int:
        """Batches this replica gets in a pass at the initial batch size."""
        job = DEFAULT_JOB.job
        replicas, rank = (1, 0) if job is None else (job.num_replicas, job.rank)
        local = max(self.batch_size // replicas, 1)
        rows = math.ceil(self.dataset.numel() / local)
        return len(windows(rows, 0, self.bptt_len, rank, replicas))

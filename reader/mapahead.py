"""``FetchAhead``: a batch sampler that tells a :class:`~shardify.reader.MapDataset` which batches come next.

A map-style dataset only learns a batch's indices when its worker is handed them, so a remote
batch costs its worker at least one round trip to the server. ``DataLoader(train,
batch_sampler=FetchAhead(BatchSampler(sampler, 256, drop_last=False)), num_workers=2)``
hands each worker, with each batch, the indices of the ``ahead`` batches drawn after it
(:class:`AheadBatch`): ``MapDataset.__getitems__`` starts fetching the ones that worker will
get (a ``DataLoader`` deals batch ``n`` of an epoch to worker ``n % num_workers``) while it
decodes this one, so that up to ``ahead // num_workers`` batches per worker are in flight.

The order of the batches is the wrapped sampler's, unchanged: ``FetchAhead`` only reads it
``ahead`` batches early. It works with any batch sampler or iterable of index lists
(``RandomSampler``, ``WeightedRandomSampler``, ``DistributedSampler`` in a ``BatchSampler``);
``set_epoch`` is passed on to the wrapped sampler (or the sampler it wraps). Fetching ahead
changes what is read early, never what a batch holds: a batch not fetched ahead (a worker
dealt another batch than expected) is read when asked for, and a batch fetched ahead but
never asked for is dropped.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable, Iterator, Sized
from typing import Any

import numpy as np
from torch.utils.data import Sampler

__all__ = ["AheadBatch", "FetchAhead", "batches_for_worker"]


class AheadBatch(list[int]):
    """A batch's indices (a plain ``list``), with ``number`` (its place in the epoch, from 0),
    ``run`` (which iteration of the sampler drew it) and ``ahead`` (the indices of the
    batches drawn after it, ``ahead[j]`` being batch ``number + 1 + j``)."""

    __slots__ = ("number", "run", "ahead")

    def __init__(self, indices: Iterable[int], *, number: int, run: int, ahead: tuple[np.ndarray, ...]) -> None:
        super().__init__(indices)
        self.number, self.run, self.ahead = number, run, ahead

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (list(self), self.number, self.run, self.ahead))


def _rebuild(indices: list[int], number: int, run: int, ahead: tuple[np.ndarray, ...]) -> AheadBatch:
    return AheadBatch(indices, number=number, run=run, ahead=ahead)


def batches_for_worker(batch: AheadBatch, workers: int) -> list[tuple[int, np.ndarray]]:
    """``(number, indices)`` of the batches of ``batch.ahead`` that the worker handed ``batch``
    gets next when ``workers`` workers are dealt batches in turn: numbers ``batch.number +
    workers``, ``+ 2 * workers``, ..."""
    if workers < 1:
        raise ValueError(f"{workers=} should be >= 1")
    return [(batch.number + 1 + j, batch.ahead[j]) for j in range(workers - 1, len(batch.ahead), workers)]


class FetchAhead(Sampler[list[int]]):
    """``batches`` (a batch sampler) drawn ``ahead`` batches early; each batch an
    :class:`AheadBatch` naming the ones after it. See the module."""

    def __init__(self, batches: Iterable[list[int]], *, ahead: int = 16) -> None:
        if ahead < 0:
            raise ValueError(f"FetchAhead: {ahead=} should be >= 0")
        if isinstance(batches, FetchAhead):
            raise TypeError("FetchAhead: batches= is already a FetchAhead")
        self.batches, self.ahead = batches, ahead
        self._runs = 0

    def __len__(self) -> int:
        if not isinstance(self.batches, Sized):
            raise TypeError(f"FetchAhead: {type(self.batches).__name__} has no len()")
        return len(self.batches)

    def set_epoch(self, epoch: int) -> None:
        """Pass ``epoch`` on to the wrapped batch sampler, or to the sampler it wraps
        (``DistributedSampler.set_epoch``); an error when neither has one."""
        for target in (self.batches, getattr(self.batches, "sampler", None)):
            method = getattr(target, "set_epoch", None)
            if callable(method):
                method(epoch)
                return
        name = type(self.batches).__name__
        raise AttributeError(f"FetchAhead: neither {name} nor the sampler it wraps has set_epoch")

    def __iter__(self) -> Iterator[list[int]]:
        run = (os.getpid() << 24) + self._runs  # (a worker tells this iteration's batches from another's)
        self._runs += 1
        window: deque[np.ndarray] = deque()
        source = iter(self.batches)
        number = 0
        for indices in source:
            window.append(np.asarray(indices, dtype=np.int64).reshape(-1))
            if len(window) > self.ahead:
                yield self._batch(window, number, run)
                number += 1
        while window:
            yield self._batch(window, number, run)
            number += 1

    @staticmethod
    def _batch(window: deque[np.ndarray], number: int, run: int) -> AheadBatch:
        first = window.popleft()
        return AheadBatch(first.tolist(), number=number, run=run, ahead=tuple(window))

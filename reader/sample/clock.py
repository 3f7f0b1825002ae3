"""Seconds this process spends in each stage of making batches, for the loader's ``stats()``.

One :data:`CLOCK` per process (a DataLoader worker, or the main process reading in-process):
the pipeline adds the time of each batch's reading (shard reads, remote waits and the shuffle
buffer), its samples' processing and its collate, once per batch; the transforms add the
time spent augmenting an image after its decode (once per image, which costs milliseconds);
:class:`~shardify.reader.sample.processor.SampleProcessor` adds the time of ``map=``. Decoding
is the rest of processing. The batch transport adds the time it packs a batch for sending.
Nothing is timed per sample on a path without images or ``map=``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["StageClock", "CLOCK", "STAGES", "augmenting"]

T = TypeVar("T")

STAGES = ("read", "process", "augment", "collate", "transfer")
"""The clock's fields, in the order :meth:`StageClock.values` gives them."""


@dataclass(slots=True)
class StageClock:
    """Running totals in seconds since the process started (callers take differences)."""

    read: float = 0.0
    process: float = 0.0  # decode and augment together; ``augment`` is the part after decoding
    augment: float = 0.0
    collate: float = 0.0  # the collate function's call
    transfer: float = 0.0  # copying and packing a batch into the shared-memory slots (the ToSharedMemory stage)

    def values(self) -> tuple[float, ...]:
        return (self.read, self.process, self.augment, self.collate, self.transfer)


CLOCK = StageClock()


def augmenting(fn: Callable[[], T]) -> T:
    """``fn()``, its seconds added to :data:`CLOCK`'s ``augment`` (one image's augmentation)."""
    start = time.perf_counter()
    try:
        return fn()
    finally:
        CLOCK.augment += time.perf_counter() - start

"""``Process``: decode and augment, a map of :class:`~shardify.reader.sample.processor.SampleProcessor`.

A sample's augmentation RNG is its own, seeded by ``(seed, epoch, key)``, so processing holds
no state: the stage's state is its source's (``{"source": ...}``).

Over single items (before length bucketing, which needs the decoded length) or over groups
(``batched``: after cutting, each batch's encoded items read whole, then processed). Either way
the :data:`~shardify.reader.sample.clock.CLOCK` gets the time spent waiting for the source
(``read``) and processing (``process``): once per item, or once per batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from shardify.reader.sample.clock import CLOCK
from shardify.reader.stages.base import Stage, load_source_state, skip_source, source_state

__all__ = ["Process", "by_stream"]


def by_stream(processors: Sequence[Callable[[Any], Any]]) -> Callable[[Any], Any]:
    """One function processing each item by its stream's processor (``item["__stream__"]``;
    an item that is not a sample dict, a lost one, goes to the first)."""
    if len(processors) == 1:
        return processors[0]

    def process(item: Any) -> Any:
        return processors[item["__stream__"] if isinstance(item, dict) else 0](item)

    return process


class Process(Stage[Any]):
    """``process`` applied to each item of ``source``, or to each item of each group (``batched``)."""

    def __init__(self, source: Iterator[Any], process: Callable[[Any], Any], *, batched: bool = False) -> None:
        self.source, self.process, self.batched = source, process, batched

    def __next__(self) -> Any:
        clock = CLOCK
        t0 = time.perf_counter()
        x = next(self.source)
        t1 = time.perf_counter()
        out = list(map(self.process, x)) if self.batched else self.process(x)
        clock.process += time.perf_counter() - t1
        clock.read += t1 - t0
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"source": source_state(self.source)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        load_source_state(self.source, state["source"])

    def skip(self, n: int) -> None:
        skip_source(self.source, n)  # one output per item (or group) of the source

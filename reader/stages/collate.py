"""``Collate``: each batch (a list of outputs) made into what the training loop receives.

Applies the collate function (``BatchOptions.collate_fn``, default
:func:`~shardify.reader.sample.collate.default_collate`); its time goes to the
:data:`~shardify.reader.sample.clock.CLOCK`'s ``collate``. A stage that sends batches to the
training process (``ToSharedMemory``, :mod:`shardify.reader.stages.sharedmem`) follows it. State: its source's
(``{"source": ...}``); collating holds nothing, so skipping ``k`` batches skips ``k`` of its source's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from shardify.reader.sample.clock import CLOCK
from shardify.reader.stages.base import Stage, load_source_state, skip_source, source_state

__all__ = ["Collate"]


class Collate(Stage[Any]):
    """``collate(batch)`` for each batch of ``source``."""

    def __init__(self, source: Iterator[list[Any]], collate: Callable[[list[Any]], Any]) -> None:
        self.source, self.collate = source, collate

    def __next__(self) -> Any:
        batch = next(self.source)
        t = time.perf_counter()
        try:
            return self.collate(batch)
        finally:
            CLOCK.collate += time.perf_counter() - t

    def state_dict(self) -> dict[str, Any]:
        return {"source": source_state(self.source)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        load_source_state(self.source, state["source"])

    def skip(self, n: int) -> None:
        skip_source(self.source, n)  # one batch out per batch in

"""``Read``: a worker's positions in read order, each with its item from the shard reader.

State: ``{"yielded": n}``, the items yielded so far. Restoring skips the first ``n`` of the
positions left to read without reading them. A :class:`~shardify.reader.stages.shuffle.Shuffle`
over it restores it differently: it marks the positions its output has consumed
(:meth:`Read.consume`), and those are never read.

Each run of consecutive positions in one shard range is one ranged read; the reader is told
all the reads first (``ShardReader.announce``) so that remote ranges are fetched ahead, and told
to drop them (``announce(())``) when the stage is closed or stops early.
"""

from __future__ import annotations

import bisect
from collections.abc import Generator, Iterator, Mapping, Sequence
from typing import Any, Protocol

from shardify.reader.plan.assign import Range
from shardify.reader.stages.base import Stage

__all__ = ["Read", "ItemReader", "read_runs"]


class ItemReader(Protocol):
    """What ``Read`` needs of a shard reader (``ShardReader`` is one)."""

    def announce(self, runs: Any) -> None: ...

    def read(self, shard: int, start: int, stop: int) -> Iterator[Any]: ...


def read_runs(
    ranges: Sequence[Range], order: Sequence[int], consumed: bytearray | None
) -> Iterator[tuple[int, int, int, int]]:
    """``(position, shard, first sample, count)`` of each read, in ``order``: consecutive positions
    in one shard range are read together; ``consumed`` positions (a byte each) are left out."""
    starts = [0]
    for _, a, b in ranges:
        starts.append(starts[-1] + b - a)
    i, n = 0, len(order)
    while i < n:
        p = order[i]
        if consumed is not None and consumed[p]:
            i += 1
            continue
        r = bisect.bisect_right(starts, p) - 1
        end = starts[r + 1]
        j = i + 1
        while (
            j < n
            and order[j] == order[j - 1] + 1
            and order[j] < end
            and not (consumed is not None and consumed[order[j]])
        ):
            j += 1
        shard, a, _ = ranges[r]
        yield p, shard, a + p - starts[r], j - i
        i = j


class Read(Stage[tuple[int, Any]]):
    """``(position, item)`` for the share's positions in ``order`` (positions into ``ranges``,
    the worker's shard ranges laid end to end), except ``consumed`` ones. Lazy: nothing is
    announced or read before the first item is asked for."""

    def __init__(
        self, reader: ItemReader, ranges: Sequence[Range], order: Sequence[int], consumed: bytearray | None = None
    ) -> None:
        self.reader, self.ranges, self.order, self.consumed = reader, ranges, order, consumed
        self.yielded = 0
        self._skip = 0
        self._items: Generator[tuple[int, Any], None, None] | None = None

    def consume(self, consumed: bytearray) -> None:
        """Never read the positions marked in ``consumed`` (before the first item)."""
        self.consumed = consumed

    def __next__(self) -> tuple[int, Any]:
        if self._items is None:
            self._items = self._read()
        item = next(self._items)
        self.yielded += 1
        return item

    def _read(self) -> Generator[tuple[int, Any], None, None]:
        order = self.order
        if self._skip:  # restored: the first positions left were yielded before
            left = [i for i, p in enumerate(order) if self.consumed is None or not self.consumed[p]]
            order = order[left[self._skip] :] if self._skip < len(left) else ()
        runs = list(read_runs(self.ranges, order, self.consumed))
        self.reader.announce((shard, first, first + count) for _, shard, first, count in runs)
        try:
            for p, shard, first, count in runs:
                for k, item in enumerate(self.reader.read(shard, first, first + count)):
                    yield p + k, item
        finally:
            self.reader.announce(())  # stopped early (an error, a break): what was fetched ahead is not wanted

    def close(self) -> None:
        """Stop reading: what was fetched ahead is dropped."""
        if self._items is not None:
            self._items.close()

    def state_dict(self) -> dict[str, Any]:
        return {"yielded": self.yielded}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.skip(int(state["yielded"]))

    def skip(self, n: int) -> None:
        """Skip the first ``n`` positions left to read, without reading them."""
        self.yielded = self._skip = n

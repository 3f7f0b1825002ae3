"""``Shuffle``: the reorder buffer, giving the items of a ``(position, item)`` source in output order.

The orders are computed up front (:func:`shardify.reader.plan.resume.share_order`): the source
reads positions in ``read`` order, and this stage yields them in ``out`` order, holding the
items read ahead of their turn (bounded by the shuffle buffer). Encoded items are held, never
decoded ones.

State: ``{"yielded": k}``, the items yielded so far. The buffer is never saved: on restore the
stage tells its :class:`~shardify.reader.stages.read.Read` that the positions ``out[:k]`` are
consumed, so those are never read, and the buffer is rebuilt by reading the rest.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from shardify.reader.plan.shuffle import reorder
from shardify.reader.stages.base import Stage
from shardify.reader.stages.read import Read

__all__ = ["Shuffle"]


class Shuffle(Stage[Any]):
    """The items of ``source`` (``(position, item)`` pairs, positions ``< len(out)``) in the order
    of positions ``out``. ``read``: the Read stage under ``source`` (``source`` itself by default,
    else a map over it), told on restore which positions are consumed."""

    def __init__(self, source: Iterator[tuple[int, Any]], out: Sequence[int], *, read: Read | None = None) -> None:
        if read is None:
            if not isinstance(source, Read):
                raise TypeError(f"Shuffle needs the Read stage under {type(source).__name__}: pass read=...")
            read = source
        self.source, self.out, self.read = source, out, read
        self.yielded = 0
        self._items: Iterator[Any] | None = None

    def __next__(self) -> Any:
        if self._items is None:
            self._items = reorder(self.source, self.out[self.yielded :])
        item = next(self._items)
        self.yielded += 1
        return item

    def state_dict(self) -> dict[str, Any]:
        return {"yielded": self.yielded}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.skip(int(state["yielded"]))

    def skip(self, n: int) -> None:
        """Mark the positions of the first ``n`` outputs consumed: they are never read."""
        k = min(n, len(self.out))
        if k:
            consumed = bytearray(len(self.out))
            for p in self.out[:k]:
                consumed[p] = 1
            self.read.consume(consumed)
        self.yielded = k

"""Work handed out a bounded number ahead and taken back in order (:class:`Ahead`: the
process pool and the Ray tasks of ``convert_items``), and worker processes for the driver's
own stages (:func:`map_in_order`: the image-folder scan, the plan).

Those stages run before any shard is written; they hold the whole input's table, so their
workers are forked (Linux) to read it without a copy. A worker that dies (killed, out of
memory) raises :class:`~shardify.errors.WorkerError` naming the stage, never a hang.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

from shardify.errors import WorkerError

__all__ = ["Ahead", "map_in_order"]

T = TypeVar("T")
C = TypeVar("C")
H = TypeVar("H")


class Ahead(Generic[C, H]):
    """Work items handed to ``submit`` up to ``window`` ahead of the one being taken back
    (that one included), which iteration yields in order with its handle (a future, a Ray
    reference). Items are never None."""

    def __init__(self, items: Iterable[C], window: int, submit: Callable[[C], H]) -> None:
        self._source = iter(items)
        self._window = window
        self._submit = submit
        self.pending: deque[tuple[C, H]] = deque()
        """Submitted and not yet taken back; the first is the one being taken back."""
        self._drawn: C | None = None

    def __iter__(self) -> Iterator[tuple[C, H]]:
        while True:
            while len(self.pending) < self._window:
                self._drawn = next(self._source, None)
                if self._drawn is None:
                    break
                self.pending.append((self._drawn, self._submit(self._drawn)))
            if not self.pending:
                return
            yield self.pending[0]
            self.pending.popleft()

    def in_flight(self) -> list[C]:
        """The items a worker may have held: those pending, else the one being submitted."""
        if self.pending:
            return [c for c, _ in self.pending]
        return [self._drawn] if self._drawn is not None else []


def map_in_order(
    fn: Callable[..., T],
    calls: Iterable[tuple[Any, ...]],
    *,
    workers: int,
    method: str,
    what: str,
    initializer: Callable[..., None] | None = None,
    initargs: tuple[Any, ...] = (),
    ahead: int = 2,
) -> Iterator[T]:
    """``fn(*args)`` for each ``args`` of ``calls``, in order, by ``workers`` processes
    started with ``method`` (``fork``: ``initargs`` reach them without pickling), at most
    ``ahead`` calls a worker submitted before the caller takes their results."""
    with cf.ProcessPoolExecutor(
        max_workers=workers, mp_context=mp.get_context(method), initializer=initializer, initargs=initargs
    ) as pool:
        window = Ahead(calls, ahead * workers + 1, lambda args: pool.submit(fn, *args))
        try:
            for _, future in window:
                yield future.result()
        except cf.process.BrokenProcessPool as e:
            raise WorkerError(f"{what}: a worker process died (killed, or out of memory?): {e}") from e
        finally:
            for _, future in window.pending:
                future.cancel()

"""Worker processes for the driver's own stages (the image-folder scan, the plan): calls of one
function, their results taken back in order, a bounded number ahead.

Those stages run before any shard is written; they hold the whole input's table, so their
workers are forked (Linux) to read it without a copy. A worker that dies (killed, out of
memory) raises :class:`~shardify.errors.WorkerError` naming the stage, never a hang.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any, TypeVar

from shardify.errors import WorkerError

__all__ = ["map_in_order"]

T = TypeVar("T")


def map_in_order(fn: Callable[..., T], calls: Iterable[tuple[Any, ...]], *, workers: int, method: str,
                 what: str, initializer: Callable[..., None] | None = None,
                 initargs: tuple[Any, ...] = (), ahead: int = 2) -> Iterator[T]:
    """``fn(*args)`` for each ``args`` of ``calls``, in order, by ``workers`` processes
    started with ``method`` (``fork``: ``initargs`` reach them without pickling), at most
    ``ahead`` calls a worker submitted before the caller takes their results."""
    todo = iter(calls)
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context(method),
                                initializer=initializer, initargs=initargs) as pool:
        pending: deque[cf.Future[T]] = deque(pool.submit(fn, *args) for args in islice(todo, ahead * workers))
        try:
            while pending:
                done = pending.popleft().result()
                pending.extend(pool.submit(fn, *args) for args in islice(todo, 1))
                yield done
        except cf.process.BrokenProcessPool as e:
            raise WorkerError(f"{what}: a worker process died (killed, or out of memory?): {e}") from e
        finally:
            for future in pending:
                future.cancel()

"""Run a user function over chunks of items, in parallel, and yield the outcomes in input order.

The engine of :func:`~shardify.convert.pyapi.fromitems.convert_items`: the function (and the encoding
of its samples, which is CPU work too) runs through one of the converter's executors
(:mod:`shardify.convert.executor`): worker processes (``local``), supervised worker processes
(limits per item) or Ray tasks (``ray``); the caller writes the shards in one place, in order,
so the bytes do not depend on the number of workers. At most ``2 * workers`` chunks are in
flight, so memory stays bounded whatever the number of items. A worker that dies raises
:class:`WorkerError` naming the items it held; an error in ``fn`` itself is an outcome, not an
exception.
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Iterable, Iterator
from typing import Any

from shardify.convert.executor import LocalExecutor, executor_kind
from shardify.convert.executor_ray import RayExecutor
from shardify.convert.pyapi.itemchunks import ChunkOut, ChunkRunner, ChunkSlots, ItemChunk, died, pack
from shardify.convert.pyapi.supervise import Limits, SupervisedExecutor

__all__ = ["map_ordered"]


def map_ordered(
    runner: ChunkRunner,
    chunks: Iterable[ItemChunk],
    *,
    workers: int,
    engine: str,
    ray_address: str | None = None,
    limits: Limits | None = None,
) -> Iterator[tuple[ItemChunk, ChunkOut]]:
    """Yield ``(chunk, outcomes)`` in the order of ``chunks``, computed ``workers`` at a time.

    ``limits`` (a :class:`~shardify.convert.pyapi.supervise.Limits`): run in supervised worker
    processes that stop an item past its time or memory (even with ``workers=1``)."""
    kind = executor_kind(engine=engine, workers=workers, supervised=limits is not None)
    if kind == "ray":
        yield from _map_ray(runner, chunks, workers=workers, address=ray_address, limits=limits)
    elif kind == "supervised" and limits is not None:
        yield from SupervisedExecutor(workers=workers, limits=limits).map(runner, chunks)
    elif kind == "this-process":
        yield from LocalExecutor(workers=1).map(runner, chunks)
    else:
        yield from _map_pool(runner, chunks, workers=workers)


def _run_in_worker(runner: ChunkRunner, slots: ChunkSlots | None, job: tuple[ItemChunk, int | None]) -> Any:
    """The chunk's outcome: ``(outcomes, length)`` when its bytes went into the job's slot, else a ChunkOut."""
    chunk, slot = job
    outcomes, parts = runner.run(chunk)
    return pack(slots, slot, outcomes, parts)


def _map_pool(
    runner: ChunkRunner, chunks: Iterable[ItemChunk], *, workers: int
) -> Iterator[tuple[ItemChunk, ChunkOut]]:
    # fork (Linux): fn reaches the workers without pickling, so lambdas and closures work,
    # and the shared memory mapped here is the workers' too.
    fork = sys.platform == "linux"
    if not fork:
        _check_picklable(runner)
    window = 2 * workers
    slots = ChunkSlots(window) if fork else None  # one per chunk in flight: a slot is free at each submit
    jobs = ((chunk, slots.free.pop() if slots is not None else None) for chunk in chunks)
    executor = LocalExecutor(
        workers=workers,
        window=window,
        method="fork" if fork else "spawn",
        died=lambda held, cause: died([chunk for chunk, _ in held], cause),
    )
    with executor:
        for (chunk, slot), got in executor.map(_run_in_worker, jobs, args=(runner, slots)):
            if isinstance(got, ChunkOut):
                yield chunk, got
            else:  # the bytes are in the slot: it is free again once the caller is done with them
                outcomes, length = got
                yield chunk, ChunkOut(outcomes, slots.view(slot, length))  # type: ignore[union-attr, arg-type]
            if slot is not None:
                slots.free.append(slot)  # type: ignore[union-attr]


def _check_picklable(runner: ChunkRunner) -> None:
    try:
        pickle.dumps(runner)
    except Exception as e:  # noqa: BLE001 - any pickling failure means the same thing here
        raise TypeError(
            f"fn must be picklable to run in worker processes on {sys.platform} "
            f"(a module-level function, not a lambda): {e}"
        ) from e


def _map_ray(
    runner: ChunkRunner, chunks: Iterable[ItemChunk], *, workers: int, address: str | None, limits: Limits | None = None
) -> Iterator[tuple[ItemChunk, ChunkOut]]:
    def failed(chunk: ItemChunk, error: BaseException) -> None:
        raise died([chunk], error) from error

    with RayExecutor(address=address, workers=workers, on_error=failed) as executor:
        yield from executor.map(_call_runner, chunks, args=(executor.put(runner), limits))


def _call_runner(runner: ChunkRunner, limits: Limits | None, chunk: ItemChunk) -> ChunkOut:
    """A Ray task: the chunk's outcomes. With ``limits``, the task watches one forked worker
    that runs the chunk (a fresh one per chunk, so memory verdicts match the local pool's)."""
    if limits is None:
        return runner(chunk)
    for _, out in SupervisedExecutor(workers=1, limits=limits).map(runner, [chunk]):
        return ChunkOut(out.outcomes, bytes(out.data))
    raise RuntimeError("the supervised worker returned nothing")  # pragma: no cover

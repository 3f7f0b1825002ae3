"""Run a user function over chunks of items, in parallel, and yield the outcomes in input order.

The engine of :func:`~shardify.convert.pyapi.items.convert_items`: the function (and the encoding
of its samples, which is CPU work too) runs in worker processes (``local``) or Ray tasks
(``ray``); the caller writes the shards in one place, in order, so the bytes do not depend
on the number of workers. At most ``2 * workers`` chunks are in flight, so memory stays
bounded whatever the number of items. A worker that dies raises :class:`WorkerError`
naming the items it held; an error in ``fn`` itself is an outcome, not an exception.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import pickle
import sys
from collections.abc import Iterable, Iterator
from typing import Any

from shardify.convert.driverpool import Ahead
from shardify.convert.pyapi.chunks import Chunk, ChunkOut, ChunkRunner, Outcome, Slots, died, item_repr, pack
from shardify.convert.pyapi.supervise import Limits, map_supervised
from shardify.convert.write.engine_ray import ray_session

# (re-exported: the names items.py and the tests have always taken from here)
__all__ = ["Chunk", "ChunkOut", "Outcome", "ChunkRunner", "Slots", "map_ordered", "item_repr", "pack", "died"]


def map_ordered(
    runner: ChunkRunner,
    chunks: Iterable[Chunk],
    *,
    workers: int,
    engine: str,
    ray_address: str | None = None,
    limits: Limits | None = None,
) -> Iterator[tuple[Chunk, ChunkOut]]:
    """Yield ``(chunk, outcomes)`` in the order of ``chunks``, computed ``workers`` at a time.

    ``limits`` (a :class:`~shardify.convert.pyapi.supervise.Limits`): run in supervised worker
    processes that stop an item past its time or memory (even with ``workers=1``)."""
    if engine == "ray":
        yield from _map_ray(runner, chunks, workers=workers, address=ray_address, limits=limits)
    elif limits is not None:
        yield from map_supervised(runner, chunks, workers=max(1, workers), limits=limits)
    elif workers <= 1:
        for chunk in chunks:
            yield chunk, runner(chunk)
    else:
        yield from _map_pool(runner, chunks, workers=workers)


_runner: ChunkRunner | None = None
_slots: Slots | None = None


def _init_worker(runner: ChunkRunner, slots: Slots | None) -> None:
    global _runner, _slots
    _runner, _slots = runner, slots


def _run_in_worker(chunk: Chunk, slot: int | None) -> ChunkOut | tuple[list[Outcome], int]:
    """The chunk's outcome: ``(outcomes, length)`` when its bytes went into ``slot``, else a ChunkOut."""
    if _runner is None:  # pragma: no cover - the initializer always ran
        raise RuntimeError("worker not initialized")
    outcomes, parts = _runner.run(chunk)
    return pack(_slots, slot, outcomes, parts)


def _map_pool(runner: ChunkRunner, chunks: Iterable[Chunk], *, workers: int) -> Iterator[tuple[Chunk, ChunkOut]]:
    # fork (Linux): fn reaches the workers without pickling, so lambdas and closures work,
    # and the shared memory mapped here is the workers' too.
    fork = sys.platform == "linux"
    if not fork:
        _check_picklable(runner)
    ctx = mp.get_context("fork" if fork else "spawn")
    window = 2 * workers
    slots = Slots(window) if fork else None  # one per chunk in flight: a slot is free at each submit
    with cf.ProcessPoolExecutor(
        max_workers=workers, mp_context=ctx, initializer=_init_worker, initargs=(runner, slots)
    ) as pool:

        def submit(chunk: Chunk) -> tuple[int | None, cf.Future[Any]]:
            slot = slots.free.pop() if slots is not None else None
            return slot, pool.submit(_run_in_worker, chunk, slot)

        ahead = Ahead(chunks, window, submit)
        try:
            for chunk, (slot, future) in ahead:
                got = future.result()
                if isinstance(got, ChunkOut):
                    yield chunk, got
                else:  # the bytes are in the slot: it is free again once the caller is done with them
                    outcomes, length = got
                    yield chunk, ChunkOut(outcomes, slots.view(slot, length))  # type: ignore[union-attr, arg-type]
                if slot is not None:
                    slots.free.append(slot)  # type: ignore[union-attr]
        except cf.process.BrokenProcessPool as e:
            raise died(ahead.in_flight(), e) from e
        finally:
            for _, (_, future) in ahead.pending:
                future.cancel()


def _check_picklable(runner: ChunkRunner) -> None:
    try:
        pickle.dumps(runner)
    except Exception as e:  # noqa: BLE001 - any pickling failure means the same thing here
        raise TypeError(
            f"fn must be picklable to run in worker processes on {sys.platform} "
            f"(a module-level function, not a lambda): {e}"
        ) from e


def _map_ray(
    runner: ChunkRunner, chunks: Iterable[Chunk], *, workers: int, address: str | None, limits: Limits | None = None
) -> Iterator[tuple[Chunk, ChunkOut]]:
    with ray_session(address) as ray:
        remote = ray.remote(max_retries=3, retry_exceptions=False)(_call_runner)
        runner_ref = ray.put(runner)
        window = 2 * max(workers, int(ray.cluster_resources().get("CPU", 1)))
        ahead = Ahead(chunks, window, lambda chunk: remote.remote(runner_ref, chunk, limits))
        try:
            for chunk, ref in ahead:
                try:
                    out = ray.get(ref)
                except ray.exceptions.RayError as e:
                    raise died([chunk], e) from e
                yield chunk, out
        finally:
            for _, ref in ahead.pending:
                ray.cancel(ref, force=True)


def _call_runner(runner: ChunkRunner, chunk: Chunk, limits: Limits | None = None) -> ChunkOut:
    """A Ray task: the chunk's outcomes. With ``limits``, the task watches one forked worker
    that runs the chunk (a fresh one per chunk, so memory verdicts match the local pool's)."""
    if limits is None:
        return runner(chunk)
    for _, out in map_supervised(runner, [chunk], workers=1, limits=limits):
        return ChunkOut(out.outcomes, bytes(out.data))
    raise RuntimeError("the supervised worker returned nothing")  # pragma: no cover

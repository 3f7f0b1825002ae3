"""Run a user function over chunks of items, in parallel, and yield the outcomes in input order.

The engine of :func:`~shardify.convert.pyapi.items.convert_items`: the function (and the encoding
of its samples, which is CPU work too) runs in worker processes (``local``) or Ray tasks
(``ray``); the caller writes the shards in one place, in order, so the bytes do not depend
on the number of workers. At most ``2 * workers`` chunks are in flight, so memory stays
bounded whatever the number of items. A worker that dies raises :class:`WorkerError`
naming the items it held; an error in ``fn`` itself is an outcome, not an exception.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import multiprocessing as mp
import pickle
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from shardify.convert.pyapi.pywriter import check_label
from shardify.convert.pyapi.values import ValueOptions, encode_sample, sample_key
from shardify.errors import EncodeError, WorkerError

__all__ = ["Chunk", "Outcome", "ChunkRunner", "map_ordered", "item_repr"]

REPR_LIMIT = 120
"""Characters of an item's ``repr`` kept in reports and errors."""


def item_repr(item: object) -> str:
    """``repr(item)``, cut to :data:`REPR_LIMIT` characters; never raises."""
    try:
        text = repr(item)
    except Exception as e:  # noqa: BLE001 - a broken __repr__ must not hide the real error
        text = f"<{type(item).__name__}, repr failed: {e}>"
    return text if len(text) <= REPR_LIMIT else text[: REPR_LIMIT - 3] + "..."


@dataclass(frozen=True, slots=True)
class Chunk:
    """Consecutive positions ``start..start+len(items)-1`` of the processing order."""

    start: int
    indexes: tuple[int, ...]
    """Each item's index in the input (the key of a sample without ``__key__``)."""
    items: tuple[Any, ...]


class Outcome(NamedTuple):
    """What one item became: a sample's members, filtered (``members`` None, no error), or an error.

    A named tuple: thousands of these cross the process boundary per second.
    """

    key: str | None = None
    members: list[tuple[str, bytes]] | None = None
    error: str | None = None
    """``fn`` raised: ``"{type}: {message}"``."""
    encode_error: str | None = None
    """The sample ``fn`` returned cannot be stored (always fatal)."""


class ChunkRunner:
    """Calls ``fn`` on each item of a chunk and encodes the sample; picklable if ``fn`` is."""

    def __init__(self, fn: Callable[[Any], Mapping[str, object] | None], values: ValueOptions,
                 classes: tuple[str, ...]) -> None:
        self.fn = fn
        self.values = values
        self.classes = classes

    def __call__(self, chunk: Chunk) -> list[Outcome]:
        return [self.one(index, item) for index, item in zip(chunk.indexes, chunk.items)]

    def one(self, index: int, item: Any) -> Outcome:
        try:
            sample = self.fn(item)
        except Exception as e:  # noqa: BLE001 - reported (or raised with strict) by the caller
            return Outcome(error=f"{type(e).__name__}: {_first_line(e)}")
        if sample is None:
            return Outcome()
        try:
            key, original = sample_key(sample, index)
            members = encode_sample(sample, key, original, self.values)
            check_label(members, self.classes)
        except EncodeError as e:
            return Outcome(encode_error=str(e))
        return Outcome(key=key, members=members)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:500] if text else "(no message)"


_runner: ChunkRunner | None = None


def _init_worker(runner: ChunkRunner) -> None:
    global _runner
    _runner = runner


def _run_in_worker(chunk: Chunk) -> list[Outcome]:
    if _runner is None:  # pragma: no cover - the initializer always ran
        raise RuntimeError("worker not initialized")
    return _runner(chunk)


def _died(chunks: list[Chunk], cause: BaseException) -> WorkerError:
    if not chunks:
        return WorkerError(f"a worker process died: {type(cause).__name__}: {cause}; "
                           "finished shards are kept, rerun to resume")
    first, last = chunks[0], chunks[-1]
    end = last.start + len(last.items) - 1
    return WorkerError(f"a worker process died running fn on the items at positions {first.start}..{end} "
                       f"(first: {item_repr(first.items[0])}): {type(cause).__name__}: {cause}; "
                       "finished shards are kept, rerun to resume")


def map_ordered(runner: ChunkRunner, chunks: Iterable[Chunk], *, workers: int, engine: str,
                ray_address: str | None = None) -> Iterator[tuple[Chunk, list[Outcome]]]:
    """Yield ``(chunk, outcomes)`` in the order of ``chunks``, computed ``workers`` at a time."""
    if engine == "ray":
        yield from _map_ray(runner, chunks, workers=workers, address=ray_address)
    elif workers <= 1:
        for chunk in chunks:
            yield chunk, runner(chunk)
    else:
        yield from _map_pool(runner, chunks, workers=workers)


def _map_pool(runner: ChunkRunner, chunks: Iterable[Chunk], *, workers: int) -> Iterator[tuple[Chunk, list[Outcome]]]:
    # fork (Linux): fn reaches the workers without pickling, so lambdas and closures work.
    fork = sys.platform == "linux"
    if not fork:
        _check_picklable(runner)
    ctx = mp.get_context("fork" if fork else "spawn")
    pending: collections.deque[tuple[Chunk, cf.Future[list[Outcome]]]] = collections.deque()
    source = iter(chunks)
    chunk: Chunk | None = None
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init_worker,
                                initargs=(runner,)) as pool:
        try:
            while True:
                while len(pending) < 2 * workers:
                    chunk = next(source, None)
                    if chunk is None:
                        break
                    pending.append((chunk, pool.submit(_run_in_worker, chunk)))
                if not pending:
                    return
                outcomes = pending[0][1].result()
                chunk, _ = pending.popleft()
                yield chunk, outcomes
        except cf.process.BrokenProcessPool as e:
            in_flight = [c for c, _ in pending] + ([chunk] if chunk is not None and not pending else [])
            raise _died(in_flight, e) from e
        finally:
            for _, fut in pending:
                fut.cancel()


def _check_picklable(runner: ChunkRunner) -> None:
    try:
        pickle.dumps(runner)
    except Exception as e:  # noqa: BLE001 - any pickling failure means the same thing here
        raise TypeError(f"fn must be picklable to run in worker processes on {sys.platform} "
                        f"(a module-level function, not a lambda): {e}") from e


def _map_ray(runner: ChunkRunner, chunks: Iterable[Chunk], *, workers: int,
             address: str | None) -> Iterator[tuple[Chunk, list[Outcome]]]:
    from shardify.convert.write.engine_ray import ray_session

    with ray_session(address) as ray:
        remote = ray.remote(max_retries=3, retry_exceptions=False)(_call_runner)
        runner_ref = ray.put(runner)
        window = 2 * max(workers, int(ray.cluster_resources().get("CPU", 1)))
        pending: collections.deque[tuple[Chunk, Any]] = collections.deque()
        source = iter(chunks)
        try:
            while True:
                while len(pending) < window:
                    chunk = next(source, None)
                    if chunk is None:
                        break
                    pending.append((chunk, remote.remote(runner_ref, chunk)))
                if not pending:
                    return
                chunk, ref = pending.popleft()
                try:
                    outcomes = ray.get(ref)
                except ray.exceptions.RayError as e:
                    raise _died([chunk], e) from e
                yield chunk, outcomes
        finally:
            for _, ref in pending:
                ray.cancel(ref, force=True)


def _call_runner(runner: ChunkRunner, chunk: Chunk) -> list[Outcome]:
    return runner(chunk)


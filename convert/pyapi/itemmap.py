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
import mmap
import multiprocessing as mp
import pickle
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from shardify.convert.driverpool import Ahead
from shardify.convert.pyapi.pywriter import check_label
from shardify.convert.pyapi.values import ValueOptions, encode_sample, sample_key
from shardify.convert.write.writer import member_parts
from shardify.errors import EncodeError, KeyRuleError, WorkerError

if TYPE_CHECKING:
    from shardify.convert.pyapi.supervise import Limits

__all__ = ["Chunk", "ChunkOut", "Outcome", "ChunkRunner", "Slots", "map_ordered", "item_repr", "pack", "died"]

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
    """What one item became: a sample (``key`` set), filtered (nothing set), or an error.

    A named tuple: thousands of these cross the process boundary per second. The sample's
    tar bytes are not here but in the chunk's :attr:`ChunkOut.data`, one after another.
    """

    key: str | None = None
    fields: tuple[str, ...] = ()
    """The sample's member extensions, sorted."""
    size: int = 0
    """Bytes of the sample's tar members in :attr:`ChunkOut.data`."""
    error: str | None = None
    """``fn`` raised: ``"{type}: {message}"``."""
    encode_error: str | None = None
    """The sample ``fn`` returned cannot be stored (always fatal)."""
    stopped: str | None = None
    """``fn`` was stopped on this item, its worker killed: why (``"timed out after 5 s"``);
    reported like an error of ``fn`` (see :mod:`~shardify.convert.pyapi.supervise`)."""


class ChunkOut(NamedTuple):
    """A chunk's outcomes, in item order, and the tar bytes of its samples, concatenated.

    One buffer per chunk, written to the shard in one piece where the chunk's samples fall in
    one shard. From a worker process it comes through shared memory (see :class:`Slots`).
    """

    outcomes: list[Outcome]
    data: bytes | memoryview


class ChunkRunner:
    """Calls ``fn`` on each item of a chunk and encodes the sample; picklable if ``fn`` is."""

    def __init__(self, fn: Callable[[Any], Mapping[str, object] | None], values: ValueOptions,
                 classes: tuple[str, ...]) -> None:
        self.fn = fn
        self.values = values
        self.classes = classes

    def __call__(self, chunk: Chunk) -> ChunkOut:
        outcomes, parts = self.run(chunk)
        return ChunkOut(outcomes, b"".join(parts))

    def run(self, chunk: Chunk) -> tuple[list[Outcome], list[bytes]]:
        """The outcomes of a chunk's items and the tar bytes of its samples, in parts."""
        parts: list[bytes] = []
        outcomes = [self.one(index, item, parts) for index, item in zip(chunk.indexes, chunk.items)]
        return outcomes, parts

    def one(self, index: int, item: Any, parts: list[bytes]) -> Outcome:
        """The outcome of one item; a sample's tar bytes are appended to ``parts``."""
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
            tar, size = member_parts(key, members)
        except (EncodeError, KeyRuleError) as e:
            return Outcome(encode_error=str(e))
        parts += tar
        return Outcome(key=key, fields=tuple(ext for ext, _ in members), size=size)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:500] if text else "(no message)"


class Slots:
    """Shared memory for the chunks in flight: one slot each, mapped before the workers fork.

    A worker copies its chunk's tar bytes into the slot it was given and returns only the
    outcomes; the caller hashes and writes them from the slot, with no pickling and no pipe.
    Through a pipe, each 33 KB sample cost ~0.15 ms of CPU in the two processes (pickle,
    64 KB pipe writes and reads, each a context switch), as much as hashing and writing it
    twice over. Anonymous shared memory is freed with the last process, even after ``kill
    -9``; its pages are touched only as far as chunks fill them. A chunk bigger than a slot
    goes through the pipe.
    """

    TOTAL_LIMIT = 1 << 30
    SLOT_LIMIT = 64 << 20

    def __init__(self, count: int) -> None:
        self.size = min(self.SLOT_LIMIT, self.TOTAL_LIMIT // count) // mmap.PAGESIZE * mmap.PAGESIZE
        self.mem = mmap.mmap(-1, count * self.size)
        self.free = list(range(count))

    def view(self, slot: int, length: int) -> memoryview:
        start = slot * self.size
        return memoryview(self.mem)[start:start + length]


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


def pack(slots: Slots | None, slot: int | None, outcomes: list[Outcome],
         parts: list[bytes]) -> ChunkOut | tuple[list[Outcome], int]:
    """In a worker: ``(outcomes, length)`` with the chunk's bytes copied into ``slot``, or a
    ChunkOut holding them when there is no slot or they do not fit."""
    total = sum(len(p) for p in parts)
    if slots is None or slot is None or total > slots.size:
        return ChunkOut(outcomes, b"".join(parts))
    pos = slot * slots.size
    mem = slots.mem
    for part in parts:
        end = pos + len(part)
        mem[pos:end] = part
        pos = end
    return outcomes, total


def died(chunks: list[Chunk], cause: BaseException) -> WorkerError:
    if not chunks:
        return WorkerError(f"a worker process died: {type(cause).__name__}: {cause}; "
                           "finished shards are kept, rerun to resume")
    first, last = chunks[0], chunks[-1]
    end = last.start + len(last.items) - 1
    return WorkerError(f"a worker process died running fn on the items at positions {first.start}..{end} "
                       f"(first: {item_repr(first.items[0])}): {type(cause).__name__}: {cause}; "
                       "finished shards are kept, rerun to resume")


def map_ordered(runner: ChunkRunner, chunks: Iterable[Chunk], *, workers: int, engine: str,
                ray_address: str | None = None, limits: Limits | None = None) -> Iterator[tuple[Chunk, ChunkOut]]:
    """Yield ``(chunk, outcomes)`` in the order of ``chunks``, computed ``workers`` at a time.

    ``limits`` (a :class:`~shardify.convert.pyapi.supervise.Limits`): run in supervised worker
    processes that stop an item past its time or memory (even with ``workers=1``)."""
    if engine == "ray":
        yield from _map_ray(runner, chunks, workers=workers, address=ray_address, limits=limits)
    elif limits is not None:
        from shardify.convert.pyapi.supervise import map_supervised

        yield from map_supervised(runner, chunks, workers=max(1, workers), limits=limits)
    elif workers <= 1:
        for chunk in chunks:
            yield chunk, runner(chunk)
    else:
        yield from _map_pool(runner, chunks, workers=workers)


def _map_pool(runner: ChunkRunner, chunks: Iterable[Chunk], *, workers: int) -> Iterator[tuple[Chunk, ChunkOut]]:
    # fork (Linux): fn reaches the workers without pickling, so lambdas and closures work,
    # and the shared memory mapped here is the workers' too.
    fork = sys.platform == "linux"
    if not fork:
        _check_picklable(runner)
    ctx = mp.get_context("fork" if fork else "spawn")
    window = 2 * workers
    slots = Slots(window) if fork else None  # one per chunk in flight: a slot is free at each submit
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init_worker,
                                initargs=(runner, slots)) as pool:

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
        raise TypeError(f"fn must be picklable to run in worker processes on {sys.platform} "
                        f"(a module-level function, not a lambda): {e}") from e


def _map_ray(runner: ChunkRunner, chunks: Iterable[Chunk], *, workers: int, address: str | None,
             limits: Limits | None = None) -> Iterator[tuple[Chunk, ChunkOut]]:
    from shardify.convert.write.engine_ray import ray_session

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
    from shardify.convert.pyapi.supervise import map_supervised

    for _, out in map_supervised(runner, [chunk], workers=1, limits=limits):
        return ChunkOut(out.outcomes, bytes(out.data))
    raise RuntimeError("the supervised worker returned nothing")  # pragma: no cover


"""A chunk of items, the runner that makes its samples, and how its bytes come back.

What every way of mapping a user function over items shares (the local pool and the Ray tasks
of :mod:`~shardify.convert.pyapi.itemmap`, the supervised workers of
:mod:`~shardify.convert.pyapi.supervise`): the unit of work (:class:`ItemChunk`), its outcome per
item, and the shared-memory slots a forked worker writes its encoded bytes into.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from shardify.convert.pyapi.pywriter import check_label
from shardify.convert.pyapi.values import ValueOptions, encode_sample, sample_key
from shardify.convert.write.tarwrite import member_parts
from shardify.errors import EncodeError, KeyRuleError, WorkerError

__all__ = ["ItemChunk", "ChunkOut", "Outcome", "ChunkRunner", "ChunkSlots", "item_repr", "pack", "died", "REPR_LIMIT"]

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
class ItemChunk:
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
    """Bytes of the sample in :attr:`ChunkOut.data`: its tar members, or the bytes of its one
    field when the runner writes them unframed (:attr:`ChunkRunner.unframed`)."""
    error: str | None = None
    """``fn`` raised: ``"{type}: {message}"``."""
    encode_error: str | None = None
    """The sample ``fn`` returned cannot be stored (always fatal)."""
    stopped: str | None = None
    """``fn`` was stopped on this item, its worker killed: why (``"timed out after 5 s"``);
    reported like an error of ``fn`` (see :mod:`~shardify.convert.pyapi.supervise`)."""
    tokens: int = 0
    """The sample's document length in tokens, recorded per shard in the split index
    (:mod:`~shardify.convert.pyapi.tokens`; 0 for other runners)."""


class ChunkOut(NamedTuple):
    """A chunk's outcomes, in item order, and the tar bytes of its samples, concatenated.

    One buffer per chunk, written to the shard in one piece where the chunk's samples fall in
    one shard. From a worker process it comes through shared memory (see :class:`ChunkSlots`).
    """

    outcomes: list[Outcome]
    data: bytes | memoryview


class ChunkRunner:
    """Calls ``fn`` on each item of a chunk and encodes the sample; picklable if ``fn`` is."""

    unframed: str | None = None
    """None: a sample's bytes in :attr:`ChunkOut.data` are its tar members. Else every sample
    has this one field and its bytes are the field's alone, with no tar header: for a chunked
    split, whose writer takes the fields (not the members) of a sample, so the runner does not
    frame what the writer would parse back."""

    def __init__(
        self, fn: Callable[[Any], Mapping[str, object] | None], values: ValueOptions, classes: tuple[str, ...]
    ) -> None:
        self.fn = fn
        self.values = values
        self.classes = classes

    def __call__(self, chunk: ItemChunk) -> ChunkOut:
        outcomes, parts = self.run(chunk)
        return ChunkOut(outcomes, b"".join(parts))

    def run(self, chunk: ItemChunk) -> tuple[list[Outcome], list[bytes]]:
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


class ChunkSlots:
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
        return memoryview(self.mem)[start : start + length]


def pack(
    slots: ChunkSlots | None, slot: int | None, outcomes: list[Outcome], parts: list[bytes]
) -> ChunkOut | tuple[list[Outcome], int]:
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


def died(chunks: list[ItemChunk], cause: BaseException) -> WorkerError:
    if not chunks:
        return WorkerError(
            f"a worker process died: {type(cause).__name__}: {cause}; finished shards are kept, rerun to resume"
        )
    first, last = chunks[0], chunks[-1]
    end = last.start + len(last.items) - 1
    return WorkerError(
        f"a worker process died running fn on the items at positions {first.start}..{end} "
        f"(first: {item_repr(first.items[0])}): {type(cause).__name__}: {cause}; "
        "finished shards are kept, rerun to resume"
    )

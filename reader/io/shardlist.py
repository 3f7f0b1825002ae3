"""Shard lists that make their entries on access, for splits of hundreds of thousands of shards.

A :class:`~shardify.reader.io.sources.Source` from a compact index (:mod:`~shardify.reader.io.compact`)
holds its shards as a count array, and a mix of sources holds theirs end to end: neither makes a
:class:`ShardInfo` per shard up front. :class:`ShardList` is what both are; :func:`full_info`
gives a shard with its size, SHA-256 and offsets (a compact shard's come from its sidecar, loaded
then), and :class:`LazySequence` is a column of any per-shard value (URLs, checksums) made on access.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar, overload

from shardify.sidecar import SidecarProof, SidecarRef

__all__ = [
    "ShardInfo",
    "ShardList",
    "ChainedShards",
    "LazySequence",
    "Repeated",
    "ChainedSequence",
    "distinct_values",
    "full_info",
]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ShardInfo:
    """One shard to read: where it is, how many samples it holds, and (from a manifest) its
    size in bytes and SHA-256, which a fetched copy is checked against."""

    url: str
    nsamples: int
    filesize: int | None = None
    sha256: str = ""
    offsets: tuple[int, ...] = ()
    """Byte offsets of samples 0, OFFSET_STRIDE, ... from the split index (empty: not known);
    of chunks 0, OFFSET_STRIDE, ... in a chunked shard."""
    chunk: int | None = None
    """Samples per chunk of a chunked shard (the split index's ``chunk``); None: per-sample."""
    samples: bytes = b""
    """The index's per-sample table (:mod:`shardify.sampletable`; empty: none)."""
    sidecar: SidecarRef | SidecarProof | None = None
    """How the shard's table sidecar ``<url>.idx`` (:mod:`shardify.sidecar`) is checked: the size
    and SHA-256 a JSON index records, or its place in a compact index's hash tree; None: no sidecar."""
    tokens: bytes = b""
    """A token split's document lengths in tokens (the index's ``tokens``, little-endian uint32
    in sample order); empty: not a token split."""


class LazySequence(Sequence[T]):
    """``length`` values, value ``i`` made by ``get(i)`` when asked for (a slice gives a list)."""

    def __init__(self, length: int, get: Callable[[int], T]) -> None:
        self._len, self._get = length, get

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, i: int) -> T: ...
    @overload
    def __getitem__(self, i: slice) -> list[T]: ...
    def __getitem__(self, i: int | slice) -> T | list[T]:
        if isinstance(i, slice):
            return [self._get(k) for k in range(*i.indices(self._len))]
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError(f"index {i} out of range for {self._len} values")
        return self._get(i)

    def __iter__(self) -> Iterator[T]:
        return (self._get(k) for k in range(self._len))


class Repeated(LazySequence[T]):
    """``value``, ``length`` times."""

    def __init__(self, length: int, value: T) -> None:
        self.value = value
        super().__init__(length, self._value)

    def _value(self, i: int) -> T:
        return self.value


class ChainedSequence(LazySequence[T]):
    """The sequences ``parts`` end to end."""

    def __init__(self, parts: Sequence[Sequence[T]]) -> None:
        self.parts = list(parts)
        self._starts = list(itertools.accumulate((len(p) for p in self.parts), initial=0))
        super().__init__(self._starts[-1], self._item)

    def where(self, i: int) -> tuple[Sequence[T], int]:
        """The part value ``i`` is in, and its place there."""
        k = bisect.bisect_right(self._starts, i) - 1
        return self.parts[k], i - self._starts[k]

    def _item(self, i: int) -> T:
        part, j = self.where(i)
        return part[j]

    def __iter__(self) -> Iterator[T]:
        return itertools.chain.from_iterable(self.parts)


def distinct_values(values: Sequence[T]) -> list[T]:
    """The distinct objects of ``values``, without visiting each of a :class:`Repeated`."""
    if isinstance(values, Repeated):
        return [values.value]
    parts = values.parts if isinstance(values, ChainedSequence) else [values]
    found = {
        id(v): v
        for part in parts
        for v in (distinct_values(part) if isinstance(part, (Repeated, ChainedSequence)) else part)
    }
    return list(found.values())


class ShardList(LazySequence[ShardInfo]):
    """Shards made on access; :meth:`full` adds what a sidecar knows of one; :meth:`url`,
    :attr:`urls` and :attr:`sizes` give them without a ShardInfo each where a list can."""

    def full(self, i: int) -> ShardInfo:
        return self[i]

    def url(self, i: int) -> str:
        return self[i].url

    @property
    def urls(self) -> Sequence[str]:
        return LazySequence(len(self), self.url)

    @property
    def sizes(self) -> list[int]:
        return [s.nsamples for s in self]


class ChainedShards(ChainedSequence[ShardInfo], ShardList):
    """The shards of ``parts`` end to end (the numbering of a mix of sources)."""

    def full(self, i: int) -> ShardInfo:
        part, j = self.where(i)
        return full_info(part, j)

    def url(self, i: int) -> str:
        part, j = self.where(i)
        return part.url(j) if isinstance(part, ShardList) else part[j].url

    @property
    def sizes(self) -> list[int]:
        return [n for p in self.parts for n in (p.sizes if isinstance(p, ShardList) else [s.nsamples for s in p])]


def full_info(shards: Sequence[ShardInfo], i: int) -> ShardInfo:
    """Shard ``i`` of ``shards`` with its size, SHA-256 and offsets where they are known."""
    return shards.full(i) if isinstance(shards, ShardList) else shards[i]

"""Plan a split before writing anything: order, keys, and which samples go in which shard.

Planning is a pure function of the scan and the shaping options, so the same input gives
the same shards whatever the number of workers, and each shard can be written (or
rewritten after a crash) on its own. Without transcoding, the planned shard sizes are the
exact sizes of the tar files (minus inputs skipped as bad).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import random
import sys
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, TypeVar, overload

import numpy as np

from shardify.convert.executor import LocalExecutor
from shardify.convert.inputs.inputs import SampleSpec, Scan, SpecTable, total_payload_bytes
from shardify.convert.inputs.rawpixels import planned_raw_bytes
from shardify.convert.options import ConvertOptions, worker_count
from shardify.convert.write.identity import fingerprint
from shardify.convert.write.metadata import metadata_json, metadata_needed, sample_meta
from shardify.keys import KeyList, assign_keys, candidate_keys
from shardify.permute import KeyedPermutation
from shardify.tarfmt import END_OF_ARCHIVE, VERSION_CHARS, member_size

__all__ = [
    "ShardPlanSample",
    "ShardPlan",
    "SplitPlan",
    "plan_split",
    "plan_order",
    "metadata_json",
    "metadata_needed",
    "shuffle_order",
    "PERMUTE_MIN_SAMPLES",
    "split_permutation",
]


@dataclass(frozen=True, slots=True)
class ShardPlanSample:
    key: str
    spec: SampleSpec
    meta: bytes | None
    """The ``{key}.json`` member, or None when the sample has none (see :func:`metadata_needed`)."""


@dataclass(frozen=True)
class ShardPlan:
    """One shard's samples, made from the split plan when its task is (never all at once),
    and held compactly (records and keys in two buffers) until the writer reads them."""

    index: int
    specs: Sequence[SampleSpec]
    keys: Sequence[str]
    planned_bytes: int
    metadata: str = "auto"
    classes: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def samples(self) -> Iterator[ShardPlanSample]:
        """The samples in shard order, with their ``{key}.json`` members, made one at a time."""
        for spec, key in zip(self.specs, self.keys):
            yield ShardPlanSample(key, spec, sample_meta(spec, key, self.metadata, self.classes))


@dataclass(frozen=True)
class SplitPlan:
    """Which samples go in which shard, held compactly: the scan's samples, their keys, the
    order, and where each shard starts in it. :meth:`shard` makes one :class:`ShardPlan`."""

    split: str
    fingerprint: str
    """SHA-256 over the shaping options and every planned sample: equal plans, equal output."""
    shard_sizes: tuple[int, ...]
    """Samples in each shard."""
    shard_bytes: tuple[int, ...]
    """Planned bytes of each shard (exact without transcoding or skipped inputs)."""
    specs: Sequence[SampleSpec] = field(repr=False)
    keys: Sequence[str] = field(repr=False)
    order: Sequence[int] = field(repr=False)
    metadata: str = "auto"
    classes: tuple[str, ...] = ()

    @property
    def num_shards(self) -> int:
        return len(self.shard_sizes)

    @property
    def version(self) -> str:
        """The version token in the output's file names: the fingerprint's first hex digits.

        The same conversion of the same inputs gets the same names (so a rerun resumes and
        ends byte-identical); any other conversion gets new names, and never rewrites the
        files of a version a reader may be reading."""
        return self.fingerprint[:VERSION_CHARS]

    @property
    def num_samples(self) -> int:
        return sum(self.shard_sizes)

    def shard(self, index: int) -> ShardPlan:
        """The samples of shard ``index``, in order, with their keys."""
        start = self._starts[index]
        positions = _positions(self.order, start, start + self.shard_sizes[index])
        specs, keys = SpecTable(spill_bytes=_NEVER), KeyList(spill_bytes=_NEVER)  # sent whole to a writer
        for spec in (
            self.specs.take(positions) if isinstance(self.specs, SpecTable) else (self.specs[i] for i in positions)
        ):
            specs.append(spec)
        keys.extend(
            list(self.keys.take(positions)) if isinstance(self.keys, KeyList) else [self.keys[i] for i in positions]
        )
        return ShardPlan(index, specs, keys, self.shard_bytes[index], self.metadata, self.classes)

    @functools.cached_property
    def _starts(self) -> list[int]:
        """Where each shard starts in the order."""
        return [0, *itertools.accumulate(self.shard_sizes)]

    @property
    def shards(self) -> list[ShardPlan]:
        """Every shard's plan (materializes all samples: for small plans and tests)."""
        return [self.shard(i) for i in range(self.num_shards)]


def shuffle_order(n: int, *, seed: int, split: str) -> array[int]:
    """A permutation of ``range(n)`` from ``(seed, split)``, the same on every platform
    (4 bytes an entry; 8 past 2**32): the rule of splits below :data:`PERMUTE_MIN_SAMPLES`."""
    digest = hashlib.sha256(f"shardify-order:{seed}:{split}".encode()).digest()
    order = array("I" if n <= 1 << 32 and array("I").itemsize == 4 else "q", range(n))
    random.Random(int.from_bytes(digest[:16], "big")).shuffle(order)
    return order


PERMUTE_MIN_SAMPLES = 1 << 22
"""Splits of this many samples (4,194,304) or more are ordered by :class:`KeyedPermutation`,
computed in parts in constant memory, instead of :func:`shuffle_order` (a list of them all,
4 bytes each, shuffled in one process); smaller splits keep the order they always had."""


def split_permutation(n: int, *, seed: int, split: str) -> KeyedPermutation:
    """The converter's seeded order of a big split: the permutation of ``range(n)`` keyed by
    ``{seed}:{split}`` (positions ``lo..hi`` in O(hi - lo))."""
    return KeyedPermutation(n, label=f"{seed}:{split}")


def plan_order(n: int, *, seed: int, split: str, shuffle: bool) -> Sequence[int]:
    """The order of a split's ``n`` samples: scan order without ``shuffle``; else
    :func:`shuffle_order` below :data:`PERMUTE_MIN_SAMPLES`, :func:`split_permutation` from it."""
    if not shuffle:
        return range(n)
    if n < PERMUTE_MIN_SAMPLES:
        return shuffle_order(n, seed=seed, split=split)
    return split_permutation(n, seed=seed, split=split)


def _sample_bytes(spec: SampleSpec, meta: bytes | None, raw: tuple[int, str] | None = None) -> int:
    """Tar bytes of a sample; with ``raw`` (``--raw-pixels`` size and side) its images are sized
    by :func:`planned_raw_bytes`, the rest exactly."""
    total = member_size(len(meta)) if meta is not None else 0
    if spec.label is not None:
        total += member_size(len(str(spec.label)))
    for f in spec.files:
        if raw is not None and f.is_image:
            total += member_size(planned_raw_bytes(f.size, size=raw[0], side=raw[1]))  # type: ignore[arg-type]
            continue
        total += member_size(f.size)
    for _, data in spec.inline:
        total += member_size(len(data))
    return total


def plan_split(scan: Scan, options: ConvertOptions) -> SplitPlan:
    """Order the samples (seeded shuffle unless disabled), key them, and pack them into shards.

    Memory: the scan's samples are read one at a time; the plan adds the keys (~20 bytes
    each, on disk past :data:`shardify.records.SPILL_BYTES`), the order (4 bytes each below
    :data:`PERMUTE_MIN_SAMPLES`, none from it) and two numbers per shard. A big split (at least
    :data:`POOL_MIN_SAMPLES`) is keyed, sized and hashed by ``options.workers`` forked
    processes, a chunk of the samples each; the plan is the same with any number.
    """
    specs: Sequence[SampleSpec] = scan.samples
    keys = assign_keys(
        _Column(specs, "name"),
        identities=_Column(specs, "identity"),
        candidates=_in_order(_key_chunk, specs, len(specs), options.workers),
    )
    order = plan_order(len(specs), seed=options.seed, split=options.split, shuffle=options.shuffle)
    hasher = fingerprint(source=scan.source, classes=scan.classes, options=options.shaping())
    classes = tuple(scan.classes)
    raw = None if options.raw_pixels is None else (options.raw_pixels, options.raw_side)
    payload = total_payload_bytes(specs) if raw is None else sum(_sample_bytes(s, None, raw) for s in specs)
    limit = options.shard_bound(payload)
    per_shard = options.samples_per_shard
    sizes: list[int] = []
    shard_bytes: list[int] = []
    count = 0
    current_bytes = len(END_OF_ARCHIVE)
    prefix = b"0\0"  # each sample's fingerprint input starts with its shard's index
    job = (specs, keys, order, options.metadata, classes, raw)
    for chunk_sizes, fragments in _in_order(_plan_chunk, job, len(order), options.workers):
        run = 0  # where this chunk's samples of the current shard start
        for j, size in enumerate(chunk_sizes):
            if (per_shard is not None and count >= per_shard) or (
                limit is not None and count and current_bytes + size > limit
            ):
                if j > run:
                    hasher.update(prefix + prefix.join(fragments[run:j]))
                sizes.append(count)
                shard_bytes.append(current_bytes)
                count, current_bytes = 0, len(END_OF_ARCHIVE)
                prefix, run = b"%d\0" % len(sizes), j
            count += 1
            current_bytes += size
        if len(fragments) > run:
            hasher.update(prefix + prefix.join(fragments[run:]))
    if count:
        sizes.append(count)
        shard_bytes.append(current_bytes)
    return SplitPlan(
        split=options.split,
        fingerprint=hasher.hexdigest(),
        shard_sizes=tuple(sizes),
        shard_bytes=tuple(shard_bytes),
        specs=specs,
        keys=keys,
        order=order,
        metadata=options.metadata,
        classes=classes,
    )


_NEVER = 1 << 62
"""A spill budget never reached."""

POOL_MIN_SAMPLES = 200_000
"""Splits of fewer samples are planned in this process: forking would cost more than it saves."""
_CHUNK = 1 << 13
"""Samples per job: about 1.5 MB of fingerprint input at most."""

_T = TypeVar("_T")


def _in_order(work: Callable[[Any, int, int], _T], job: Any, n: int, workers: int) -> Iterator[_T]:
    """``work(job, lo, hi)`` for each chunk ``lo..hi`` of ``range(n)``, in order: in
    ``workers`` forked processes (Linux) when ``n`` is big, at most two chunks a worker
    ahead of the caller (so the caller holds a few MB of results); ``job`` reaches them
    through fork, never pickled."""
    bounds = [(lo, min(lo + _CHUNK, n)) for lo in range(0, n, _CHUNK)]
    workers = min(worker_count(workers), len(bounds))
    if workers < 2 or n < POOL_MIN_SAMPLES or sys.platform != "linux":
        for lo, hi in bounds:
            yield work(job, lo, hi)
        return
    executor = LocalExecutor(workers=workers, window=2 * workers + 1, method="fork", what="planning the split")
    with executor:
        for _, result in executor.map(_work_on, bounds, args=(work, job)):
            yield result


def _work_on(work: Callable[[Any, int, int], _T], job: Any, bounds: tuple[int, int]) -> _T:
    return work(job, *bounds)


def _key_chunk(specs: Sequence[SampleSpec], lo: int, hi: int) -> list[str]:
    """The candidate keys of samples ``lo..hi`` (in scan order)."""
    return candidate_keys(_Column(specs, "name", lo, hi), _Column(specs, "identity", lo, hi))


_Job = tuple[Sequence[SampleSpec], KeyList, Sequence[int], str, tuple[str, ...], tuple[int, str] | None]
"""``(samples, keys, order, metadata mode, classes, raw)``: what every chunk of a plan reads
(``raw``: the ``--raw-pixels`` size and side, or None)."""


def _plan_chunk(job: _Job, lo: int, hi: int) -> tuple[list[int], list[bytes]]:
    """The tar bytes of the samples at positions ``lo..hi`` of the order, and what each adds
    to the plan's fingerprint after its shard's index: its key, label, ``.json`` member,
    files and inline fields."""
    specs, keys, order, mode, classes, raw = job
    positions = _positions(order, lo, hi)
    picked = specs.take(positions) if isinstance(specs, SpecTable) else (specs[i] for i in positions)
    sha256 = hashlib.sha256
    sizes: list[int] = []
    fragments: list[bytes] = []
    for spec, key in zip(picked, keys.take(positions)):
        meta = sample_meta(spec, key, mode, classes)
        sizes.append(_sample_bytes(spec, meta, raw))
        parts = [f"{key}\0{spec.label}\0".encode(), meta if meta is not None else b"\0"]
        for f in spec.files:
            parts.append(f"{f.ext}\0{f.path}\0{f.size}\0{f.mtime_ns}\0".encode("utf-8", "surrogateescape"))
        for ext, data in spec.inline:
            parts.append(ext.encode() + b"\0" + sha256(data).digest())
        fragments.append(b"".join(parts))
    return sizes, fragments


def _positions(order: Sequence[int], lo: int, hi: int) -> Sequence[int]:
    """Entries ``lo..hi`` of an order (a range, an array, a :class:`KeyedPermutation`) as Python ints."""
    part = order[lo:hi]
    return part.tolist() if isinstance(part, np.ndarray) else part


class _Column(Sequence[str]):
    """One string attribute of samples ``start..stop`` (default: all), read on demand."""

    def __init__(self, specs: Sequence[SampleSpec], attr: str, start: int = 0, stop: int | None = None) -> None:
        self.specs, self.attr, self.start = specs, attr, start
        self.stop = len(specs) if stop is None else stop

    def __len__(self) -> int:
        return self.stop - self.start

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if not 0 <= i < self.stop - self.start:
            raise IndexError(i)
        return str(getattr(self.specs[self.start + i], self.attr))

    def __iter__(self) -> Iterator[str]:
        if self.attr == "name" and isinstance(self.specs, SpecTable):
            return self.specs.names(self.start, self.stop)
        return map(attrgetter(self.attr), self.specs[self.start : self.stop])

"""One worker's epoch: read its share in shuffled order, decode and augment, batch, pad.

Stages, each a generator over the previous one:

1. :func:`read_positions`: the worker's positions in read order, skipping those already
   consumed before a resume; each run of consecutive positions is one ranged shard read.
2. :func:`shardify.reader.plan.shuffle.reorder`: the encoded samples in output order (what the
   shuffle buffer holds: encoded bytes, never decoded tensors).
3. :class:`SampleProcessor`: decode and transform one sample into its output (or a
   :class:`Bad` marker under the skip policy); augmentation RNG seeded by (seed, epoch, key).
4. :func:`cut` (or :func:`bucketed`, grouping by length) into the plan's batches, then
   :func:`batches`: replace bad samples by repeats of good samples of the same batch (so
   every rank still yields the same number of batches) and collate.

:func:`share_batches` chains them for one worker's share of an epoch.
"""

from __future__ import annotations

import bisect
import itertools
import os
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from shardify.errors import SampleError
from shardify.reader.io.stream import Item, Lost, ShardReader
from shardify.reader.plan.assign import Range, WorkerPlan
from shardify.reader.plan.shuffle import derive_seed, reorder, sample_rng
from shardify.reader.sample.clock import CLOCK, augmenting
from shardify.reader.sample.collate import bucket_batches
from shardify.reader.sample.decode import IMAGE_EXTS, PickleRefusedError, decode_field, decode_sample
from shardify.reader.sample.transforms import run_image_transform

if TYPE_CHECKING:
    from shardify.reader.io.sources import Source
    from shardify.reader.options import ReadOptions
    from shardify.reader.streams import Stream

__all__ = [
    "IMAGE_FIELD",
    "Bad",
    "SampleProcessor",
    "field_spec",
    "read_positions",
    "selected_fields",
    "cut",
    "cut_processed",
    "bucketed",
    "batches",
    "stream_processors",
    "share_batches",
]

IMAGE_FIELD = "image"
"""In ``fields``, the name that matches whichever image extension a sample has."""


@dataclass(frozen=True, slots=True)
class Bad:
    """A sample that was skipped: unreadable (``lost``) or failing to decode or transform."""

    shard: str
    key: str | None
    reason: str
    lost: bool


def read_positions(
    reader: ShardReader, ranges: Sequence[Range], order: Sequence[int], consumed: bytearray | None
) -> Iterator[tuple[int, Item]]:
    """Yield ``(position, item)`` for the worker's positions in ``order``, except ``consumed`` ones.
    The reader is told all the reads first (:meth:`ShardReader.plan`), so remote ranges are fetched ahead."""
    runs = list(_runs(ranges, order, consumed))
    reader.plan((shard, first, first + count) for _, shard, first, count in runs)
    try:
        for p, shard, first, count in runs:
            for k, item in enumerate(reader.read(shard, first, first + count)):
                yield p + k, item
    finally:
        reader.plan(())  # stopped early (an error, a break): what was fetched ahead is not wanted


def _runs(
    ranges: Sequence[Range], order: Sequence[int], consumed: bytearray | None
) -> Iterator[tuple[int, int, int, int]]:
    """``(position, shard, first sample, count)`` of each read, in order: consecutive positions
    in one shard range are read together."""
    starts = [0]
    for _, a, b in ranges:
        starts.append(starts[-1] + b - a)
    i, n = 0, len(order)
    while i < n:
        p = order[i]
        if consumed is not None and consumed[p]:
            i += 1
            continue
        r = bisect.bisect_right(starts, p) - 1
        end = starts[r + 1]
        j = i + 1
        while (
            j < n
            and order[j] == order[j - 1] + 1
            and order[j] < end
            and not (consumed is not None and consumed[order[j]])
        ):
            j += 1
        shard, a, _ = ranges[r]
        yield p, shard, a + p - starts[r], j - i
        i = j


def field_spec(spec: str, image_exts: frozenset[str]) -> tuple[str, ...]:
    """The extensions an output column ``spec`` may take (``"a;b"``: either; ``"image"``: any of ``image_exts``)."""
    names = tuple(s.strip() for s in spec.split(";") if s.strip())
    if not names:
        raise ValueError(f"field {spec!r} names no extension")
    return tuple(sorted(image_exts)) if names == (IMAGE_FIELD,) else names


def selected_fields(fields: Sequence[str]) -> frozenset[str]:
    """Every extension the output columns ``fields`` may take (``"image"`` is any image
    extension): what the shard reader loads; other fields are never read into memory."""
    return frozenset(ext for spec in fields for ext in field_spec(spec, IMAGE_EXTS))


class SampleProcessor:
    """Turns an encoded sample into its output: a tuple of ``fields``, or ``map(sample)``.

    ``fields``: one entry per output column, an extension or ``"a;b"`` alternatives;
    ``"image"`` matches any image extension. Image fields go through ``transform``
    (uint8 CHW tensors); other fields are decoded by extension. One field gives the value
    itself, several a tuple. ``map``: called with the decoded sample dict (image fields
    transformed when ``transform`` is given, else PIL RGB images) plus ``__key__``,
    ``__shard__`` and ``__rng__`` (the sample's augmentation RNG); its result is the output.
    """

    def __init__(
        self,
        *,
        seed: int,
        epoch: int,
        transform: Callable[..., Any] | None,
        fields: Sequence[str],
        map: Callable[[dict[str, Any]], Any] | None,
        allow_pickle: bool,
        skip_errors: bool,
        unique_keys: bool,
    ) -> None:
        self._decode_field, self._decode_sample = decode_field, decode_sample
        self._run_transform, self._refused = run_image_transform, PickleRefusedError
        self._images = IMAGE_EXTS
        self._seed, self._epoch = seed, epoch
        self._transform, self._map = transform, map
        self._fields = [field_spec(f, IMAGE_EXTS) for f in fields]
        self._allow_pickle, self._skip, self._unique = allow_pickle, skip_errors, unique_keys
        self._field: str | None = None  # the field being made, for error messages

    def __call__(self, item: Item) -> Any:
        if isinstance(item, Lost):
            return Bad(item.shard, None, item.reason, lost=True)
        shard, key = str(item["__shard__"]), str(item["__key__"])
        self._field = None
        try:
            return self._output(item, shard, key)
        except Exception as e:
            where = f"field {self._field!r}: " if self._field is not None else ""
            reason = f"{where}{type(e).__name__}: {e}"
            if not self._skip or isinstance(e, self._refused):
                raise SampleError(reason, shard=shard, key=key) from e
            return Bad(shard, key, reason, lost=False)

    def _rng(self, shard: str, key: str) -> Any:
        sample_id = key if self._unique else f"{os.path.basename(shard)}/{key}"
        return sample_rng(self._seed, self._epoch, sample_id)

    def _output(self, sample: dict[str, Any], shard: str, key: str) -> Any:
        if self._map is not None:
            rng = self._rng(shard, key)
            skip = [e for e in sample if self._transform is not None and e.rpartition(".")[2] in self._images]
            decoded = self._decode_sample(sample, allow_pickle=self._allow_pickle, skip=skip)
            for image_ext in skip:
                decoded[image_ext] = self._run_transform(self._transform, sample[image_ext], rng=rng)
            decoded["__rng__"] = rng
            map_fn = self._map
            return augmenting(lambda: map_fn(decoded))  # map= counts as augmentation
        out = []
        rng = None  # seeded only for a sample with an image to augment (~12 us per sample)
        for alternatives in self._fields:
            ext = next((e for e in alternatives if e in sample), None)
            if ext is None:
                have = sorted(e for e in sample if not e.startswith("__"))
                raise ValueError(f"no field {'/'.join(alternatives)!r} (sample has {have}); pass fields=...")
            data, self._field = sample[ext], ext
            if ext.rpartition(".")[2] in self._images:
                if rng is None:
                    rng = self._rng(shard, key)
                out.append(self._run_transform(self._transform, data, rng=rng))
            else:
                out.append(self._decode_field(ext, data, allow_pickle=self._allow_pickle))
        return out[0] if len(out) == 1 else tuple(out)


def _fill(items: list[Any], donor: Any) -> list[Any]:
    """Replace each Bad by the nearest earlier good item of the batch, else the next, else ``donor``."""
    out = list(items)
    good = [i for i, x in enumerate(out) if not isinstance(x, Bad)]
    for i, x in enumerate(out):
        if isinstance(x, Bad):
            j = bisect.bisect_left(good, i)
            out[i] = out[good[j - 1]] if j > 0 else (out[good[j]] if j < len(good) else donor)
    return out


def cut(outputs: Iterator[Any], sizes: Sequence[int]) -> Iterator[list[Any]]:
    """Group ``outputs`` into lists of ``sizes``."""
    for size in sizes:
        yield [next(outputs) for _ in range(size)]


def cut_processed(items: Iterator[Any], process: Callable[[Any], Any], sizes: Sequence[int]) -> Iterator[list[Any]]:
    """:func:`cut` of ``map(process, items)``, each group read whole, then processed: the
    :data:`~shardify.reader.sample.clock.CLOCK` gets the reading and processing time per batch."""
    clock = CLOCK
    for size in sizes:
        t0 = time.perf_counter()
        group = [next(items) for _ in range(size)]
        t1 = time.perf_counter()
        out = list(map(process, group))
        clock.process += time.perf_counter() - t1
        clock.read += t1 - t0
        yield out


def _timed_items(items: Iterator[Any]) -> Iterator[Any]:
    """``items``, the time taken by each added to the clock's reading (the bucketing path)."""
    clock = CLOCK
    while True:
        t = time.perf_counter()
        try:
            x = next(items)
        except StopIteration:
            return
        clock.read += time.perf_counter() - t
        yield x


def _timed(fn: Callable[[Any], Any], stage: str) -> Callable[[Any], Any]:
    """``fn``, its time added to the clock's ``stage`` at each call."""
    clock = CLOCK

    def timed(x: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(x)
        finally:
            setattr(clock, stage, getattr(clock, stage) + time.perf_counter() - t)

    return timed


def bucketed(
    outputs: Iterator[Any], *, batch_size: int, length: Callable[[Any], int], buffer_size: int, rng: Any
) -> Iterator[list[Any]]:
    """Group ``outputs`` by ``length`` (skipped samples count as 0) into ``ceil(n / batch_size)`` lists."""

    def key(x: Any) -> int:
        return 0 if isinstance(x, Bad) else length(x)

    return bucket_batches(outputs, batch_size=batch_size, length=key, buffer_size=buffer_size, rng=rng, drop_last=False)


def batches(
    groups: Iterable[list[Any]],
    *,
    collate: Callable[[list[Any]], Any],
    on_bad: Callable[[Bad], None],
) -> Iterator[Any]:
    """Collate each group, replacing skipped samples (see :func:`_fill`); one batch per group.

    A group with no good sample takes the first good sample of the next group (it is held
    until one arrives), or at the very end the last good sample seen; so the batch count never
    changes. Only when this worker met no good sample at all does it raise.
    """
    held: list[list[Any]] = []
    last_good: Any = None
    seen_good = False
    first_bad: Bad | None = None
    for items in groups:
        good = None
        for x in items:
            if isinstance(x, Bad):
                on_bad(x)
                first_bad = first_bad or x
            elif good is None:
                good = x
        if good is None:
            held.append(items)
            continue
        for h in held:
            yield collate(_fill(h, good))
        held = []
        filled = _fill(items, good)
        last_good, seen_good = filled[-1], True
        yield collate(filled)
    if held:
        if not seen_good:
            first_bad = first_bad or Bad("?", None, "?", lost=False)
            raise SampleError(
                f"every sample of this worker's {len(held)} remaining batches was skipped; "
                f"nothing to pad them with (first: {first_bad.reason})",
                shard=first_bad.shard,
                key=first_bad.key,
            )
        for h in held:
            yield collate(_fill(h, last_good))


def stream_processors(
    streams: Sequence[Stream], columns: Sequence[tuple[str, ...]], options: ReadOptions, *, epoch: int
) -> list[SampleProcessor]:
    """One :class:`SampleProcessor` per stream for ``epoch``: its output ``columns``, its own
    ``transform`` and ``map`` or else the dataset's (``options``)."""
    o = options
    return [
        SampleProcessor(
            seed=o.seed,
            epoch=epoch,
            transform=s.transform or o.transform,
            fields=fields,
            map=s.map or (o.map if s.fields is None else None),
            allow_pickle=o.allow_pickle,
            skip_errors=o.on_error == "skip",
            unique_keys=cast("Source", s.source).unique_keys,  # resolved by now
        )
        for s, fields in zip(streams, columns)
    ]


def share_batches(
    reader: ShardReader,
    plan: WorkerPlan,
    *,
    read: Sequence[int],
    out: Sequence[int],
    sizes: Sequence[int],
    skip: int,
    options: ReadOptions,
    epoch: int,
    rank: int,
    worker: int,
    processors: Sequence[Callable[[Item], Any]],
    collate: Callable[[list[Any]], Any],
    on_bad: Callable[[Bad], None],
    tag: Callable[[Iterator[tuple[int, Item]]], Iterator[tuple[int, Item]]] | None,
) -> Iterator[Any]:
    """The batches of a worker's ``plan`` after its first ``skip``: ``read`` and ``out`` are its
    read and output orders (:func:`~shardify.reader.plan.resume.share_order`), ``sizes`` the
    sizes of the batches left. ``processors``: one per stream; ``tag`` marks each item's stream
    (and repeats) when the output needs it. Lazy: nothing is read before the first batch is asked for.
    """
    o = options
    # Bucketing groups by decoded length, so a resume replays the worker's share from its start.
    done = 0 if o.bucket_length is not None else min(skip * o.batch_size, len(out))
    mask = None
    if done:
        mask = bytearray(len(out))
        for p in out[:done]:
            mask[p] = 1
    process: Callable[[Item], Any] = processors[0]
    if len(processors) > 1:

        def process(item: Item) -> Any:
            return processors[cast(int, item["__stream__"]) if isinstance(item, dict) else 0](item)

    items = read_positions(reader, plan.ranges, read, mask)
    if tag is not None:
        items = tag(items)
    if o.bucket_length is None:
        groups: Iterator[list[Any]] = cut_processed(reorder(items, out[done:]), process, sizes)
    else:  # grouped by decoded length: timed per sample
        outputs = map(_timed(process, "process"), _timed_items(reorder(items, out[done:])))
        groups = bucketed(
            outputs,
            batch_size=o.batch_size,
            length=o.bucket_length,
            buffer_size=o.bucket_buffer or 16 * o.batch_size,
            rng=random.Random(derive_seed("bucket", o.seed, epoch, rank, worker)),
        )
        groups = itertools.islice(groups, skip, None)
    return batches(groups, collate=_timed(collate, "collate"), on_bad=on_bad)

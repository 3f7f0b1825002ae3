"""One worker's epoch: the per-sample processing, and the wiring of the worker's stages.

:class:`SampleProcessor` decodes and transforms one sample into its output (or a :class:`Bad`
marker under the skip policy), its augmentation RNG seeded by (seed, epoch, key). The stages
that read, shuffle, process, batch and collate a worker's share are in
:mod:`shardify.reader.stages` (one file each); :func:`share_batches` wires them for one
worker's share of an epoch (:func:`shardify.reader.stages.chain.worker_stages`).
:func:`read_positions`, :func:`cut`, :func:`cut_processed`, :func:`bucketed` and
:func:`batches` are those stages as plain generator functions, kept for their callers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from shardify.errors import SampleError, ShardFormatError
from shardify.reader.io.stream import Item, Lost, ShardReader
from shardify.reader.plan.assign import Range, WorkerPlan
from shardify.reader.plan.shuffle import sample_rng
from shardify.reader.sample.bad import Bad
from shardify.reader.sample.clock import CLOCK, augmenting
from shardify.reader.sample.decode import IMAGE_EXTS, PickleRefusedError, decode_field, decode_sample
from shardify.reader.sample.transforms import run_image_transform
from shardify.reader.stages.batch import Bucketed, Cut, Fill, fill
from shardify.reader.stages.chain import state_at_batch, worker_stages
from shardify.reader.stages.process import Process, by_stream
from shardify.reader.stages.read import Read, read_runs
from shardify.tario import DAMAGE_AFTER

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
    "missing_field",
    "cut",
    "cut_processed",
    "bucketed",
    "batches",
    "stream_processors",
    "share_batches",
]

IMAGE_FIELD = "image"
"""In ``fields``, the name that matches whichever image extension a sample has."""


def read_positions(
    reader: ShardReader, ranges: Sequence[Range], order: Sequence[int], consumed: bytearray | None
) -> Iterator[tuple[int, Item]]:
    """Yield ``(position, item)`` for the worker's positions in ``order``, except ``consumed`` ones
    (the :class:`~shardify.reader.stages.read.Read` stage)."""
    return Read(reader, ranges, order, consumed)


_runs = read_runs


def field_spec(spec: str, image_exts: frozenset[str]) -> tuple[str, ...]:
    """The extensions an output column ``spec`` may take (``"a;b"``: either; ``"image"``: any of ``image_exts``)."""
    names = tuple(s.strip() for s in spec.split(";") if s.strip())
    if not names:
        raise ValueError(f"field {spec!r} names no extension")
    return tuple(sorted(image_exts)) if names == (IMAGE_FIELD,) else names


def missing_field(alternatives: Sequence[str], sample: Mapping[str, object]) -> Exception:
    """The error for an output column none of whose ``alternatives`` ``sample`` holds: the shard's
    damage when the sample was read just before it (the member may be behind it), else a field the
    sample never had (``fields=`` chooses them)."""
    have = sorted(e for e in sample if not e.startswith("__"))
    wanted = "/".join(alternatives)
    damage = sample.get(DAMAGE_AFTER)
    if damage is not None:
        return ShardFormatError(
            f"no field {wanted!r} (sample has {have}): the tar header after its members is damaged "
            f"({damage}), so the member may be behind it"
        )
    return ValueError(f"no field {wanted!r} (sample has {have}); pass fields=...")


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
                raise missing_field(alternatives, sample)
            data, self._field = sample[ext], ext
            if ext.rpartition(".")[2] in self._images:
                if rng is None:
                    rng = self._rng(shard, key)
                out.append(self._run_transform(self._transform, data, rng=rng))
            else:
                out.append(self._decode_field(ext, data, allow_pickle=self._allow_pickle))
        return out[0] if len(out) == 1 else tuple(out)


_fill = fill


def cut(outputs: Iterator[Any], sizes: Sequence[int]) -> Iterator[list[Any]]:
    """Group ``outputs`` into lists of ``sizes`` (the :class:`~shardify.reader.stages.batch.Cut` stage)."""
    return Cut(outputs, sizes)


def cut_processed(items: Iterator[Any], process: Callable[[Any], Any], sizes: Sequence[int]) -> Iterator[list[Any]]:
    """:func:`cut` of ``map(process, items)``, each group read whole, then processed: the
    :data:`~shardify.reader.sample.clock.CLOCK` gets the reading and processing time per batch."""
    return Process(Cut(items, sizes), process, batched=True)


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
    return Bucketed(
        lambda: outputs, batch_size=batch_size, length=length, buffer_size=buffer_size, make_rng=lambda: rng
    )


def batches(
    groups: Iterable[list[Any]],
    *,
    collate: Callable[[list[Any]], Any],
    on_bad: Callable[[Bad], None],
) -> Iterator[Any]:
    """Collate each group, replacing skipped samples (the :class:`~shardify.reader.stages.batch.Fill`
    stage, then ``collate``); one batch per group."""
    return map(collate, Fill(iter(groups), on_bad=on_bad))


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
            allow_pickle=o.decoding.allow_pickle,
            skip_errors=o.skip_errors,
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
    tag: Callable[[tuple[int, Item]], tuple[int, Item]] | None,
) -> Iterator[Any]:
    """The batches of a worker's ``plan`` after its first ``skip``: ``read`` and ``out`` are its
    read and output orders (:func:`~shardify.reader.plan.resume.share_order`), ``sizes`` the
    sizes of the batches left (``plan.batch_sizes()[skip:]``). ``processors``: one per stream;
    ``tag`` marks each ``(position, item)``'s stream (and repeats) when the output needs it
    (:func:`~shardify.reader.streams.sample_tagger`). Lazy: nothing is read before the first
    batch is asked for."""
    o = options
    stages = worker_stages(
        reader,
        plan,
        read=read,
        out=out,
        process=by_stream(processors),
        collate=collate,
        on_bad=on_bad,
        tag=tag,
        bucket_length=o.batching.bucket_length,
        bucket_buffer=o.batching.bucket_buffer,
        seed=o.seed,
        epoch=epoch,
        rank=rank,
        worker=worker,
    )
    if skip:
        bucketed = o.batching.bucket_length is not None
        stages.load_state_dict(state_at_batch(skip, batch_size=plan.batch_size, samples=len(out), bucketed=bucketed))
    if len(sizes) != plan.num_batches - skip:
        raise ValueError(f"sizes has {len(sizes)} batches; the plan has {plan.num_batches - skip} after {skip=}")
    return stages

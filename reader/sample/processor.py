"""Per-sample processing: :class:`SampleProcessor` decodes and transforms one sample into its
output (or a :class:`Bad` marker under the skip policy), its augmentation RNG seeded by
(seed, epoch, key); :func:`stream_processors` makes one per stream. The stages that run it over
a worker's share are in :mod:`shardify.reader.stages`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from shardify.errors import SampleError, ShardFormatError
from shardify.reader.io.stream import Item, Lost
from shardify.reader.plan.shuffle import sample_rng
from shardify.reader.sample.bad import Bad
from shardify.reader.sample.clock import augmenting
from shardify.reader.sample.decode import IMAGE_EXTS, PickleRefusedError, decode_field, decode_sample
from shardify.reader.sample.transforms import run_image_transform
from shardify.tario import DAMAGE_AFTER

if TYPE_CHECKING:
    from shardify.reader.io.sources import Source
    from shardify.reader.options import ReadOptions
    from shardify.reader.streams import Stream

__all__ = [
    "IMAGE_FIELD",
    "SampleProcessor",
    "field_spec",
    "selected_fields",
    "missing_field",
    "stream_processors",
]

IMAGE_FIELD = "image"
"""In ``fields``, the name that matches whichever image extension a sample has."""


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

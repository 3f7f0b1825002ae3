"""Device decode, worker side: read the JPEG header, draw the crop and flip, send the bytes.

The worker stage of :class:`~shardify.reader.sample.decoders.DeviceDecoding`. Each sample goes
through a :class:`PrepProcessor` (its output columns, as ``fields=`` names them) and each
image through :class:`DevicePrep`:

- a baseline JPEG that nvJPEG takes (8-bit YCbCr, 3 components, whole: ends with EOI) becomes
  an :class:`ImagePrep`: its bytes, the crop box drawn with the transform's own ``draw_crop`` from
  the header's size, and the flips, with the draws of the CPU path from the same
  ``random.Random`` (seeded by seed, epoch and key): the same crop on every topology;
- anything else (PNG, progressive, CMYK, grayscale, unreadable header) is decoded here by the
  CPU path (``transform.apply_encoded``, the same draws again) and sent as pixels; a bad one
  raises here and follows ``on_error`` as on the CPU path.

:func:`pack_samples` (the strategy's collate) turns a batch of prepared samples into the CPU
path's batch structure with one :class:`EncodedBatch` per image column (the bytes laid end to
end in one tensor, boxes, flips, the pixels of the CPU-decoded ones) and the other columns as
``default_collate`` makes them. :mod:`shardify.reader.sample.device_decode` decodes it on the device.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Sequence
from typing import Any, NamedTuple, cast

import numpy as np
import torch

from shardify.errors import DeviceDecodeError, DeviceDecodeOptionsError, SampleError
from shardify.reader.io.stream import Item, Lost
from shardify.reader.plan.shuffle import sample_rng
from shardify.reader.sample.bad import Bad
from shardify.reader.sample.collate import Empty, default_collate, private_empty
from shardify.reader.sample.decode import IMAGE_EXTS, PickleRefusedError, decode_field, over_pixel_limit
from shardify.reader.sample.prepared import EncodedBatch, ImagePrep, PreparedSample
from shardify.reader.sample.processor import field_spec, missing_field
from shardify.reader.sample.transforms import Compose, RandomHorizontalFlip, RandomResizedCrop, _Geometric
from shardify.reader.sample.worker_share import SharedSplit

__all__ = [
    "JpegFrame",
    "jpeg_frame",
    "device_decodable",
    "ImagePrep",
    "PreparedSample",
    "EncodedBatch",
    "DevicePrep",
    "PrepProcessor",
    "pack_prepared",
    "pack_samples",
    "checked_device",
]


class JpegFrame(NamedTuple):
    """What a JPEG's start of frame says: ``sof`` is the n of SOFn (0 baseline, 2 progressive)."""

    sof: int
    width: int
    height: int
    components: int
    precision: int
    adobe_transform: int | None  # the APP14 "Adobe" colour transform, if the segment is there


_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def jpeg_frame(data: bytes | memoryview) -> JpegFrame | None:
    """The frame header of a JPEG, walking its marker segments up to SOFn (a few us); None if
    ``data`` is not a JPEG or its segments are broken before the frame header."""
    if data[:2] != b"\xff\xd8":
        return None
    i, n, adobe = 2, len(data), None
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # segments without a length
            i += 2
            continue
        length = (data[i + 2] << 8) | data[i + 3]
        if length < 2 or marker == 0xDA:  # a scan before the frame header
            return None
        if marker == 0xEE and length >= 14 and i + 16 <= n and bytes(data[i + 4 : i + 9]) == b"Adobe":
            adobe = data[i + 15]
        if marker in _SOF:
            if length < 8 or i + 10 > n:
                return None
            height = (data[i + 5] << 8) | data[i + 6]
            width = (data[i + 7] << 8) | data[i + 8]
            return JpegFrame(marker - 0xC0, width, height, data[i + 9], data[i + 4], adobe)
        i += 2 + length
    return None


def device_decodable(data: bytes | memoryview, frame: JpegFrame | None) -> bool:
    """Whether nvJPEG gets this image: baseline/extended 8-bit YCbCr with 3 components, whole
    (its last marker is EOI), under Pillow's pixel limit. The rest is decoded in the worker."""
    if frame is None or frame.sof not in (0, 1) or frame.precision != 8 or frame.components != 3:
        return False
    if frame.adobe_transform == 0 or frame.width == 0 or frame.height == 0:  # 0: RGB stored as is
        return False
    if over_pixel_limit(frame.width, frame.height) is not None:
        return False
    end = len(data)
    while end > 2 and data[end - 1] == 0:  # zero padding after EOI is harmless
        end -= 1
    return data[end - 2 : end] == b"\xff\xd9"


def _split_transform(transform: Any) -> tuple[Any, tuple[float, ...]]:
    """(crop transform, flip probabilities) of a transform the device path can run, else
    DeviceDecodeOptionsError."""
    items = list(transform.transforms) if isinstance(transform, Compose) else [transform]
    if not items or not isinstance(items[0], _Geometric):
        raise DeviceDecodeOptionsError(
            f"DecodeOptions(device=...) needs a transform that starts with a crop "
            f"(RandomResizedCrop, ResizeCenterCrop, "
            f"ScaleJitter, e.g. transforms.imagenet_train()/imagenet_eval()), got {transform!r}"
        )
    flips = []
    for t in items[1:]:
        if not isinstance(t, RandomHorizontalFlip):
            raise DeviceDecodeOptionsError(
                f"DecodeOptions(device=...) runs a crop then RandomHorizontalFlip on the device; {t!r} in "
                f"{transform!r} cannot run there (use the CPU path: no device)"
            )
        flips.append(t.p)
    return items[0], tuple(flips)


class DevicePrep:
    """Each image's :class:`ImagePrep` under ``transform``; see the module docstring.
    DeviceDecodeOptionsError for a transform the device cannot run. ``split``: the hybrid split
    (:mod:`~shardify.reader.sample.worker_share`), which has some device-decodable images
    decoded here too (marked ``shared``)."""

    def __init__(self, transform: Any, *, split: SharedSplit | None = None) -> None:
        self.transform = transform
        self._crop, self._flips = _split_transform(transform)
        self._crop_first = isinstance(self._crop, RandomResizedCrop)
        self._split = split

    def prepare(self, data: bytes, rng: random.Random) -> ImagePrep:
        split = self._split
        if split is None or not split.timed:
            return self._prepare(data, rng, split)
        start = time.perf_counter()
        prep = self._prepare(data, rng, split)
        split.record(time.perf_counter() - start, decoded=prep.data is None)
        return prep

    def _prepare(self, data: bytes, rng: random.Random, split: SharedSplit | None) -> ImagePrep:
        frame = jpeg_frame(data)
        decodable = device_decodable(data, frame)
        if not decodable or (split is not None and split.take()):
            pixels = self.transform.apply_encoded(data, rng)  # the CPU path, with the same draws
            h, w = pixels.shape[-2:]
            zero = (0.0, 0.0, 0.0, 0.0)
            return ImagePrep(None, zero, zero, (int(w), int(h)), False, pixels=pixels, shared=decodable)
        width, height = frame.width, frame.height  # type: ignore[union-attr]
        box, size = self._crop.draw_crop(width, height, rng)
        flip = False
        for p in self._flips:
            if rng.random() < p:
                flip = not flip
        left, top, right, bottom = box
        box = (float(left), float(top), float(right), float(bottom))
        bounds = box if self._crop_first else (0.0, 0.0, float(width), float(height))
        return ImagePrep(data, box, bounds, size, flip)

    def __repr__(self) -> str:
        return f"DevicePrep({self.transform!r})"


class PrepProcessor:
    """The device strategy's worker stage for one stream: an encoded sample to a :class:`PreparedSample`.

    ``fields``: its output columns (an extension or ``"a;b"`` alternatives; ``"image"`` any image
    extension), as :class:`~shardify.reader.sample.processor.SampleProcessor` takes them: image
    columns are prepared by ``prep``, the others decoded by extension. A sample that fails is
    a :class:`~shardify.errors.SampleError` naming shard and key, or under ``skip_errors`` a
    :class:`~shardify.reader.sample.bad.Bad` (the batch stage replaces it).
    """

    def __init__(
        self,
        *,
        prep: DevicePrep,
        fields: Sequence[str],
        seed: int,
        epoch: int,
        allow_pickle: bool,
        skip_errors: bool,
        unique_keys: bool,
    ) -> None:
        self._prep = prep
        self._fields = [field_spec(f, IMAGE_EXTS) for f in fields]
        self._seed, self._epoch = seed, epoch
        self._allow_pickle, self._skip, self._unique = allow_pickle, skip_errors, unique_keys

    def __call__(self, item: Item) -> PreparedSample | Bad:
        if isinstance(item, Lost):
            return Bad(item.shard, None, item.reason, lost=True)
        shard, key = str(item["__shard__"]), str(item["__key__"])
        field: str | None = None
        try:
            columns: list[Any] = []
            rng = None  # seeded only for a sample with an image, as on the CPU path
            for alternatives in self._fields:
                ext = next((e for e in alternatives if e in item), None)
                if ext is None:
                    raise missing_field(alternatives, item)
                field = ext
                if ext.rpartition(".")[2] in IMAGE_EXTS:
                    if rng is None:
                        sample_id = key if self._unique else f"{os.path.basename(shard)}/{key}"
                        rng = sample_rng(self._seed, self._epoch, sample_id)
                    columns.append(self._prep.prepare(cast(bytes, item[ext]), rng))
                else:
                    columns.append(decode_field(ext, cast(bytes, item[ext]), allow_pickle=self._allow_pickle))
            return PreparedSample(tuple(columns), shard, key)
        except Exception as e:
            reason = (f"field {field!r}: " if field is not None else "") + f"{type(e).__name__}: {e}"
            if not self._skip or isinstance(e, PickleRefusedError):
                raise SampleError(reason, shard=shard, key=key) from e
            return Bad(shard, key, reason, lost=False)


def pack_prepared(
    images: Sequence[ImagePrep],
    *,
    shards: Sequence[str] | None = None,
    keys: Sequence[str] | None = None,
    empty: Empty = private_empty,
) -> EncodedBatch:
    """One :class:`EncodedBatch` of a batch's image preps (all of one output size); ``shards``
    and ``keys`` name each row in messages; ``empty`` allocates the bytes and pixels (as for
    :func:`~shardify.reader.sample.collate.default_collate`)."""
    shards = list(shards) if shards is not None else [""] * len(images)
    keys = list(keys) if keys is not None else [""] * len(images)
    size = images[0].size
    for i, im in enumerate(images):
        if im.size != size:
            raise ValueError(
                f"batch: cannot batch output sizes {size} (sample 0) and {im.size} (sample {i}, "
                f"shard {shards[i]}, key {keys[i]!r}); device decode needs one output size"
            )
    b = len(images)
    lengths = np.fromiter((0 if im.data is None else len(im.data) for im in images), dtype=np.int64, count=b)
    offsets = np.zeros(b + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = empty((int(offsets[-1]),), torch.uint8)
    buf = data.numpy()
    for i, im in enumerate(images):
        if im.data is not None:
            buf[offsets[i] : offsets[i + 1]] = np.frombuffer(im.data, dtype=np.uint8)
    rows = [i for i, im in enumerate(images) if im.pixels is not None]
    w, h = size
    pixels = empty((len(rows), 3, h, w), torch.uint8)
    for j, decoded in enumerate(im.pixels for im in images if im.pixels is not None):
        pixels[j] = decoded
    return EncodedBatch(
        data=data,
        offsets=torch.from_numpy(offsets),
        boxes=torch.tensor([im.box for im in images], dtype=torch.float64),
        bounds=torch.tensor([im.bounds for im in images], dtype=torch.float64),
        flips=torch.tensor([im.flip for im in images], dtype=torch.bool),
        pixels=pixels,
        pixel_rows=torch.tensor(rows, dtype=torch.int64),
        size=(h, w),
        shards=shards,
        keys=keys,
        shared=sum(1 for im in images if im.shared),
    )


def pack_samples(samples: Sequence[PreparedSample], *, empty: Empty = private_empty) -> Any:
    """The device strategy's collate: the CPU path's ``default_collate`` structure, with one
    :class:`EncodedBatch` where that path has a stacked image column (one column: the value itself)."""
    width = len(samples[0].columns)
    shards, keys = [s.shard for s in samples], [s.key for s in samples]
    for i, s in enumerate(samples):
        if len(s.columns) != width:
            raise ValueError(
                f"batch: sample {i} (shard {s.shard}, key {s.key!r}) has {len(s.columns)} columns, sample 0 has {width}"
            )
    out = []
    for j in range(width):
        column = [s.columns[j] for s in samples]
        prepared = [type(v) is ImagePrep for v in column]
        if any(prepared) and not all(prepared):
            i = prepared.index(not prepared[0])
            raise ValueError(
                f"batch[{j}]: sample 0 (shard {shards[0]}, key {keys[0]!r}) and sample {i} (shard "
                f"{shards[i]}, key {keys[i]!r}) differ in whether this column is an image"
            )
        packed = pack_prepared(column, shards=shards, keys=keys, empty=empty) if prepared[0] else None
        out.append(packed if packed is not None else default_collate(column, empty=empty))
    return out[0] if width == 1 else tuple(out)


def checked_device(decode_device: str | torch.device, options: Any, streams: Sequence[Any]) -> torch.device:
    """``decode_device`` as a device, once the options are known to run under device decode.

    :class:`~shardify.errors.DeviceDecodeError` for a CUDA device without CUDA;
    :class:`~shardify.errors.DeviceDecodeOptionsError` for ``map=``, a custom ``collate_fn=``,
    ``bucket_length=`` (each would see the images before they are decoded), no transform, or a
    transform the device cannot run.
    """
    device = torch.device(decode_device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DeviceDecodeError(
            f"DecodeOptions(device={str(decode_device)!r}) but CUDA is not available here "
            f"(torch {torch.__version__}, built with CUDA {torch.version.cuda}); "
            "leave DecodeOptions.device unset to decode in the workers"
        )
    after = "the images are decoded after the workers, so it would see them undecoded"
    if options.map is not None or any(s.map is not None for s in streams):
        raise DeviceDecodeOptionsError(
            f"map= cannot run under DecodeOptions(device=...): {after}; name the output columns with "
            "fields=... (the batch comes back as default_collate makes it), or decode in the workers"
        )
    collate_fn = options.batching.collate_fn
    if collate_fn is not None and collate_fn is not default_collate:
        raise DeviceDecodeOptionsError(
            f"BatchOptions(collate_fn={collate_fn!r}) cannot run under DecodeOptions(device=...): "
            f"{after}; batches come as default_collate makes them (compute on them after the loader)"
        )
    if options.batching.bucket_length is not None:
        raise DeviceDecodeOptionsError(
            f"BatchOptions(bucket_length=...) cannot run under DecodeOptions(device=...): {after}"
        )
    if options.transform is None and any(s.transform is None for s in streams):
        raise DeviceDecodeOptionsError(
            "DecodeOptions(device=...) needs transform=... (a crop, e.g. transforms.imagenet_train())"
        )
    return device

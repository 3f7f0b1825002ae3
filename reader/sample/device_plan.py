"""Device decode, worker side: read the JPEG header, draw the crop and flip, send the bytes.

For ``ShardedDataset(decoding=DecodeOptions(device=...))``. Each image goes through :class:`DevicePlanner`:

- a baseline JPEG that nvJPEG takes (8-bit YCbCr, 3 components, whole: ends with EOI) becomes
  a :class:`PlannedImage`: its bytes, the crop box drawn with the transform's own ``plan`` from
  the header's size, and the flips, with the draws of the CPU path from the same
  ``random.Random`` (seeded by seed, epoch and key): the same crop on every topology;
- anything else (PNG, progressive, CMYK, grayscale, unreadable header) is decoded here by the
  CPU path (``transform.apply_encoded``, the same draws again) and sent as pixels; a bad one
  raises here and follows ``on_error`` as on the CPU path.

:func:`pack_planned` (run by :class:`DeviceCollate` in the worker, after the usual collate)
turns a batch's list of them into one :class:`EncodedBatch`: the bytes laid end to end in
one tensor (a recycled shared-memory slot under ``make_loader``), boxes, flips and the pixels
of the CPU-decoded ones. :mod:`shardify.reader.sample.device_decode` decodes it on the device.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from shardify.errors import DeviceDecodeError
from shardify.reader.sample.collate import default_collate
from shardify.reader.sample.decode import over_pixel_limit
from shardify.reader.sample.planned import PLACEHOLDER_HINT, EncodedBatch, PlannedColumn, PlannedImage
from shardify.reader.sample.transforms import Compose, RandomHorizontalFlip, RandomResizedCrop, _Geometric

__all__ = [
    "JpegFrame",
    "jpeg_frame",
    "PlannedImage",
    "PlannedColumn",
    "EncodedBatch",
    "DevicePlanner",
    "DeviceCollate",
    "pack_planned",
    "plan_on_device",
    "PLACEHOLDER_HINT",
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
    """(crop transform, flip probabilities) of a transform the device path can run, else ValueError."""
    items = list(transform.transforms) if isinstance(transform, Compose) else [transform]
    if not items or not isinstance(items[0], _Geometric):
        raise ValueError(
            f"DecodeOptions(device=...) needs a transform that starts with a crop "
            f"(RandomResizedCrop, ResizeCenterCrop, "
            f"ScaleJitter, e.g. transforms.imagenet_train()/imagenet_eval()), got {transform!r}"
        )
    flips = []
    for t in items[1:]:
        if not isinstance(t, RandomHorizontalFlip):
            raise ValueError(
                f"DecodeOptions(device=...) runs a crop then RandomHorizontalFlip on the device; {t!r} in "
                f"{transform!r} cannot run there (use the CPU path: no device)"
            )
        flips.append(t.p)
    return items[0], tuple(flips)


class DevicePlanner:
    """The worker side of device decode for ``transform``; see the module docstring.

    ``apply_encoded(data, rng)`` is what the dataset calls on each image field, as for any
    shardify transform.
    """

    def __init__(self, transform: Any) -> None:
        self.transform = transform
        self._crop, self._flips = _split_transform(transform)
        self._crop_first = isinstance(self._crop, RandomResizedCrop)

    def apply_encoded(self, data: bytes, rng: random.Random) -> PlannedImage:
        frame = jpeg_frame(data)
        if not device_decodable(data, frame):
            pixels = self.transform.apply_encoded(data, rng)  # the CPU path, with the same draws
            h, w = pixels.shape[-2:]
            zero = (0.0, 0.0, 0.0, 0.0)
            return PlannedImage(None, zero, zero, (int(w), int(h)), False, pixels=pixels)
        width, height = frame.width, frame.height  # type: ignore[union-attr]
        box, size = self._crop.plan(width, height, rng)
        flip = False
        for p in self._flips:
            if rng.random() < p:
                flip = not flip
        left, top, right, bottom = box
        box = (float(left), float(top), float(right), float(bottom))
        bounds = box if self._crop_first else (0.0, 0.0, float(width), float(height))
        return PlannedImage(data, box, bounds, size, flip)

    def __repr__(self) -> str:
        return f"DevicePlanner({self.transform!r})"


def pack_planned(images: Sequence[PlannedImage], *, column: str = "stack") -> EncodedBatch:
    """One :class:`EncodedBatch` of a batch's planned images (all of one output size)."""
    size = images[0].size
    for i, im in enumerate(images):
        if im.size != size:
            raise ValueError(
                f"batch: cannot batch output sizes {size} (sample 0) and {im.size} (sample {i}, "
                f"shard {im.shard}, key {im.key!r}); device decode needs one output size"
            )
    b = len(images)
    lengths = np.fromiter((0 if im.data is None else len(im.data) for im in images), dtype=np.int64, count=b)
    offsets = np.zeros(b + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = torch.empty((int(offsets[-1]),), dtype=torch.uint8)
    buf = data.numpy()
    for i, im in enumerate(images):
        if im.data is not None:
            buf[offsets[i] : offsets[i + 1]] = np.frombuffer(im.data, dtype=np.uint8)
    rows = [i for i, im in enumerate(images) if im.pixels is not None]
    decoded = [im.pixels for im in images if im.pixels is not None]
    w, h = size
    pixels = torch.empty((len(rows), 3, h, w), dtype=torch.uint8)
    for j, row in enumerate(decoded):
        pixels[j] = row
    return EncodedBatch(
        data=data,
        offsets=torch.from_numpy(offsets),
        boxes=torch.tensor([im.box for im in images], dtype=torch.float64),
        bounds=torch.tensor([im.bounds for im in images], dtype=torch.float64),
        flips=torch.tensor([im.flip for im in images], dtype=torch.bool),
        pixels=pixels,
        pixel_rows=torch.tensor(rows, dtype=torch.int64),
        size=(h, w),
        shards=[im.shard for im in images],
        keys=[im.key for im in images],
        column=column,
    )


def _pack_lists(obj: Any, where: str = "batch") -> Any:
    kind = type(obj)
    if (kind is PlannedColumn or kind is list or kind is tuple) and obj and all(type(x) is PlannedImage for x in obj):
        return pack_planned(obj, column="stack" if kind is PlannedColumn else kind.__name__)
    if kind is PlannedImage:
        raise ValueError(
            f"{where}: an image planned for device decode is not in a column of the batch "
            f"(shard {obj.shard}, key {obj.key!r}); {PLACEHOLDER_HINT}"
        )
    if isinstance(obj, (list, tuple)) and not isinstance(obj, EncodedBatch):
        items = [_pack_lists(x, f"{where}[{i}]") for i, x in enumerate(obj)]
        return type(obj)(*items) if hasattr(obj, "_fields") else kind(items)
    if isinstance(obj, dict):
        return {k: _pack_lists(v, f"{where}[{k!r}]") for k, v in obj.items()}
    return obj


class DeviceCollate:
    """``collate_fn`` (default: ``default_collate``), then each column of planned images packed.

    A column is a list (or tuple) of the batch's planned images, wherever the collate put it:
    decoded on the device, it becomes what the CPU path's collate made of the decoded images
    (one stacked tensor from shardify's collates, a list or tuple of images from one that
    kept them so);
    a planned image anywhere else, or a collate that fails computing on one, is a ValueError
    saying what the collate may do with them."""

    def __init__(self, collate_fn: Callable[[list[Any]], Any] | None) -> None:
        self.collate_fn = collate_fn

    def __call__(self, samples: list[Any]) -> Any:
        collate = default_collate if self.collate_fn is None else self.collate_fn
        try:
            batch = collate(samples)
        except Exception as e:
            if "PlannedImage" not in str(e):
                raise
            raise ValueError(
                f"collate_fn={collate!r} failed on a batch planned for device decode "
                f"({type(e).__name__}: {e}); {PLACEHOLDER_HINT}"
            ) from e
        return _pack_lists(batch)


def plan_on_device(
    decode_device: str | torch.device, options: Any, streams: Sequence[Any]
) -> tuple[torch.device, Any, tuple]:
    """``(device, options, streams)`` with every image transform planned for the device.

    Raises :class:`DeviceDecodeError` for a CUDA device without CUDA, ValueError for a
    transform the device path cannot run.
    """
    device = torch.device(decode_device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DeviceDecodeError(
            f"DecodeOptions(device={str(decode_device)!r}) but CUDA is not available here "
            f"(torch {torch.__version__}, built with CUDA {torch.version.cuda}); "
            "leave DecodeOptions.device unset to decode in the workers"
        )
    if options.transform is None and any(s.transform is None for s in streams):
        raise ValueError("DecodeOptions(device=...) needs transform=... (a crop, e.g. transforms.imagenet_train())")
    options = dataclasses.replace(
        options,
        transform=DevicePlanner(options.transform) if options.transform is not None else None,
        collate_fn=DeviceCollate(options.collate_fn),
    )
    streams = tuple(
        dataclasses.replace(s, transform=DevicePlanner(s.transform)) if s.transform is not None else s for s in streams
    )
    return device, options, streams

"""What device decode sends from the workers to the device: each image's prep, a sample's, the packed batch.

The device strategy's worker stage (:mod:`~shardify.reader.sample.device_prep`) prepares each JPEG
into an :class:`ImagePrep` and each sample into a :class:`PreparedSample`; its packing turns a
batch of them into one :class:`EncodedBatch`, which :mod:`~shardify.reader.sample.device_decode`
decodes on the device. These types stay inside the device strategy: they never reach ``map=``,
a ``collate_fn=`` or the generic stages. Plain data types, so that the worker side and the device
side share them without importing one another.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import torch

__all__ = ["ImagePrep", "PreparedSample", "EncodedBatch"]


@dataclasses.dataclass(frozen=True, slots=True)
class ImagePrep:
    """One image of a device-decoded batch: bytes and draws, or (decoded in the worker) ``pixels``.

    ``box`` and ``bounds`` are (left, top, right, bottom) in original pixels: the crop is
    resized to ``size`` (w, h) by a filter reading only inside ``bounds`` (the box itself for
    RandomResizedCrop, which crops first; the whole image otherwise, as Pillow's
    ``resize(box=...)``). ``flip``: mirrored left-right after resizing. ``shared``: decoded in
    the worker by the hybrid split, though the device could have taken it.
    """

    data: bytes | memoryview | None
    box: tuple[float, float, float, float]
    bounds: tuple[float, float, float, float]
    size: tuple[int, int]
    flip: bool
    pixels: torch.Tensor | None = None
    shared: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class PreparedSample:
    """One sample as the device strategy's worker stage makes it: per output column, an
    :class:`ImagePrep` (an image column) or the decoded value; and where it comes from."""

    columns: tuple[Any, ...]
    shard: str
    key: str


class EncodedBatch(NamedTuple):
    """A batch's images as the device side takes them (``B`` images, ``F`` of them CPU-decoded).

    ``data``: uint8 [total], the encoded bytes end to end; ``offsets``: int64 [B + 1] (a
    CPU-decoded image has no bytes); ``boxes``, ``bounds``: float64 [B, 4]; ``flips``: bool [B];
    ``pixels``: uint8 [F, 3, h, w] at rows ``pixel_rows`` (int64 [F]); ``size``: (h, w);
    ``shards``, ``keys``: per row, for messages; ``shared``: how many of the ``F`` the hybrid
    split had the workers decode (the others, the device could not take). Decoded, it becomes one uint8 ``[B, 3, h, w]``
    tensor, as ``default_collate`` stacks the CPU path's images.
    """

    data: torch.Tensor
    offsets: torch.Tensor
    boxes: torch.Tensor
    bounds: torch.Tensor
    flips: torch.Tensor
    pixels: torch.Tensor
    pixel_rows: torch.Tensor
    size: tuple[int, int]
    shards: list[str]
    keys: list[str]
    shared: int = 0

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        """A model or torch op given the undecoded batch: say what it is, rather than fail deep inside."""
        name = getattr(func, "__name__", str(func))
        raise TypeError(
            f"{name}() got a batch of JPEG bytes prepared for device decode (EncodedBatch): a dataset "
            "made with DecodeOptions(device=...) is decoded by make_loader's prefetcher; iterate it "
            "through make_loader, or leave DecodeOptions.device unset to decode in the workers"
        )

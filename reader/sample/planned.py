"""What device decode sends from the workers to the device: the planned image and the packed batch.

A worker plans each JPEG (:mod:`~shardify.reader.sample.device_plan`) into a :class:`PlannedImage`;
collate keeps a batch's planned images in a :class:`PlannedColumn`; the worker packs them into one
:class:`EncodedBatch`, which :mod:`~shardify.reader.sample.device_decode` decodes on the device.
Plain data types, so that collate, the planner and the device side share them without importing
one another.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import torch

__all__ = ["PlannedImage", "PlannedColumn", "EncodedBatch", "PLACEHOLDER_HINT"]


@dataclasses.dataclass(slots=True)
class PlannedImage:
    """One image of a device-decoded batch: bytes and draws, or (CPU-decoded) ``pixels``.

    ``box`` and ``bounds`` are (left, top, right, bottom) in original pixels: the crop is
    resized to ``size`` (w, h) by a filter reading only inside ``bounds`` (the box itself for
    RandomResizedCrop, which crops first; the whole image otherwise, as Pillow's
    ``resize(box=...)``). ``flip``: mirrored left-right after resizing.
    """

    data: bytes | memoryview | None
    box: tuple[float, float, float, float]
    bounds: tuple[float, float, float, float]
    size: tuple[int, int]
    flip: bool
    pixels: torch.Tensor | None = None
    shard: str = ""
    key: str = ""

    @property
    def shape(self) -> torch.Size:
        """The shape of the image once decoded (as the CPU path's tensor): ``(3, h, w)``."""
        return torch.Size((3, self.size[1], self.size[0]))

    def locate(self, shard: str, key: str) -> None:
        """Name the sample (for the messages and report of the device side)."""
        self.shard, self.key = shard, key


class EncodedBatch(NamedTuple):
    """A batch's images as the device side takes them (``B`` images, ``F`` of them CPU-decoded).

    ``data``: uint8 [total], the encoded bytes end to end; ``offsets``: int64 [B + 1] (a
    CPU-decoded image has no bytes); ``boxes``, ``bounds``: float64 [B, 4]; ``flips``: bool [B];
    ``pixels``: uint8 [F, 3, h, w] at rows ``pixel_rows`` (int64 [F]); ``size``: (h, w);
    ``shards``, ``keys``: per row, for messages. ``column``: what the batch holds once decoded,
    as the CPU path's collate would have made it: ``"stack"`` one ``[B, 3, h, w]`` tensor (the
    collates of :mod:`~shardify.reader.sample.collate`), ``"list"``/``"tuple"`` the images one by one
    (a custom collate that kept them in a list or tuple).
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
    column: str = "stack"

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        """A model or torch op given the undecoded batch: say what it is, rather than fail deep inside."""
        name = getattr(func, "__name__", str(func))
        raise TypeError(
            f"{name}() got a batch of JPEG bytes planned for device decode (EncodedBatch): a dataset "
            "made with DecodeOptions(device=...) is decoded by make_loader's prefetcher; iterate it "
            "through make_loader, or leave DecodeOptions.device unset to decode in the workers"
        )


class PlannedColumn(list):
    """A batch's planned images that the CPU path's collate would have stacked into one tensor."""


PLACEHOLDER_HINT = (
    "under DecodeOptions(device=...) each image reaches map= and collate_fn= as a PlannedImage "
    "(its bytes and crop; .shape is the decoded image's): keep the images of a batch in a list, "
    "as default_collate and pad_collate do, and compute on their pixels after the loader"
)

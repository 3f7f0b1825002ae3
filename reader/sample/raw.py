"""Pre-decoded images (``--raw-pixels``, :mod:`shardify.pixels`): crop, then resize only the crop.

A ``ppm`` member holding a binary 8-bit PPM is viewed as an ``H x W x 3`` array over its
bytes (no decoding). The crop transforms draw their box from the stored size, as they draw
it from a JPEG's header size, with the same draws from the sample's rng; the stored image is
already at most ``S`` pixels on its chosen side, so the box is in stored pixels. For
``RandomResizedCrop`` (crop, then resize the crop, as torchvision) the box is sliced out of
the view, copied into one compact block (torch's antialiased uint8 kernel is fastest on it,
~1.5x, and the member's bytes stay read-only) and resized with torch's antialiased bilinear,
as the JPEG fast path does: Pillow's bilinear within 1. ``ResizeCenterCrop`` and
``ScaleJitter`` (resize the image, then crop) copy a box that needs no resizing (an eval crop
of a split stored at its ``resize``) and otherwise use the transform's own Pillow resize on an
image sharing the bytes. Both give the plain path's pixels exactly.

Any other PPM (comments, 16-bit, gray) and an image over ``PIL.Image.MAX_IMAGE_PIXELS`` take
Pillow's path like every other format (which refuses the latter with its reason).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from shardify.pixels import rgb_view

from .decode import Box, _whole_pixels, over_pixel_limit

__all__ = ["raw_pixels", "raw_crop", "raw_image", "raw_to_tensor"]


def raw_pixels(data: bytes | bytearray | memoryview) -> np.ndarray | None:
    """The ``H x W x 3`` uint8 view of a pre-decoded image's bytes, or None (decode it instead)."""
    hwc = rgb_view(data)
    if hwc is None or over_pixel_limit(hwc.shape[1], hwc.shape[0]) is not None:
        return None
    return hwc


def raw_crop(hwc: np.ndarray, box: Box, size: tuple[int, int], *, crop_first: bool = True) -> torch.Tensor | None:
    """``box`` (stored pixels) of ``hwc`` resized to ``size`` (w, h) as a uint8 ``[3, h, w]``
    tensor; None when the box has fractional edges, or needs resizing and ``crop_first`` is
    False (a transform that resizes the whole image, then crops: its filter reaches past the
    box, so use :func:`raw_image` and its Pillow resize)."""
    left, top, right, bottom = _whole_pixels(box, hwc.shape[1], hwc.shape[0])
    if max(abs(a - b) for a, b in zip(box, (left, top, right, bottom))) > 1e-6:
        return None
    if not crop_first and (right - left, bottom - top) != size:
        return None
    crop = torch.from_numpy(hwc[top:bottom, left:right].copy()).permute(2, 0, 1)
    if (right - left, bottom - top) != size:
        crop = F.interpolate(crop[None], size=(size[1], size[0]), mode="bilinear", antialias=True, align_corners=False)[
            0
        ]
    return crop.contiguous()


def raw_image(hwc: np.ndarray) -> Image.Image:
    """An RGB Pillow image sharing ``hwc``'s memory (no copy)."""
    return Image.frombuffer("RGB", (hwc.shape[1], hwc.shape[0]), hwc, "raw", "RGB", 0, 1)


def raw_to_tensor(hwc: np.ndarray) -> torch.Tensor:
    """The whole image as a new uint8 ``[3, H, W]`` tensor (one copy)."""
    return torch.from_numpy(np.ascontiguousarray(hwc.transpose(2, 0, 1)))

"""Image transforms that run in the workers: seeded, picklable, uint8 CHW out, JPEG fast path.

Every transform takes the sample's ``random.Random`` (seeded from seed, epoch and key), so a
sample gets the same augmentation whatever the worker or rank. ``t(img, rng)`` maps a PIL image
to a PIL image (the plain path, torchvision's results); ``t.apply_encoded(data, rng)`` maps the
encoded bytes to a ``uint8 [3, H, W]`` tensor. When the first step is a crop/resize and the
bytes are a JPEG, that fast path draws the crop from the header's size with the same draws as
the plain path, decodes at 1/2, 1/4 or 1/8 scale in the DCT domain (Pillow's ``draft``) while
the crop keeps at least the output size, and resizes only the crop: a whole-pixel box with
torch's antialiased bilinear (Pillow's within 1), a fractional one with Pillow's box resize;
both shrink by whole blocks first past ``REDUCING_GAP``. Pre-decoded images
(``--raw-pixels``, :mod:`shardify.reader.sample.raw`) skip decoding: the box is drawn from the
stored size with the same draws, sliced out of the bytes, and only the crop is resized. Flip
and colour jitter then run on the tensor. Other formats take the plain path. Normalisation is
left to the device. The base class is in :mod:`~shardify.reader.sample.transform_base`, colour
jitter in :mod:`~shardify.reader.sample.color`; all are imported from here.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any

import torch
from PIL import Image
from PIL.JpegImagePlugin import JpegImageFile

from .clock import augmenting
from .color import ColorJitter
from .decode import (
    REDUCING_GAP,
    Box,
    decode_image,
    decode_jpeg_crop,
    load_rgb,
    open_image,
    pil_to_tensor,
    tensor_to_pil,
    turbo_crop,
    turbo_jpeg_size,
)
from .raw import raw_crop, raw_image, raw_pixels, raw_to_tensor
from .transform_base import Transform, _as_output, _seed_globals

__all__ = [
    "Transform",
    "Compose",
    "RandomResizedCrop",
    "ScaleJitter",
    "ResizeCenterCrop",
    "RandomHorizontalFlip",
    "ColorJitter",
    "imagenet_train",
    "imagenet_eval",
    "pil_to_tensor",
    "run_image_transform",
    "REDUCING_GAP",
]


class _Geometric(Transform):
    """A crop of the original image resized to an output size; drawn before decoding.

    ``fast_decode=True`` (a keyword of every crop transform) decodes JPEGs on the fast path
    with libjpeg-turbo's fast integer IDCT and fast chroma upsampling, as FFCV and DALI do:
    the crop is the same, the pixels differ slightly from the exact path (``shardify bench``
    reports by how much). Only full-scale decodes change: crops decoded at 1/2..1/8 scale use
    libjpeg's scaled IDCT either way, and crops that take Pillow's path are decoded exactly.
    """

    fast_decode: bool = False

    def draw_crop(self, width: int, height: int, rng: random.Random) -> tuple[Box, tuple[int, int]]:
        """Draw the crop box (original pixels) and the output (w, h) for an image of that size."""
        raise NotImplementedError

    def _resample(self, img: Image.Image, box: Box, size: tuple[int, int]) -> Image.Image:
        return img.resize(size, Image.Resampling.BILINEAR, box=box)

    def __call__(self, img: Image.Image, rng: random.Random) -> Image.Image:
        box, size = self.draw_crop(img.width, img.height, rng)
        return self._resample(img, box, size)

    def apply_encoded(self, data: bytes, rng: random.Random) -> torch.Tensor:
        return _as_output(self._decode_cropped(data, rng))  # type: ignore[return-value]

    def _decode_cropped(self, data: bytes, rng: random.Random) -> torch.Tensor | Image.Image:
        """JPEG and raw pixels: the fast path's tensor. Other formats: the plain path's PIL image."""
        raw = raw_pixels(data)
        if raw is not None:  # pre-decoded (--raw-pixels): the box is drawn on the stored size
            box, size = self.draw_crop(raw.shape[1], raw.shape[0], rng)
            cropped = raw_crop(raw, box, size, crop_first=isinstance(self, RandomResizedCrop))
            return cropped if cropped is not None else self._resample(raw_image(raw), box, size)
        turbo = turbo_jpeg_size(data)
        if turbo is not None:  # the usual JPEG: no Pillow at all, unless the crop needs it
            box, size = self.draw_crop(*turbo, rng)
            fast = turbo_crop(data, *turbo, box, size, fast=self.fast_decode)
            if fast is not None:
                return fast
            img = open_image(data)
        else:
            img = open_image(data)
            box, size = self.draw_crop(img.width, img.height, rng)
        if isinstance(img, JpegImageFile):
            return decode_jpeg_crop(img, box, size, data=None if turbo is not None else data)
        return self._resample(load_rgb(img), box, size)


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name}={value!r} should be a positive int")


def _shorter_side_to(width: int, height: int, short: int) -> tuple[int, int]:
    """torchvision's ``Resize(short)`` output (w, h): the longer side is truncated."""
    if width <= height:
        return short, int(short * height / width)
    return int(short * width / height), short


class RandomResizedCrop(_Geometric):
    """torchvision's RandomResizedCrop: area fraction in ``scale``, log-uniform aspect ``ratio``.

    10 attempts, then a centre crop with the ratio clamped into ``ratio``; crop, then bilinear
    antialiased resize. ``size`` is an int or (height, width), as in torchvision.
    """

    def __init__(
        self,
        size: int | Sequence[int],
        *,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        fast_decode: bool = False,
    ) -> None:
        dims = (size, size) if isinstance(size, int) else tuple(size)
        if len(dims) != 2:
            raise ValueError(f"{size=} should be an int or (height, width)")
        h, w = dims
        _check_positive(size_h=h, size_w=w)
        if not (len(scale) == 2 and 0 <= scale[0] <= scale[1] and scale[1] > 0):
            raise ValueError(f"{scale=} should be (min, max) with 0 <= min <= max and max > 0")
        if not (len(ratio) == 2 and 0 < ratio[0] <= ratio[1]):
            raise ValueError(f"{ratio=} should be (min, max) with 0 < min <= max")
        self.size = (h, w)
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))
        self.fast_decode = fast_decode

    def crop_params(self, width: int, height: int, rng: random.Random) -> tuple[int, int, int, int]:
        """(top, left, height, width) of the crop, drawn as torchvision's ``get_params``."""
        area = width * height
        log_lo, log_hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        for _ in range(10):
            target_area = area * rng.uniform(self.scale[0], self.scale[1])
            aspect = math.exp(rng.uniform(log_lo, log_hi))
            w = int(round(math.sqrt(target_area * aspect)))
            h = int(round(math.sqrt(target_area / aspect)))
            if 0 < w <= width and 0 < h <= height:
                top = rng.randint(0, height - h)
                left = rng.randint(0, width - w)
                return top, left, h, w
        in_ratio = width / height
        if in_ratio < self.ratio[0]:
            w, h = width, int(round(width / self.ratio[0]))
        elif in_ratio > self.ratio[1]:
            w, h = int(round(height * self.ratio[1])), height
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def draw_crop(self, width: int, height: int, rng: random.Random) -> tuple[Box, tuple[int, int]]:
        top, left, h, w = self.crop_params(width, height, rng)
        return (left, top, left + w, top + h), (self.size[1], self.size[0])

    def _resample(self, img: Image.Image, box: Box, size: tuple[int, int]) -> Image.Image:
        # As torchvision: crop first, so the filter does not reach outside the crop.
        left, top, right, bottom = (int(v) for v in box)
        return img.crop((left, top, right, bottom)).resize(size, Image.Resampling.BILINEAR)


class ScaleJitter(_Geometric):
    """Shorter side resized to a random int in [min_size, max_size], then a random square crop.

    Done as one resize of the crop's source box: the same filter centres and support as
    resize-then-crop, so equal up to the filter's rounding (a few pixels off by 1 or 2).
    """

    def __init__(self, *, min_size: int = 256, max_size: int = 480, crop: int = 224, fast_decode: bool = False) -> None:
        _check_positive(min_size=min_size, max_size=max_size, crop=crop)
        if not crop <= min_size <= max_size:
            raise ValueError(f"need {crop=} <= {min_size=} <= {max_size=}")
        self.min_size, self.max_size, self.crop = min_size, max_size, crop
        self.fast_decode = fast_decode

    def draw_crop(self, width: int, height: int, rng: random.Random) -> tuple[Box, tuple[int, int]]:
        nw, nh = _shorter_side_to(width, height, rng.randint(self.min_size, self.max_size))
        top, left = rng.randint(0, nh - self.crop), rng.randint(0, nw - self.crop)
        fx, fy, c = width / nw, height / nh, self.crop
        return (left * fx, top * fy, (left + c) * fx, (top + c) * fy), (c, c)


class ResizeCenterCrop(_Geometric):
    """Evaluation: shorter side to ``resize`` (torchvision ``Resize``), then ``CenterCrop(crop)``."""

    def __init__(self, *, resize: int = 256, crop: int = 224, fast_decode: bool = False) -> None:
        _check_positive(resize=resize, crop=crop)
        if crop > resize:
            raise ValueError(f"{crop=} should be <= {resize=}")
        self.resize, self.crop = resize, crop
        self.fast_decode = fast_decode

    def draw_crop(self, width: int, height: int, rng: random.Random) -> tuple[Box, tuple[int, int]]:
        nw, nh = _shorter_side_to(width, height, self.resize)
        c = self.crop
        top, left = int(round((nh - c) / 2.0)), int(round((nw - c) / 2.0))
        fx, fy = width / nw, height / nh
        return (left * fx, top * fy, (left + c) * fx, (top + c) * fy), (c, c)


class RandomHorizontalFlip(Transform):
    """Mirror left-right with probability ``p``."""

    def __init__(self, p: float = 0.5) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"{p=} should be in [0, 1]")
        self.p = float(p)

    def __call__(self, img: Image.Image, rng: random.Random) -> Image.Image:
        return img.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if rng.random() < self.p else img

    def apply_tensor(self, x: torch.Tensor, rng: random.Random) -> torch.Tensor:
        return x.flip(-1) if rng.random() < self.p else x


class Compose(Transform):
    """Apply transforms in order; nested Composes are flattened.

    Items are shardify transforms or any callable ``f(img)`` taking a PIL image (called with
    the global RNGs seeded from the sample's rng). A PIL result becomes a uint8 CHW tensor. The
    fast path applies when the first item is RandomResizedCrop, ScaleJitter or ResizeCenterCrop.
    """

    transforms: list[Callable[..., Any]]

    def __init__(self, transforms: Sequence[Callable[..., Any]]) -> None:
        flat: list[Callable[..., Any]] = []
        for i, t in enumerate(transforms):
            if isinstance(t, Compose):
                flat.extend(t.transforms)
            elif callable(t):
                flat.append(t)
            else:
                raise ValueError(f"transforms[{i}]={t!r} should be callable")
        self.transforms = flat

    # (Any: a Compose gives whatever its last item gives, an image or not)
    def __call__(self, img: Image.Image, rng: random.Random) -> Any:
        value: object = img
        for t in self.transforms:
            value = _apply(t, value, rng)
        return value

    def apply_encoded(self, data: bytes, rng: random.Random) -> Any:
        first = self.transforms[0] if self.transforms else None
        if isinstance(first, _Geometric):  # decoded with the first transform's crop and resize (the fast path)
            value = first._decode_cropped(data, rng)
            return augmenting(lambda: self._augmented(value, rng))
        img = decode_image(data)
        return augmenting(lambda: _as_output(self(img, rng)))

    def _augmented(self, value: object, rng: random.Random) -> object:
        """The transforms after the first on its output (the fast path: tensors while they can)."""
        for t in self.transforms[1:]:
            if isinstance(value, torch.Tensor):  # our stand-in for the PIL image of the plain path
                fn = getattr(t, "apply_tensor", None) if isinstance(t, Transform) else None
                if fn is not None:
                    value = fn(value, rng)
                    continue
                value = tensor_to_pil(value)
            value = _apply(t, value, rng)
        return _as_output(value)

    def __repr__(self) -> str:
        return f"Compose({self.transforms!r})"


def _apply(t: Callable[..., Any], value: object, rng: random.Random) -> object:
    if isinstance(t, Transform):
        return t(value, rng)  # type: ignore[arg-type]
    _seed_globals(rng)
    return t(value)


def imagenet_train(size: int = 224, *, fast_decode: bool = False) -> Compose:
    """The standard ImageNet training recipe: RandomResizedCrop(size) and a horizontal flip."""
    return Compose([RandomResizedCrop(size, fast_decode=fast_decode), RandomHorizontalFlip()])


def imagenet_eval(size: int = 224, *, resize: int = 256, fast_decode: bool = False) -> ResizeCenterCrop:
    """The standard ImageNet evaluation recipe: shorter side to ``resize``, centre crop ``size``."""
    return ResizeCenterCrop(resize=resize, crop=size, fast_decode=fast_decode)


def run_image_transform(transform: Callable[..., Any] | None, data: bytes, *, rng: random.Random) -> object:
    """Turn one encoded image into the sample's value: the one entry the dataset calls.

    None: the whole image as uint8 CHW. A shardify transform (anything with
    ``apply_encoded``): its fast path. Any other callable: ``transform(decoded_rgb_pil)`` with
    Python's, numpy's and torch's global RNGs seeded from ``rng``; a PIL result becomes a tensor.
    """
    if transform is None:
        raw = raw_pixels(data)
        return raw_to_tensor(raw) if raw is not None else pil_to_tensor(decode_image(data))
    fast = getattr(transform, "apply_encoded", None)
    if fast is not None:
        return fast(data, rng)
    img = decode_image(data)

    def augment() -> object:
        _seed_globals(rng)
        return _as_output(transform(img))

    return augmenting(augment)

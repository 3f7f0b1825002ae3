"""Colour jitter on the worker side: torchvision's ColorJitter (no hue), on PIL images and tensors alike."""

from __future__ import annotations

import math
import random

import numpy as np
import torch
from PIL import Image, ImageEnhance

from .transform_base import Transform

__all__ = ["ColorJitter"]


def _blend(degenerate: torch.Tensor | float, x: torch.Tensor, factor: float) -> torch.Tensor:
    """Pillow's ``Image.blend(degenerate, x, factor)``: float32 maths, clipped, truncated."""
    d = degenerate if isinstance(degenerate, float) else degenerate.float()
    out: torch.Tensor = ((x.float() - d) * np.float32(factor) + d).clamp_(0, 255).to(torch.uint8)
    return out


def _luma(x: torch.Tensor) -> torch.Tensor:
    """Pillow's RGB -> L conversion (ITU-R 601-2, rounded), as int32 [H, W]."""
    r, g, b = x.to(torch.int32).unbind(0)
    return (r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16


class ColorJitter(Transform):
    """torchvision's ColorJitter for brightness, contrast and saturation (no hue).

    Each factor is uniform in [max(0, 1 - x), 1 + x]; the three run in a random order, with
    Pillow's ImageEnhance as torchvision does on PIL images (the tensor path reproduces
    ImageEnhance's arithmetic). A zero option is skipped and draws nothing.
    """

    _OPS = ("brightness", "contrast", "saturation")

    def __init__(self, *, brightness: float = 0.0, contrast: float = 0.0, saturation: float = 0.0) -> None:
        for name, value in zip(self._OPS, (brightness, contrast, saturation)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}={value!r} should be a finite number >= 0")
        self.brightness, self.contrast, self.saturation = float(brightness), float(contrast), float(saturation)

    def get_params(self, rng: random.Random) -> list[tuple[str, float]]:
        """The (operation, factor) pairs in the order they are applied."""
        amounts = (self.brightness, self.contrast, self.saturation)
        order = [i for i in range(3) if amounts[i]]
        rng.shuffle(order)
        return [(self._OPS[i], rng.uniform(max(0.0, 1.0 - amounts[i]), 1.0 + amounts[i])) for i in order]

    def __call__(self, img: Image.Image, rng: random.Random) -> Image.Image:
        enhancers = {"brightness": ImageEnhance.Brightness, "contrast": ImageEnhance.Contrast,
                     "saturation": ImageEnhance.Color}  # fmt: skip
        for op, factor in self.get_params(rng):
            img = enhancers[op](img).enhance(factor)
        return img

    def apply_tensor(self, x: torch.Tensor, rng: random.Random) -> torch.Tensor:
        for op, factor in self.get_params(rng):
            if op == "brightness":
                x = _blend(0.0, x, factor)
            elif op == "contrast":
                x = _blend(float(int(_luma(x).double().mean().item() + 0.5)), x, factor)
            else:
                x = _blend(_luma(x)[None], x, factor)
        return x

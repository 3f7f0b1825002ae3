"""Synthetic, natural-looking images for the demo, the tests and the benchmarks.

Real photos are not downloadable here, and flat colours compress to nothing, which would
make every speed figure a lie. These images are smooth random fields with edges, shapes
and sensor-like noise, so JPEG sizes (~100-150 KB at 500x375, quality 90) and decode
costs are close to ImageNet's. Seeded: the same arguments give the same files.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

__all__ = ["natural_image", "jpeg_bytes", "make_imagefolder", "IMAGENET_SIZES"]

IMAGENET_SIZES = ((500, 375), (500, 333), (375, 500), (500, 400), (640, 480), (400, 300))
"""Typical (width, height) of ImageNet training images."""


def natural_image(width: int, height: int, *, seed: int) -> Image.Image:
    """An RGB image with low-frequency colour fields, shapes, edges and pixel noise."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, size=(max(2, height // 48), max(2, width // 48), 3), dtype=np.uint8)
    img = Image.fromarray(small, "RGB").resize((width, height), Image.Resampling.BICUBIC)
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(4, 12))):
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
        x1, y1 = x0 + int(rng.integers(10, width // 2 + 11)), y0 + int(rng.integers(10, height // 2 + 11))
        colour = tuple(int(c) for c in rng.integers(0, 256, size=3))
        if rng.random() < 0.5:
            draw.ellipse((x0, y0, x1, y1), fill=colour)
        else:
            draw.rectangle((x0, y0, x1, y1), fill=colour)
    img = img.filter(ImageFilter.GaussianBlur(radius=float(rng.uniform(0.5, 2.0))))
    arr = np.asarray(img, dtype=np.int16)
    arr = arr + rng.normal(0, 13, size=arr.shape).astype(np.int16)
    texture = rng.integers(-30, 31, size=(height // 4 + 1, width // 4 + 1, 1), dtype=np.int16)
    arr = arr + np.kron(texture, np.ones((4, 4, 1), dtype=np.int16))[:height, :width]
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8), "RGB")


def jpeg_bytes(img: Image.Image, *, quality: int = 90) -> bytes:
    """Encode ``img`` as a baseline JPEG."""
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def make_imagefolder(
    root: str | os.PathLike[str],
    *,
    classes: int = 4,
    per_class: int = 8,
    seed: int = 0,
    sizes: tuple[tuple[int, int], ...] = IMAGENET_SIZES,
    quality: int = 90,
    extension: str = ".JPEG",
) -> Path:
    """Write ``root/<class>/<class>_<i><extension>`` JPEGs like an ImageNet train folder."""
    root = Path(root)
    for c in range(classes):
        name = f"n{c:08d}"
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            s = seed * 1_000_003 + c * 10_007 + i
            w, h = sizes[s % len(sizes)]
            path = root / name / f"{name}_{i}{extension}"
            path.write_bytes(jpeg_bytes(natural_image(w, h, seed=s), quality=quality))
    return root

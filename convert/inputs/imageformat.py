"""One image field for every sample: re-encode images whose format differs from the chosen one.

ImageFolder trees mix formats (ImageNet has PNG and CMYK files named ``.JPEG``); shardify
stores each image under its real format's extension, so a split can hold ``jpg`` and
``png`` samples side by side. Readers that expect one field per column then miss some:
Hugging Face ``datasets`` infers its columns from the first samples and drops the others'
images, and webdataset's ``to_tuple("jpg", "cls")`` raises (``"jpg;png"`` accepts both).
``image_format="jpg"`` re-encodes every non-JPEG image as JPEG (lossy, at ``quality``; alpha
dropped, 16-bit reduced to 8-bit; JPEGs are kept byte for byte); ``"png"`` re-encodes every
non-PNG image as PNG (lossless for the decoded pixels, but a JPEG grows several times).
``"keep"`` (the default) stores every image as it is. Pixels are kept as stored (EXIF
orientation is not applied), as in :func:`shardify.convert.inputs.sniff.transcode_jpeg`.
"""

from __future__ import annotations

import io
from typing import Literal

from PIL import Image

from shardify.convert.inputs.sniff import ImageInfo

__all__ = ["ImageFormat", "IMAGE_FORMATS", "reencode"]

ImageFormat = Literal["keep", "jpg", "png"]
IMAGE_FORMATS: tuple[str, ...] = ("keep", "jpg", "png")

_PNG_MODES = frozenset({"1", "L", "LA", "I", "I;16", "P", "RGB", "RGBA"})


def reencode(data: bytes, info: ImageInfo, *, image_format: ImageFormat, quality: int) -> tuple[bytes, str] | None:
    """``(bytes, extension)`` of ``data`` in ``image_format``, or None when it already is
    (or the format is ``keep``). Raises what Pillow raises for undecodable data."""
    if image_format == "keep" or info.ext == image_format:
        return None
    out = io.BytesIO()
    with Image.open(io.BytesIO(data)) as img:
        img.load()
        if image_format == "jpg":
            rgb = img.convert("RGBA").convert("RGB") if img.mode == "P" else img
            if rgb.mode not in ("L", "RGB"):
                rgb = _to_8bit(rgb).convert("RGB")
            rgb.save(out, format="JPEG", quality=quality, optimize=False)
        else:
            keep = img if img.mode in _PNG_MODES else img.convert("RGBA" if "A" in img.mode else "RGB")
            keep.save(out, format="PNG", compress_level=6)
    return out.getvalue(), image_format


def _to_8bit(img: Image.Image) -> Image.Image:
    """16-bit and float grayscale scaled to 8 bits (what ``convert("RGB")`` would clip)."""
    if img.mode in ("I;16", "I;16L", "I;16B", "I;16N", "I", "F"):
        import numpy as np

        a = np.asarray(img, dtype=np.float64)
        top = 65535.0 if img.mode.startswith("I;16") or a.max() > 255 else 255.0
        return Image.fromarray(np.clip(a * (255.0 / top), 0, 255).astype(np.uint8), "L")
    return img

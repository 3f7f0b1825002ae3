"""``--raw-pixels S``: store each image pre-decoded, resized so its chosen side is at most S.

Decoding happens once, here, instead of every epoch in the reader (FFCV's RAW mode). The
image is decoded whole (first frame), converted to RGB by the reader's rules, resized (never
enlarged) to :func:`shardify.pixels.stored_size` with Pillow's bilinear filter (antialiased,
as torchvision's ``Resize`` on PIL images; no DCT-domain shortcut, so the pixels are exact)
and stored as a binary PPM (:func:`shardify.pixels.encode_ppm`). Pure: the same bytes and
options give the same output bytes.

Planning cannot read every image's size, so it sizes a raw image by :func:`planned_raw_bytes`:
``min(S x S x 4, 8 x the file's bytes)`` for ``shorter`` (a 4:3 image at S on its shorter
side; ``S x S x 2.25`` for ``longer``), so shard sizes follow ``--shard-size`` roughly.
"""

from __future__ import annotations

import io

from PIL import Image

from shardify.pixels import RawSide, encode_ppm, stored_size, to_rgb

__all__ = ["encode_raw", "planned_raw_bytes"]

_HEADER_BYTES = 16
"""About what the PPM header takes (``P6\\n341 256\\n255\\n`` is 15 bytes)."""


def encode_raw(data: bytes, *, size: int, side: RawSide) -> bytes:
    """The stored bytes (a binary RGB PPM) of the encoded image ``data``; raises what Pillow
    raises for data it cannot decode."""
    with Image.open(io.BytesIO(data)) as img:
        img.load()
        rgb = to_rgb(img)
        target = stored_size(rgb.width, rgb.height, size=size, side=side)
        if target != rgb.size:
            rgb = rgb.resize(target, Image.Resampling.BILINEAR)
        return encode_ppm(rgb)


def planned_raw_bytes(file_bytes: int, *, size: int, side: RawSide) -> int:
    """The stored size that planning assumes for an image file of ``file_bytes`` (see the module)."""
    area = size * size * 4 if side == "shorter" else size * size * 9 // 4
    return _HEADER_BYTES + min(area, 8 * file_bytes)

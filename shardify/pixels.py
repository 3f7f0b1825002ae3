"""Pre-decoded images ("raw pixels"): the stored form, defined once for writer and reader.

``shardify convert imagefolder --raw-pixels S`` stores each image decoded to 8-bit RGB and
resized (never enlarged) so that its shorter side (``--raw-side longer``: its longer side) is
at most ``S``, as FFCV's RAW mode does, so a training reader crops and resizes without
decoding a JPEG. The member is a binary PPM (``{key}.ppm``, netpbm ``P6``, maxval 255): the
header ``b"P6\\n{width} {height}\\n255\\n"`` then ``height x width x 3`` bytes, rows top to
bottom, RGB interleaved. Pillow, webdataset's decoders and Hugging Face ``datasets`` read it
as an ordinary image; shardify's reader views the bytes as an ``H x W x 3`` array with no
decoding at all (:func:`rgb_view`). The split index records it (:class:`RawPixels`).

The colour rules are the reader's (:func:`to_rgb`, also used by
:mod:`shardify.reader.sample.decode`): alpha dropped, 16-bit scaled to 8-bit, float taken as
0..1, EXIF orientation not applied, first frame only. The size rule (:func:`stored_size`)
is torchvision's ``Resize(S)``: the chosen side becomes ``S``, the other ``int(S * other / side)``;
the filter is Pillow's bilinear (antialiased), as torchvision's ``Resize`` on PIL images, so a
raw split at ``S = 256`` read with ``imagenet_eval(resize=256)`` gives torchvision's
``Resize(256) + CenterCrop(224)`` of the original pixels exactly. No torch here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from shardify.errors import ManifestError
from shardify.jsonfiles import json_field

if TYPE_CHECKING:  # imported where used, so that the manifest (which reads the constants) stays light
    import numpy as np
    from PIL import Image

__all__ = [
    "RawPixels",
    "RAW_EXT",
    "RAW_FORMAT",
    "RAW_FORMAT_VERSION",
    "RAW_SIDES",
    "RawSide",
    "stored_size",
    "to_rgb",
    "encode_ppm",
    "ppm_layout",
    "rgb_view",
]

RAW_EXT = "ppm"
"""The member extension of a pre-decoded image (a binary PPM)."""

RAW_FORMAT = "ppm-rgb8"
"""Name of the stored form in the split index: binary PPM (P6), 8-bit RGB, canonical header."""

RAW_FORMAT_VERSION = 1
"""Version of the stored form and of its split-index record; readers refuse newer ones."""

RawSide = Literal["shorter", "longer"]
RAW_SIDES: tuple[str, ...] = ("shorter", "longer")
"""Which side ``S`` bounds: ``shorter`` (torchvision's ``Resize(S)``; the default) or ``longer``."""

_SIXTEEN_BIT_MODES = frozenset({"I;16", "I;16L", "I;16B", "I;16N", "I"})
_HEADER = re.compile(rb"P6[ \t\r\n]+(\d{1,9})[ \t\r\n]+(\d{1,9})[ \t\r\n]+255[ \t\r\n]")
"""A P6 header without comments, maxval 255 (the one whitespace byte after it ends it)."""


def stored_size(width: int, height: int, *, size: int, side: RawSide = "shorter") -> tuple[int, int]:
    """The (width, height) an image of ``width`` x ``height`` is stored at: unchanged when its
    ``side`` side is at most ``size``, else that side becomes ``size`` and the other is scaled
    and truncated (at least 1), as torchvision's ``Resize``."""
    if side not in RAW_SIDES:
        raise ValueError(f"side={side!r} should be one of {RAW_SIDES}")
    if size < 1:
        raise ValueError(f"size={size} should be >= 1")
    bound = min(width, height) if side == "shorter" else max(width, height)
    if bound <= size:
        return width, height
    if width == bound:
        return size, max(1, int(size * height / width))
    return max(1, int(size * width / height)), size


def to_rgb(img: Image.Image) -> Image.Image:
    """Convert a loaded image of any Pillow mode to 8-bit RGB (see the module's colour rules)."""
    mode = img.mode
    if mode == "RGB":
        return img
    if mode in _SIXTEEN_BIT_MODES or mode == "F":
        import numpy as np
        from PIL import Image

        arr = np.asarray(img)
        if mode == "F":
            arr8 = (np.clip(arr, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
        else:
            arr8 = ((np.clip(arr.astype(np.int64), 0, 65535) + 128) // 257).astype(np.uint8)
        return Image.fromarray(arr8, "L").convert("RGB")
    if mode == "P" and "transparency" in img.info:
        # Through RGBA: Pillow warns on P -> RGB when the transparency is given as bytes.
        return img.convert("RGBA").convert("RGB")
    return img.convert("RGB")


def encode_ppm(rgb: Image.Image) -> bytes:
    """The stored bytes of an RGB image: canonical P6 header, then the pixels."""
    if rgb.mode != "RGB":
        raise ValueError(f"a raw image should be RGB, found mode {rgb.mode!r}")
    return b"P6\n%d %d\n255\n" % rgb.size + rgb.tobytes()


def ppm_layout(data: bytes | bytearray | memoryview) -> tuple[int, int, int] | None:
    """``(width, height, offset of the pixels)`` of a whole binary 8-bit PPM without header
    comments; None for anything else (other images, comments, a short file: decode those
    with Pillow, which reads them or says why not)."""
    m = _HEADER.match(bytes(data[:40]))
    if m is None:
        return None
    width, height = int(m.group(1)), int(m.group(2))
    if width < 1 or height < 1 or len(data) < m.end() + 3 * width * height:
        return None
    return width, height, m.end()


def rgb_view(data: bytes | bytearray | memoryview) -> np.ndarray | None:
    """The pixels of a PPM :func:`ppm_layout` accepts as an ``H x W x 3`` uint8 array viewing
    ``data`` (no copy; read-only when ``data`` is), else None."""
    layout = ppm_layout(data)
    if layout is None:
        return None
    import numpy as np

    width, height, offset = layout
    return np.frombuffer(data, dtype=np.uint8, count=3 * width * height, offset=offset).reshape(height, width, 3)


@dataclass(frozen=True)
class RawPixels:
    """The split-index record of a split whose images are stored pre-decoded (``--raw-pixels``).

    ``field`` holds each image as :data:`shardify.pixels.RAW_FORMAT` (a binary 8-bit RGB PPM),
    resized so that its ``side`` side is at most ``size`` pixels (never enlarged); crops are
    drawn on that stored size. ``version`` is the stored form's (:data:`RAW_FORMAT_VERSION`):
    a reader refuses a newer one. Serialized as ``raw_pixels`` in the ``shardify`` section."""

    size: int
    side: str = "shorter"
    field: str = RAW_EXT
    format: str = RAW_FORMAT
    version: int = RAW_FORMAT_VERSION

    def to_json(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "version": self.version,
            "field": self.field,
            "size": self.size,
            "side": self.side,
        }

    @classmethod
    def from_json(cls, obj: Any, *, source: str) -> RawPixels:
        where = f"{source} (raw_pixels)"
        if not isinstance(obj, dict):
            raise ManifestError(f"{where}: should be an object, found {obj!r}")
        version = json_field(obj, "version", int, where)
        if not 1 <= version <= RAW_FORMAT_VERSION:
            raise ManifestError(f"{where}: field 'version' is {version}, this shardify reads 1..{RAW_FORMAT_VERSION}")
        fmt = json_field(obj, "format", str, where)
        if fmt != RAW_FORMAT:
            raise ManifestError(f"{where}: field 'format' should be {RAW_FORMAT!r}, found {fmt!r}")
        size = json_field(obj, "size", int, where)
        side = json_field(obj, "side", str, where)
        if size < 1 or side not in RAW_SIDES:
            raise ManifestError(f"{where}: size={size!r} should be >= 1 and side={side!r} one of {RAW_SIDES}")
        return cls(size=size, side=side, field=json_field(obj, "field", str, where), format=fmt, version=version)

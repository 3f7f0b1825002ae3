"""Image checks at write time: what the bytes really are, and whether they are whole.

``header`` (the default) opens the image with Pillow (format, size, mode; Pillow's
decompression-bomb limit applies) and checks that the file is structurally complete
(a JPEG's end-of-image marker after its first scan, a PNG's IEND chunk, the declared
size of a BMP or WebP), which catches truncated files without decoding pixels.
``full`` decodes every pixel as well.
"""

from __future__ import annotations

import io
import re
import warnings
from dataclasses import dataclass

from PIL import Image

__all__ = ["IMAGE_FIELDS", "ImageInfo", "ImageCheckError", "sniff_ext", "check_image", "transcode_jpeg", "FORMAT_EXT",
           "describe_error"]

FORMAT_EXT = {
    "JPEG": "jpg", "MPO": "jpg", "PNG": "png", "WEBP": "webp", "BMP": "bmp", "GIF": "gif",
    "TIFF": "tiff", "PPM": "ppm",
}
"""Pillow format name -> the extension a member of that content is stored under."""
IMAGE_FIELDS = frozenset({*FORMAT_EXT.values(), "pgm", "pbm"})
"""Every extension an image member can be stored under (what :func:`sniff_ext` can return)."""


_ADDRESS = re.compile(r"<([A-Za-z_][\w.]*) object at 0x[0-9a-fA-F]+>|\b0x[0-9a-fA-F]{6,}\b")


def describe_error(e: BaseException) -> str:
    """``Type: message`` of a decoder's error, as stable text: object reprs and memory
    addresses (which differ between runs) are dropped, so reports are byte-identical."""
    if isinstance(e, Image.UnidentifiedImageError):
        return "Pillow cannot identify the data (damaged, or another format)"
    text = _ADDRESS.sub(lambda m: f"<{m.group(1)}>" if m.group(1) else "<address>", str(e))
    return f"{type(e).__name__}: {text}"


class ImageCheckError(ValueError):
    """The bytes are not a usable image; the message is the reason a report shows."""


@dataclass(frozen=True, slots=True)
class ImageInfo:
    ext: str
    width: int
    height: int
    mode: str


def sniff_ext(data: bytes) -> str | None:
    """The extension for ``data``'s real format from its magic bytes, or None."""
    if data[:3] == b"\xff\xd8\xff":
        return "jpg"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if data[:2] == b"BM":
        return "bmp"
    if data[:4] in (b"II*\x00", b"MM\x00*"):
        return "tiff"
    if data[:1] == b"P" and data[1:2] in b"1234567":
        return {b"1": "pbm", b"4": "pbm", b"2": "pgm", b"5": "pgm"}.get(data[1:2], "ppm")
    return None


def _jpeg_complete(data: bytes) -> bool:
    """Walk the JPEG marker segments to the first scan; the EOI marker must follow it.

    Segments are skipped by their lengths, so an EXIF thumbnail's own end marker (inside
    APP1) does not count; bytes after the final EOI are allowed.
    """
    pos, n = 2, len(data)
    while pos + 4 <= n:
        if data[pos] != 0xFF:
            return False
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker == 0xD9:
            return False  # end of image before any scan
        if 0xD0 <= marker <= 0xD7 or marker == 0x01:
            pos += 2
            continue
        length = int.from_bytes(data[pos + 2 : pos + 4], "big")
        if length < 2:
            return False
        if marker == 0xDA:  # start of scan: entropy-coded data follows
            return data.rfind(b"\xff\xd9", pos + 2 + length) >= 0
        pos += 2 + length
    return False


def _complete(ext: str, data: bytes) -> bool:
    if ext == "jpg":
        return _jpeg_complete(data)
    if ext == "png":
        return data.rfind(b"IEND\xaeB`\x82") >= 0
    if ext == "gif":
        return data.rstrip(b"\x00").endswith(b";")
    if ext == "webp":
        return int.from_bytes(data[4:8], "little") + 8 <= len(data)
    if ext == "bmp":
        return int.from_bytes(data[2:6], "little") <= len(data)
    return True


def check_image(data: bytes, *, full: bool = False) -> ImageInfo:
    """Check that ``data`` is a whole image; raise ImageCheckError with the reason if not."""
    if not data:
        raise ImageCheckError("empty file")
    ext = sniff_ext(data)
    if ext is None:
        raise ImageCheckError("not an image (unknown format)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Pillow's warnings about damaged metadata go to stderr otherwise
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
            info = ImageInfo(FORMAT_EXT.get(img.format or "", ext), img.width, img.height, img.mode)
            if info.width <= 0 or info.height <= 0:
                raise ImageCheckError(f"bad dimensions {info.width}x{info.height}")
            if not _complete(info.ext, data):
                raise ImageCheckError(f"truncated {info.ext} (no end marker)")
            if full:
                img.load()
    except ImageCheckError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise ImageCheckError(f"decompression bomb: {e}") from e
    except Exception as e:  # Pillow raises many types for bad files: report them all
        raise ImageCheckError(f"cannot decode {ext}: {describe_error(e)}") from e
    return info


def transcode_jpeg(data: bytes, info: ImageInfo, *, max_side: int, quality: int) -> bytes | None:
    """Downscale to at most ``max_side`` pixels on the longer side and encode as JPEG.

    Returns None when the image is already small enough (its bytes are then kept as is).
    Pixels are kept as stored (EXIF orientation is not applied), like torchvision's loader.
    """
    longer = max(info.width, info.height)
    if longer <= max_side:
        return None
    scale = max_side / longer
    size = (max(1, round(info.width * scale)), max(1, round(info.height * scale)))
    with Image.open(io.BytesIO(data)) as img:
        if img.format == "JPEG":
            img.draft("RGB", size)
        img = img.convert("RGB")
        img = img.resize(size, Image.BICUBIC, reducing_gap=3.0)
        out = io.BytesIO()
        img.save(out, format="JPEG", quality=quality, optimize=False)
    return out.getvalue()

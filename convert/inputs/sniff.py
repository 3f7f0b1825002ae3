"""Image checks at write time: what the bytes really are, and whether they are whole.

``header`` (the default) opens the image with Pillow (format, size, mode; Pillow's
decompression-bomb limit applies) and checks that the file is structurally complete as the
decoders read it (a JPEG's end-of-image marker after its first scan, found by walking the
segments as Pillow does; a PNG's IEND chunk; a BMP's pixel array; a WebP's RIFF size),
which catches truncated files without decoding pixels. ``full`` decodes every pixel, and
that decides. :func:`check_head` refuses junk from a file's first bytes, before it is read
whole. The rule, case by case, is in docs/format.md ("Which images are kept").
"""

from __future__ import annotations

import io
import re
import warnings
from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError

__all__ = [
    "IMAGE_FIELDS",
    "ImageInfo",
    "ImageCheckError",
    "sniff_ext",
    "check_image",
    "transcode_jpeg",
    "FORMAT_EXT",
    "describe_error",
    "check_head",
    "SNIFF_BYTES",
    "JPEG_MAX_JUNK",
]

FORMAT_EXT = {
    "JPEG": "jpg",
    "MPO": "jpg",
    "PNG": "png",
    "WEBP": "webp",
    "BMP": "bmp",
    "GIF": "gif",
    "TIFF": "tiff",
    "PPM": "ppm",
}
"""Pillow format name -> the extension a member of that content is stored under."""
IMAGE_FIELDS = frozenset({*FORMAT_EXT.values(), "pgm", "pbm"})
"""Every extension an image member can be stored under (what :func:`sniff_ext` can return)."""


_ADDRESS = re.compile(r"<([A-Za-z_][\w.]*) object at 0x[0-9a-fA-F]+>|\b0x[0-9a-fA-F]{6,}\b")


def describe_error(e: BaseException) -> str:
    """``Type: message`` of a decoder's error, as stable text: object reprs and memory
    addresses (which differ between runs) are dropped, so reports are byte-identical."""
    if isinstance(e, UnidentifiedImageError):
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
    if data[:4] in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"):  # TIFF, BigTIFF
        return "tiff"
    if data[:1] == b"P" and data[1:2] in b"1234567":
        return {b"1": "pbm", b"4": "pbm", b"2": "pgm", b"5": "pgm"}.get(data[1:2], "ppm")
    return None


_JPEG_NO_LENGTH = frozenset({0xC8, *range(0xD0, 0xDA), *range(0xF0, 0xFE)})
"""Marker codes that Pillow's JPEG parser reads without a length (its handler is None)."""
JPEG_MAX_JUNK = 1 << 20
"""Bytes between JPEG segments skipped at most (libjpeg and Pillow skip such junk one byte at a
time; beyond this the file is refused, so a junk file with a JPEG signature costs little)."""


def _jpeg_scan_start(data: bytes) -> tuple[int | None, str]:
    """Walk the JPEG marker segments as Pillow's parser does, to the first start of scan.

    Returns ``(offset after the SOS header, "")`` or ``(None, why not)``. Like Pillow (and
    libjpeg), bytes that are not a marker where one should be are skipped, ``FF00`` and
    fill bytes too, and segments are skipped by their lengths (a length under 2 skips
    nothing), so an EXIF thumbnail's own markers (inside APP1) do not count.
    """
    pos, n, junk = 2, len(data), 0
    while pos < n:
        if data[pos] != 0xFF:
            nxt = data.find(b"\xff", pos)
            junk += (nxt if nxt >= 0 else n) - pos
            if junk > JPEG_MAX_JUNK:
                return None, f"more than {JPEG_MAX_JUNK >> 20} MiB of junk between segments"
            if nxt < 0:
                break
            pos = nxt
            continue
        if pos + 1 >= n:
            break
        code = data[pos + 1]
        if code == 0xFF:  # fill byte: the next FF starts the marker
            pos += 1
        elif code == 0x00:  # an escaped FF outside a scan: junk
            pos += 2
        elif code < 0xC0:
            return None, f"no marker at byte {pos}"
        elif code in _JPEG_NO_LENGTH:
            pos += 2
        else:
            if pos + 4 > n:
                break
            end = pos + 2 + max(int.from_bytes(data[pos + 2 : pos + 4], "big"), 2)
            if end > n:
                break
            if code == 0xDA:
                return end, ""
            pos = end
    return None, "no scan (cut short)"


def _bmp_complete(data: bytes) -> bool:
    """Whether the pixel array a BMP's header describes lies within the file.

    The file-size field (bytes 2..5) is not used for uncompressed BMPs: writers often get it
    wrong and decoders ignore it. Compressed ones (RLE, ...) have no size to compute, so
    there the field is trusted when it is set."""
    if len(data) < 26:
        return False
    offset = int.from_bytes(data[10:14], "little")
    header = int.from_bytes(data[14:18], "little")
    if header == 12:  # OS/2 BITMAPCOREHEADER
        width, height = int.from_bytes(data[18:20], "little"), int.from_bytes(data[20:22], "little")
        bpp, compression = int.from_bytes(data[24:26], "little"), 0
    elif len(data) >= 34:
        width = int.from_bytes(data[18:22], "little", signed=True)
        height = int.from_bytes(data[22:26], "little", signed=True)
        bpp, compression = int.from_bytes(data[28:30], "little"), int.from_bytes(data[30:34], "little")
    else:
        return False
    if compression in (0, 3, 6):  # BI_RGB, BI_BITFIELDS, BI_ALPHABITFIELDS
        stride = (abs(width) * bpp + 31) // 32 * 4
        return offset + stride * abs(height) <= len(data)
    declared = int.from_bytes(data[2:6], "little")
    return declared == 0 or declared <= len(data)


def _complete(ext: str, data: bytes, jpeg_scan: int | None = None) -> bool:
    if ext == "jpg":
        start = jpeg_scan if jpeg_scan is not None else _jpeg_scan_start(data)[0]
        return start is not None and data.rfind(b"\xff\xd9", start) >= 0
    if ext == "png":
        return data.rfind(b"IEND\xaeB`\x82") >= 0
    if ext == "gif":
        return data.rstrip(b"\x00").endswith(b";")
    if ext == "webp":
        return int.from_bytes(data[4:8], "little") + 8 <= len(data)
    if ext == "bmp":
        return _bmp_complete(data)
    return True


SNIFF_BYTES = 16 << 20
"""Bytes of a file read before deciding whether it may be an image (:func:`check_head`)."""


def check_head(head: bytes, *, whole: bool) -> None:
    """Refuse, from the first :data:`SNIFF_BYTES` of a file alone, what cannot be an image, so
    junk is not read whole nor handed to Pillow (whose JPEG parser crawls through junk a byte
    at a time). ``whole``: ``head`` is the whole file (then :func:`check_image` decides)."""
    if not head:
        raise ImageCheckError("empty file")
    ext = sniff_ext(head)
    if ext is None:
        raise ImageCheckError("not an image (unknown format)")
    if ext == "jpg" and not whole:
        start, why = _jpeg_scan_start(head)
        if start is None and not why.startswith("no scan"):
            raise ImageCheckError(f"not an image: a JPEG signature, then {why}")
        if start is None:
            raise ImageCheckError(f"not an image: a JPEG signature, but no scan in the first {SNIFF_BYTES >> 20} MiB")


_CUT_SHORT = {"bmp": "pixel data cut short", "webp": "shorter than its RIFF size"}


def check_image(data: bytes, *, full: bool = False) -> ImageInfo:
    """Check that ``data`` is a whole image; raise ImageCheckError with the reason if not.

    The rule (docs/format.md): Pillow must open it, and it must be structurally whole as the
    decoders see it; with ``full``, decoding every pixel decides instead, so an image whose
    pixels all decode is kept even when the structure check would call it cut short (a
    JPEG missing only its final end marker, say)."""
    if not data:
        raise ImageCheckError("empty file")
    ext = sniff_ext(data)
    if ext is None:
        raise ImageCheckError("not an image (unknown format)")
    scan = None
    if ext == "jpg":
        scan, why = _jpeg_scan_start(data)
        if why and not why.startswith("no scan"):  # junk Pillow would crawl through, or no marker
            raise ImageCheckError(f"cannot decode jpg: {why}")
    try:
        with warnings.catch_warnings():  # Pillow's other warnings reach the report (convert/inputs/capture.py)
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
            info = ImageInfo(FORMAT_EXT.get(img.format or "", ext), img.width, img.height, img.mode)
            if info.width <= 0 or info.height <= 0:
                raise ImageCheckError(f"bad dimensions {info.width}x{info.height}")
            whole = _complete(info.ext, data, scan)
            if full:
                try:
                    img.load()
                except Exception as e:
                    if whole:
                        raise
                    raise ImageCheckError(
                        f"truncated {info.ext} ({_CUT_SHORT.get(info.ext, 'no end marker')}): {describe_error(e)}"
                    ) from e
            elif not whole:
                raise ImageCheckError(f"truncated {info.ext} ({_CUT_SHORT.get(info.ext, 'no end marker')})")
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
        img = img.resize(size, Image.Resampling.BICUBIC, reducing_gap=3.0)
        out = io.BytesIO()
        img.save(out, format="JPEG", quality=quality, optimize=False)
    return out.getvalue()

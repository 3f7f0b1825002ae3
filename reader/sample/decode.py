"""Decode the fields of a sample by extension: images to RGB, labels, JSON, text, arrays.

Pickle (``pyd``, ``pickle``, ``pkl``) runs arbitrary code when loaded, so it is refused unless
the caller passes ``allow_pickle=True``; ``pt``/``pth`` go through ``torch.load(weights_only=True)``
(tensors and plain containers only; ``allow_pickle=True`` lifts that too). ``npy`` goes through
:func:`shardify.npy.decode_array` (header parsed once per distinct header; object arrays refused):
a new numpy array, or a torch tensor for the raw views of torch dtypes numpy lacks (bfloat16...).
Every failure is a ``ValueError`` (:class:`DecodeError`) naming the field and the cause; the
dataset adds the shard and the key.

It also holds the image primitives the transforms build on: open an image for its header
only, load it to RGB, copy it to a tensor, and the JPEG fast path's reduced-scale crop.

Image choices: alpha is dropped (the stored colours kept), as torchvision's ``pil_loader`` and
``decode_image(mode=RGB)`` do; 16-bit and 32-bit integer images are scaled from 0..65535 to
0..255 (Pillow's own conversion clips instead); float images are taken as 0..1; the EXIF
orientation is not applied (torchvision's decoders do not rotate either, so pixels and crops
match theirs); a multi-frame image gives its first frame.
"""

from __future__ import annotations

import io
import json
import pickle
from collections.abc import Callable, Collection

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from PIL.JpegImagePlugin import JpegImageFile

from shardify.errors import ObjectArrayError
from shardify.npy import array_to_tensor, decode_array, raw_view_name
from shardify.pixels import to_rgb  # the colour rules, shared with the converter's --raw-pixels

try:  # libjpeg-turbo without Pillow's overhead; a declared dependency, Pillow is the fallback
    import simplejpeg as _simplejpeg
except ImportError:  # pragma: no cover - depends on the install
    _simplejpeg = None

__all__ = [
    "IMAGE_EXTS",
    "PICKLE_EXTS",
    "DecodeError",
    "PickleRefusedError",
    "decode_image",
    "to_rgb",
    "open_image",
    "load_rgb",
    "pil_to_tensor",
    "tensor_to_pil",
    "decode_jpeg_crop",
    "draft_scale",
    "REDUCING_GAP",
    "decode_field",
    "decode_sample",
]

IMAGE_EXTS: frozenset[str] = frozenset({"jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff", "ppm", "pgm", "pbm"})
"""Extensions decoded as images (matched on the last dot-component, lower-cased)."""

PICKLE_EXTS: frozenset[str] = frozenset({"pyd", "pickle", "pkl"})
"""Extensions holding plain pickles: loaded only with ``allow_pickle=True``."""

REDUCING_GAP = 3.0
"""JPEG crops: average whole k x k blocks first while the rest of the shrink stays >= 3x."""

Box = tuple[float, float, float, float]
"""(left, top, right, bottom) in pixels."""


class DecodeError(ValueError):
    """A field's bytes could not be decoded; the message names the field and the cause."""


class PickleRefusedError(DecodeError):
    """A pickle field was met without ``allow_pickle=True``: loading it could run code."""


def over_pixel_limit(width: int, height: int) -> str | None:
    """Why a ``width`` x ``height`` image is refused before decoding, or None.

    The limit is ``PIL.Image.MAX_IMAGE_PIXELS`` (Pillow's default 89,478,485; None lifts it),
    the one the converter enforces (its ``--max-pixels`` sets it): Pillow itself only warns
    up to twice that and decodes, so a 150 kB PNG could take 432 MB of RGB pixels.
    """
    limit = Image.MAX_IMAGE_PIXELS
    if limit is None or width * height <= limit:
        return None
    return (
        f"decompression bomb: {width}x{height} = {width * height} pixels, over the limit of {limit} "
        "(PIL.Image.MAX_IMAGE_PIXELS)"
    )


def open_image(data: bytes) -> Image.Image:
    """Open encoded bytes lazily: the header (size, format) is read, the pixels are not.

    An image over the pixel limit (:func:`over_pixel_limit`) raises DecodeError here,
    before any pixel is decoded."""
    try:
        img = Image.open(io.BytesIO(data))  # over the limit, Pillow warns (once): refused below
    except Exception as e:  # noqa: BLE001 - Pillow plugins raise OSError, SyntaxError, struct.error...
        raise DecodeError(f"cannot decode image ({len(data)} bytes): {e}") from e
    too_big = over_pixel_limit(img.width, img.height)
    if too_big is not None:
        img.close()
        raise DecodeError(f"cannot decode image ({len(data)} bytes): {too_big}")
    return img


def load_rgb(img: Image.Image) -> Image.Image:
    """Decode an opened image's pixels (first frame) and convert them to RGB."""
    try:
        img.load()
        return to_rgb(img)
    except Exception as e:  # noqa: BLE001 - as above
        raise DecodeError(f"cannot decode image ({img.format} {img.width}x{img.height}): {e}") from e


def decode_image(data: bytes) -> Image.Image:
    """Decode encoded image bytes (any format Pillow reads) to an RGB image; first frame only."""
    return load_rgb(open_image(data))


def pil_to_tensor(img: Image.Image) -> torch.Tensor:
    """Copy a PIL image into a new ``uint8 [3, H, W]`` tensor (Pillow splits the planes in C)."""
    img = to_rgb(img)
    w, h = img.size
    out = torch.empty((3, h, w), dtype=torch.uint8)
    planes = out.numpy()
    for c, band in enumerate("RGB"):
        planes[c] = np.frombuffer(img.tobytes("raw", band), dtype=np.uint8).reshape(h, w)
    return out


def tensor_to_pil(x: torch.Tensor) -> Image.Image:
    """The RGB image of a ``uint8 [3, H, W]`` tensor (one copy)."""
    hwc = x.permute(1, 2, 0).contiguous().numpy()
    return Image.frombuffer("RGB", (hwc.shape[1], hwc.shape[0]), hwc, "raw", "RGB", 0, 1)


def draft_scale(box: Box, size: tuple[int, int]) -> int:
    """The largest DCT scale s in {8, 4, 2, 1} that keeps the crop >= ``size`` (w, h) at 1/s."""
    bw, bh = box[2] - box[0], box[3] - box[1]
    for s in (8, 4, 2):
        if bw / s >= size[0] and bh / s >= size[1]:
            return s
    return 1


def _whole_pixels(box: Box, width: int, height: int) -> tuple[int, int, int, int]:
    """``box`` rounded to whole pixels inside the image, at least 1 x 1."""
    left, top = min(max(round(box[0]), 0), width - 1), min(max(round(box[1]), 0), height - 1)
    return left, top, max(min(round(box[2]), width), left + 1), max(min(round(box[3]), height), top + 1)


def turbo_jpeg_size(data: bytes) -> tuple[int, int] | None:
    """``(width, height)`` of a JPEG that :func:`turbo_crop` can decode (YCbCr, RGB or gray),
    read from its header by libjpeg-turbo (~2 us, a tenth of opening it with Pillow); else None."""
    if _simplejpeg is None:
        return None
    try:
        height, width, colorspace, _ = _simplejpeg.decode_jpeg_header(data)
    except (ValueError, RuntimeError, TypeError):
        return None
    if over_pixel_limit(width, height) is not None:
        return None  # Pillow's path refuses it, with the reason
    return (width, height) if colorspace in ("YCbCr", "RGB", "Gray") else None


def turbo_crop(
    data: bytes, width: int, height: int, box: Box, size: tuple[int, int], *, fast: bool = False
) -> torch.Tensor | None:
    """The fast path through libjpeg-turbo (simplejpeg), for whole-pixel crops of YCbCr/gray JPEGs.

    About 20% faster to decode than Pillow's JPEG plugin (same libjpeg-turbo IDCT and
    upsampling, so the same pixels); returns None (use Pillow) when simplejpeg is missing,
    the JPEG is CMYK or otherwise unusual, or the crop has fractional edges. ``fast``:
    libjpeg-turbo's fast integer IDCT and fast chroma upsampling (what FFCV and DALI use):
    faster, pixels a little off the exact path's.
    """
    if _simplejpeg is None:
        return None
    scale = draft_scale(box, size)
    try:
        hwc = _simplejpeg.decode_jpeg(
            data,
            colorspace="RGB",
            fastdct=fast,
            fastupsample=fast,
            min_width=-(-width // scale),
            min_height=-(-height // scale),
        )
    except (ValueError, RuntimeError, TypeError):
        return None
    fx, fy = hwc.shape[1] / width, hwc.shape[0] / height
    scaled = (box[0] * fx, box[1] * fy, box[2] * fx, box[3] * fy)
    left, top, right, bottom = _whole_pixels(scaled, hwc.shape[1], hwc.shape[0])
    if max(abs(a - b) for a, b in zip(scaled, (left, top, right, bottom))) > 1e-6:
        return None
    x = torch.from_numpy(hwc[top:bottom, left:right]).permute(2, 0, 1)  # a view: no copy yet
    if (right - left, bottom - top) != size:
        x = F.interpolate(x[None], size=(size[1], size[0]), mode="bilinear", antialias=True, align_corners=False)[0]
    return x.contiguous()


def decode_jpeg_crop(img: JpegImageFile, box: Box, size: tuple[int, int], *, data: bytes | None = None) -> torch.Tensor:
    """Decode only what a crop needs: ``box`` (original pixels) resized to ``size`` (w, h), CHW.

    With the encoded ``data``, whole-pixel crops of ordinary JPEGs go through libjpeg-turbo
    directly (:func:`turbo_crop`); everything else through Pillow as follows.

    Pillow's ``draft`` decodes at 1/s in the DCT domain (s from :func:`draft_scale`); the image
    becomes (ceil(W/s), ceil(H/s)) and the box is mapped by the scale ``draft`` reports. A
    whole-pixel box is cropped, copied and resized by torch's antialiased bilinear (Pillow's
    within 1); a fractional one by Pillow's box resize, which keeps its exact geometry.
    """
    width, height = img.size
    if data is not None and img.mode in ("RGB", "L"):
        fast = turbo_crop(data, width, height, box, size)
        if fast is not None:
            return fast
    scale = draft_scale(box, size)
    drafted = img.draft("RGB", (width // scale, height // scale)) if scale > 1 else None
    if drafted is not None:
        fx, fy = drafted[1][2] / width, drafted[1][3] / height
        box = (box[0] * fx, box[1] * fy, box[2] * fx, box[3] * fy)
    rgb = load_rgb(img)
    ibox = _whole_pixels(box, *rgb.size)
    if max(abs(a - b) for a, b in zip(box, ibox)) > 1e-6:
        return pil_to_tensor(rgb.resize(size, Image.Resampling.BILINEAR, box=box, reducing_gap=REDUCING_GAP))
    k = int(min((ibox[2] - ibox[0]) / size[0], (ibox[3] - ibox[1]) / size[1]) / REDUCING_GAP)
    if k >= 2:
        rgb = rgb.reduce(k, box=ibox)
    elif ibox != (0, 0, *rgb.size):
        rgb = rgb.crop(ibox)
    x = pil_to_tensor(rgb)
    if rgb.size == size:
        return x
    return F.interpolate(x[None], size=(size[1], size[0]), mode="bilinear", antialias=True, align_corners=False)[0]


def _decode_cls(data: bytes) -> int:
    return int(data.decode("ascii").strip())


def _decode_json(data: bytes) -> object:
    return json.loads(data)


def _decode_text(data: bytes) -> str:
    return data.decode("utf-8")


def _decode_npy(data: bytes | np.ndarray, allow_pickle: bool) -> np.ndarray | torch.Tensor:
    """A new native-order array (a tensor for torch dtypes numpy lacks), via the cached-header fast path.

    ``data`` may be an array already: a sample's view into a stacked chunk member
    (:mod:`shardify.chunk`), copied here as the bytes of a per-sample ``.npy`` would be."""
    if isinstance(data, np.ndarray):
        native = data.dtype if data.dtype.isnative else data.dtype.newbyteorder("=")
        arr = np.array(data, dtype=native, order="C", copy=True)
        return arr if arr.dtype.names is None or raw_view_name(arr.dtype) is None else array_to_tensor(arr)
    try:
        arr = decode_array(data, allow_pickle=allow_pickle)
    except ObjectArrayError as e:
        raise DecodeError(str(e)) from e
    return arr if arr.dtype.names is None or raw_view_name(arr.dtype) is None else array_to_tensor(arr)


def _decode_torch(data: bytes, allow_pickle: bool) -> object:
    try:
        return torch.load(io.BytesIO(data), weights_only=not allow_pickle, map_location="cpu")
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DecodeError(
            f"torch.load(weights_only=True) refused it: it holds more than tensors and plain "
            f"containers ({first}); pass allow_pickle=True only for shards you trust"
        ) from e


def _decode_pickle(data: bytes, allow_pickle: bool) -> object:
    if not allow_pickle:
        raise PickleRefusedError(
            "refusing to unpickle it: pickle can run arbitrary code; pass allow_pickle=True only for shards you trust"
        )
    return pickle.loads(data)


_SIMPLE: dict[str, Callable[[bytes], object]] = {
    "cls": _decode_cls,
    "json": _decode_json,
    "txt": _decode_text,
    "text": _decode_text,
}
_WITH_PICKLE_FLAG: dict[str, Callable[[bytes, bool], object]] = {
    "npy": _decode_npy,
    "pt": _decode_torch,
    "pth": _decode_torch,
    **{ext: _decode_pickle for ext in PICKLE_EXTS},
}


def decode_field(ext: str, data: bytes, *, allow_pickle: bool = False) -> object:
    """Decode one field by the last dot-component of ``ext`` (``"seg.png"`` is a PNG).

    Unknown extensions come back as the bytes unchanged. ``allow_pickle=True`` permits plain
    pickles, object arrays in ``npy`` and arbitrary objects in ``pt``/``pth``.
    """
    kind = ext.rpartition(".")[2].lower()
    try:
        if kind in IMAGE_EXTS:
            return decode_image(data)
        simple = _SIMPLE.get(kind)
        if simple is not None:
            return simple(data)
        flagged = _WITH_PICKLE_FLAG.get(kind)
        if flagged is not None:
            return flagged(data, allow_pickle)
    except PickleRefusedError as e:
        raise PickleRefusedError(f"field {ext!r}: {e}") from None
    except DecodeError as e:
        raise DecodeError(f"field {ext!r}: {e}") from e.__cause__
    except Exception as e:  # noqa: BLE001 - any decoder failure becomes one clear ValueError
        raise DecodeError(f"field {ext!r}: cannot decode {len(data)} bytes as {kind}: {e}") from e
    return data


def decode_sample(
    sample: dict[str, object],
    *,
    allow_pickle: bool = False,
    skip: Collection[str] = (),
) -> dict[str, object]:
    """Return a new dict with every field decoded, except ``__*__`` entries and ``skip`` fields.

    Those are kept as they are (``skip`` fields stay bytes, e.g. for a transform's fast path).
    """
    out: dict[str, object] = {}
    for name, value in sample.items():
        if isinstance(value, np.ndarray) and not name.startswith("__") and name not in skip:
            out[name] = decode_field(name, value, allow_pickle=allow_pickle)  # type: ignore[arg-type]  # a chunk's view
        elif name.startswith("__") or name in skip or not isinstance(value, (bytes, bytearray, memoryview)):
            out[name] = value
        else:
            out[name] = decode_field(name, bytes(value), allow_pickle=allow_pickle)
    return out

"""Encode a Python sample (a dict of field name -> value) into the members of a shard.

The field name is the member's extension and decides the encoding, so the reader
(:mod:`shardify.reader.sample.decode`) decodes every member back by extension:

- ``bytes`` (``bytearray``, ``memoryview``): stored as they are, in any field;
- ``str``: UTF-8, in any field (webdataset's rule: a ``str`` in a ``json`` field is taken to be
  JSON text already); the reader gives ``str`` back for ``txt``/``text`` fields;
- ``int`` in a ``cls`` field: ASCII decimal;
- ``dict``/``list``/``int``/``float``/``bool``/``None`` in a ``*.json`` field: compact JSON;
- a numpy array in a ``*.npy`` field: ``.npy`` (never pickled: object arrays are refused);
- a torch tensor in a ``*.pt``/``*.pth`` field: ``torch.save`` (readable with
  ``weights_only=True``; the same tensor gives the same bytes); in a ``*.npy`` field: ``.npy``;
- a PIL image, or a ``uint8`` array ``HxW``/``HxWx3``/``HxWx4``, in a ``jpg``/``jpeg``/``png``/
  ``webp`` field: encoded in that format (``quality`` for JPEG and WebP); in a ``ppm`` field:
  stored pre-decoded as 8-bit RGB pixels (:mod:`shardify.pixels`, alpha dropped), which the
  reader crops without decoding (resize the image first: it is stored at the size given).

Anything else raises :class:`~shardify.errors.EncodeError` (a ``TypeError``) naming the field.
"""

from __future__ import annotations

import io
import json
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardify import npy
from shardify.errors import ArrayFormatError, EncodeError, KeyRuleError
from shardify.keys import check_ext, key_from_name
from shardify.pixels import encode_ppm, to_rgb
from shardify.suggest import suggest_keywords

__all__ = ["ValueOptions", "encode_array", "encode_value", "encode_sample", "sample_key", "ORIGINAL_KEY_FIELD"]

ORIGINAL_KEY_FIELD = "key.txt"
"""Field that keeps a given ``__key__`` when it had to be rewritten to obey the key rules."""

_IMAGE_FORMATS = {"jpg": "JPEG", "jpeg": "JPEG", "png": "PNG", "webp": "WEBP", "ppm": "PPM"}
_JSON_TYPES = (dict, list, tuple, str, int, float, bool, type(None))


@suggest_keywords
@dataclass(frozen=True, kw_only=True)
class ValueOptions:
    """How values are encoded; every field here changes the bytes written."""

    quality: int = 95
    """JPEG and WebP quality (1..100) for images given as PIL images or arrays."""

    def __post_init__(self) -> None:
        if not 1 <= self.quality <= 100:
            raise ValueError(f"quality={self.quality} should be in 1..100")


def encode_array(array: np.ndarray) -> bytes:
    """The ``.npy`` bytes of ``array`` through :func:`shardify.npy.encode_array` (the one ``.npy``
    encoder: C order, deterministic for equal values); object arrays refused as :class:`EncodeError`."""
    return _as_npy(npy.encode_array, array)


def _as_npy(encode: Callable[[Any], bytes], value: Any) -> bytes:
    try:
        return encode(value)
    except ArrayFormatError as e:
        raise EncodeError(f"{e}; store such values as JSON or convert them to a numeric dtype") from e


def _encode_tensor_pt(tensor: Any) -> bytes:
    import torch

    t = tensor.detach()
    if t.layout != torch.strided:
        raise EncodeError(f"a {t.layout} tensor cannot be stored; convert it with .to_dense()")
    if t.device.type != "cpu":
        t = t.cpu()
    if t.storage_offset() != 0 or t.untyped_storage().nbytes() != t.numel() * t.element_size():
        t = t.clone()  # torch.save writes the whole storage: a view would carry its base along
    buf = io.BytesIO()
    torch.save(t, buf)
    return buf.getvalue()


def _is_tensor(value: object) -> bool:
    mod = type(value).__module__
    if not mod.startswith("torch"):
        return False
    import torch

    return isinstance(value, torch.Tensor)


def _encode_image(value: Any, kind: str, options: ValueOptions) -> bytes:
    from PIL import Image

    if isinstance(value, np.ndarray):
        if value.dtype != np.uint8 or not (value.ndim == 2 or (value.ndim == 3 and value.shape[2] in (3, 4))):
            raise EncodeError(
                f"an image array should be uint8 HxW, HxWx3 or HxWx4, found {value.dtype} {tuple(value.shape)}"
            )
        value = Image.fromarray(value)
    fmt = _IMAGE_FORMATS[kind]
    if fmt == "PPM":  # pre-decoded pixels, as --raw-pixels stores them: the reader crops without decoding
        return encode_ppm(to_rgb(value))
    params: dict[str, Any] = {"quality": options.quality} if fmt in ("JPEG", "WEBP") else {}
    if fmt == "WEBP":
        params["method"] = 4
    buf = io.BytesIO()
    try:
        value.save(buf, format=fmt, **params)
    except (OSError, ValueError, KeyError) as e:  # Pillow: "cannot write mode RGBA as JPEG"
        raise EncodeError(f"cannot encode a {value.mode} {value.width}x{value.height} image as {kind}: {e}") from e
    return buf.getvalue()


def _is_pil(value: object) -> bool:
    return type(value).__module__.startswith("PIL.") and hasattr(value, "save") and hasattr(value, "mode")


def encode_value(field: str, value: object, options: ValueOptions) -> bytes:
    """The bytes of ``value`` stored as field ``field`` (see the module's table)."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    kind = field.rpartition(".")[2]
    if kind == "json":
        if not isinstance(value, _JSON_TYPES):
            raise EncodeError(
                f"a {type(value).__name__} is not JSON; a '.json' field takes dict, list, str, int, float, bool or None"
            )
        try:
            return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        except (TypeError, ValueError) as e:
            raise EncodeError(f"cannot encode as JSON: {e}") from e
    if kind == "cls" and isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return str(int(value)).encode("ascii")
    if isinstance(value, np.ndarray):
        if kind == "npy":
            return encode_array(value)
        if kind in _IMAGE_FORMATS:
            return _encode_image(value, kind, options)
    elif _is_tensor(value):
        if kind in ("pt", "pth"):
            return _encode_tensor_pt(value)
        if kind == "npy":
            return _as_npy(npy.encode_tensor, value)
    elif _is_pil(value) and kind in _IMAGE_FORMATS:
        return _encode_image(value, kind, options)
    raise EncodeError(f"cannot store a {type(value).__module__}.{type(value).__qualname__} here: {_hint(type(value))}")


def _hint(kind: type) -> str:
    name = kind.__name__
    if issubclass(kind, np.ndarray):
        return "arrays go in '*.npy' fields (or uint8 images in jpg/png/webp/ppm fields)"
    if name == "Tensor":
        return "tensors go in '*.pt'/'*.pth' fields (torch.save) or '*.npy' fields"
    if issubclass(kind, numbers.Integral):
        return "an int goes in a 'cls' field (label) or a '*.json' field"
    if issubclass(kind, (numbers.Number, dict, list, tuple)) or kind is type(None):
        return "numbers, dicts and lists go in '*.json' fields"
    if kind.__module__.startswith("PIL."):
        return "images go in jpg, jpeg, png, webp or ppm fields"
    return (
        "supported values are bytes, str, int (cls), JSON values (*.json), numpy arrays (*.npy), "
        "torch tensors (*.pt) and PIL images (jpg/png/webp)"
    )


def sample_key(sample: Mapping[str, object], index: int) -> tuple[str, str | None]:
    """The key of ``sample``: its ``__key__`` made to obey the key rules, or one from ``index``.

    Returns ``(key, original)`` where ``original`` is the given ``__key__`` when it had to be
    rewritten, else None.
    """
    if not isinstance(sample, Mapping):
        raise EncodeError(f"a sample should be a dict of field -> value, found {type(sample).__name__}")
    given = sample.get("__key__")
    if given is None:
        return f"{index:09d}", None
    if not isinstance(given, str):
        raise EncodeError(f"__key__ should be a str, found {type(given).__name__} {given!r}")
    key, rewritten = key_from_name(given)
    return key, (given if rewritten else None)


def encode_sample(
    sample: Mapping[str, object], key: str, original: str | None, options: ValueOptions
) -> list[tuple[str, bytes]]:
    """The ``(ext, bytes)`` members of ``sample``, sorted by extension.

    ``__*__`` entries other than ``__key__`` (``__url__`` of a sample read elsewhere) are not
    stored, as webdataset's writer does. Raises EncodeError naming the field.
    """
    if not isinstance(sample, Mapping):
        raise EncodeError(f"a sample should be a dict of field -> value, found {type(sample).__name__}")
    members: list[tuple[str, bytes]] = []
    for field, value in sample.items():
        if not isinstance(field, str):
            raise EncodeError(f"field names should be str, found {field!r}")
        if field.startswith("__") and field.endswith("__"):
            continue
        try:
            check_ext(field)
        except KeyRuleError as e:
            raise EncodeError(f"field {field!r}: {e}") from e
        if field == ORIGINAL_KEY_FIELD and original is not None:
            raise EncodeError(f"field {field!r} is where a rewritten __key__ is kept; rename the field")
        try:
            members.append((field, encode_value(field, value, options)))
        except EncodeError as e:
            raise EncodeError(f"field {field!r}: {e}") from e
    if original is not None:
        members.append((ORIGINAL_KEY_FIELD, original.encode("utf-8")))
    if not members:
        raise EncodeError("the sample has no fields to store")
    members.sort(key=lambda m: m[0])
    return members
